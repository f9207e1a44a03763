"""The form of a DequantizeLinear read by a float32 island (NVIDIA/TensorRT#4832: TensorRT 10.16 on SM 8.7
fails to compile an int8 DequantizeLinear with float32 output)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from edge.precision.fp16 import Fp16Config, convert_to_fp16, float32_output_dqs

WIDTH = 8


def modelopt_like_graph() -> onnx.ModelProto:
    """x -> MatMul (Q/DQ on both inputs) -> Add(x, .) -> Q/DQ -> LayerNorm -> [head] Q/DQ -> Gemm -> y, opset 19.

    The LayerNorm reads the dequantized residual stream (the ``modelopt`` placement); the head Gemm
    reads a DQ too (the ``skip`` placement quantizes the head).
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (WIDTH, WIDTH)).astype(np.int8), "w_q"),
             numpy_helper.from_array(np.full(WIDTH, 0.01, np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(WIDTH, np.int8), "w_zero"),
             numpy_helper.from_array(rng.integers(-127, 128, (4, WIDTH)).astype(np.int8), "h_q"),
             numpy_helper.from_array(np.full(4, 0.02, np.float32), "h_scale"),
             numpy_helper.from_array(np.zeros(4, np.int8), "h_zero"),
             numpy_helper.from_array(np.float32(0.05), "a_scale"),
             numpy_helper.from_array(np.int8(0), "a_zero"),
             numpy_helper.from_array(np.ones(WIDTH, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(WIDTH, np.float32), "beta")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "a_scale", "a_zero"], ["x_q"], name="x_Q"),
        helper.make_node("DequantizeLinear", ["x_q", "a_scale", "a_zero"], ["x_dq"], name="x_DQ"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_DQ", axis=1),
        helper.make_node("MatMul", ["x_dq", "w"], ["branch"], name="fc"),
        helper.make_node("Add", ["x", "branch"], ["stream"], name="residual"),
        helper.make_node("QuantizeLinear", ["stream", "a_scale", "a_zero"], ["s_q"], name="stream_Q"),
        helper.make_node("DequantizeLinear", ["s_q", "a_scale", "a_zero"], ["s_dq"], name="stream_DQ"),
        helper.make_node("LayerNormalization", ["s_dq", "gamma", "beta"], ["n"], name="norm", axis=-1),
        helper.make_node("QuantizeLinear", ["n", "a_scale", "a_zero"], ["n_q"], name="n_Q"),
        helper.make_node("DequantizeLinear", ["n_q", "a_scale", "a_zero"], ["n_dq"], name="n_DQ"),
        helper.make_node("DequantizeLinear", ["h_q", "h_scale", "h_zero"], ["h"], name="h_DQ", axis=0),
        helper.make_node("Gemm", ["n_dq", "h"], ["y"], name="head", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, WIDTH])
    graph = helper.make_graph(nodes, "modelopt_like", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def types(model: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.output, *g.input)}


def test_dq_before_a_float32_layernorm_writes_float16_then_a_cast_by_default():
    converted, report = convert_to_fp16(modelopt_like_graph(), Fp16Config())
    t = types(converted)
    producers = {o: n for n in converted.graph.node for o in n.output}
    norm = next(n for n in converted.graph.node if n.op_type == "LayerNormalization")
    cast = producers[norm.input[0]]
    assert cast.op_type == "Cast" and producers[cast.input[0]].name == "stream_DQ"
    assert t["s_dq"] == TensorProto.FLOAT16 and t[norm.input[0]] == TensorProto.FLOAT
    assert t["s_q"] == TensorProto.INT8 and producers["s_q"].input[0] == "stream"  # Q reads the fp16 stream, no Cast
    # the head's DQs feed a float32 Gemm directly (TensorRT fuses them into it): the one float32 DQ pair left
    assert float32_output_dqs(converted) == report.dq_fp32_outputs == ["n_DQ", "h_DQ"]


def test_the_float32_dq_form_is_an_option_and_both_forms_agree():
    x = np.random.default_rng(1).standard_normal((2, WIDTH)).astype(np.float32) * 2
    default, _ = convert_to_fp16(modelopt_like_graph(), Fp16Config())
    older, report = convert_to_fp16(modelopt_like_graph(), Fp16Config(dq_output_fp16=False))
    assert "stream_DQ" in report.dq_fp32_outputs and types(older)["s_dq"] == TensorProto.FLOAT
    reference = run(modelopt_like_graph(), x)
    for model in (default, older):
        assert np.allclose(run(model, x), reference, atol=2e-2 * np.abs(reference).max())
