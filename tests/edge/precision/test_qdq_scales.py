"""Q/DQ scales in an int8 graph's float16 rest (issue 30 point 6, first half): a scale float16
cannot hold (below its smallest normal number, 6.1e-5, or 0 once rounded) stays float32 with its
Q/DQ nodes; every other pair follows its reader into float16."""

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.precision.fp16 import FP16_SMALLEST_NORMAL, convert_to_fp16

RNG = np.random.default_rng(0)


def qdq_matmul(weight_scales: np.ndarray, activation_scale: float = 0.02) -> onnx.ModelProto:
    """x -> Q/DQ (per tensor) -> MatMul <- DQ(int8 weight, per output channel) -> Relu -> y, opset 19."""
    channels = len(weight_scales)
    inits = [numpy_helper.from_array(np.array(activation_scale, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
             numpy_helper.from_array(RNG.integers(-127, 128, (8, channels)).astype(np.int8), "w_int8"),
             numpy_helper.from_array(weight_scales.astype(np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(channels, np.int8), "w_zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="x_q"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"], name="x_dq"),
             helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w"], name="w_dq", axis=1),
             helper.make_node("MatMul", ["xd", "w"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, channels])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)


def run_float16(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ReferenceEvaluator(model).run(None, {"x": x})[0].astype(np.float64)


def kinds(model: onnx.ModelProto) -> tuple[dict, dict]:
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return types, {n.name: n for n in model.graph.node}


def test_float16_scales_where_float16_holds_them():
    model = qdq_matmul(np.full(4, 0.01))
    converted, report = convert_to_fp16(model)
    types, nodes = kinds(converted)
    assert report.qdq_scales_fp32 == []
    assert types["x_scale"] == types["w_scale"] == types["h"] == TensorProto.FLOAT16
    assert nodes["fc"].input[1] == "w"  # the DQ feeds the MatMul directly: no Cast between


@pytest.mark.parametrize("tiny", [3e-5, 1e-7, 2e-8, 0.0])  # subnormal (3e-5, 1e-7), rounds to 0 (2e-8), 0
def test_a_weight_scale_below_float16s_smallest_normal_stays_float32(tiny):
    scales = np.array([0.01, tiny, 0.02, 0.005])
    model = qdq_matmul(scales)
    converted, report = convert_to_fp16(model)
    assert report.qdq_scales_fp32 == [{"scale": "w_scale", "min_abs": pytest.approx(tiny), "nodes": ["w_dq"]}]
    types, nodes = kinds(converted)
    assert types["w_scale"] == types["w"] == TensorProto.FLOAT  # the scale and its DQ's output: float32
    assert types["x_scale"] == types["xd"] == TensorProto.FLOAT16  # the activation pair is not affected
    cast = next(n for n in converted.graph.node if n.op_type == "Cast" and n.input[0] == "w")
    assert nodes["fc"].input[1] == cast.output[0] and types[cast.output[0]] == TensorProto.FLOAT16
    kept = numpy_helper.to_array(next(t for t in converted.graph.initializer if t.name == "w_scale"))
    np.testing.assert_array_equal(kept, scales.astype(np.float32))  # exactly the float32 scales
    if tiny:  # what float16 would have stored: 3 % off or more below 6.1e-5 ... 0 at 2e-8
        stored = float(np.float16(tiny))
        assert tiny < FP16_SMALLEST_NORMAL and (stored == 0 or abs(stored - tiny) / tiny > 1e-4)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    reference = run_float16(model, x)
    np.testing.assert_allclose(run_float16(converted, x), reference, rtol=1e-2, atol=1e-2 * np.abs(reference).max())


def test_an_activation_scale_below_the_smallest_normal_keeps_its_q_and_dq_float32():
    converted, report = convert_to_fp16(qdq_matmul(np.full(4, 0.01), activation_scale=1e-5))
    assert report.qdq_scales_fp32 == [{"scale": "x_scale", "min_abs": pytest.approx(1e-5), "nodes": ["x_q", "x_dq"]}]
    types, _ = kinds(converted)
    assert types["x_scale"] == types["xd"] == TensorProto.FLOAT and types["w_scale"] == TensorProto.FLOAT16


def test_the_cli_names_the_pairs_kept_float32():
    from edge.cli.quantize import scale_lines

    (line,) = scale_lines([{"scale": "w_scale", "min_abs": 2e-8, "nodes": ["w_dq"]}])
    assert line.startswith("note: Q/DQ scale w_scale (smallest 2e-08) is below float16's smallest normal 6.1e-5: "
                           "w_dq kept float32")
