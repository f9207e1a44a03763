"""The linear placements and SmoothQuant on a one-block transformer graph built here (no edge, no torch)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from calib.errors import CalibError
from calib.placement import PLACEMENTS, placement_plan, qdq_violations
from calib.qdq import Calibration, QdqConfig, quantize_int8
from calib.smoothquant import activation_channel_max, smooth, smooth_targets, smoothing_scales

TOKENS, WIDTH, HIDDEN = 5, 8, 16
#: channels of the residual stream that carry massive values, and their size (docs/outlier-model.md)
MASSIVE, SIZE = (2, 5), 400.0


def block_graph() -> onnx.ModelProto:
    """One pre-norm transformer block and a head, float32, opset 17, batch 4.

    x -> LN1 -> Reshape -> Gemm qkv (transB) -> q, k, v -> MatMul(q, k^T) -> Softmax -> MatMul(., v) -> proj
    -> Add(x, .) -> LN2 -> MatMul fc1 -> Relu -> MatMul fc2 -> Add -> LN3 -> Gemm head: the shapes edge clean
    writes for a timm ViT, one head, and LayerNorm affines with a wide channel spread.
    """
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32), name)

    spread = np.ones(WIDTH, np.float32)
    spread[[1, 6]] = 30.0  # post-LayerNorm channel variation (RepQ-ViT)
    inits = [weight("w_qkv", 3 * WIDTH, WIDTH), weight("w_proj", WIDTH, WIDTH), weight("w_fc1", WIDTH, HIDDEN),
             weight("w_fc2", HIDDEN, WIDTH), weight("w_head", 10, WIDTH),
             numpy_helper.from_array(np.array([-1, WIDTH], np.int64), "rows"),
             numpy_helper.from_array(np.array([4, TOKENS, WIDTH], np.int64), "tokens"),
             numpy_helper.from_array(np.array([TOKENS, 1, 3 * WIDTH], np.int64), "per_image")]
    for i in (1, 2, 3):
        inits += [numpy_helper.from_array(spread * rng.uniform(0.5, 1.5, WIDTH).astype(np.float32), f"g{i}"),
                  numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32) * spread / 4, f"b{i}")]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g1", "b1"], ["n1"], name="norm1", axis=-1),
        helper.make_node("Reshape", ["n1", "rows"], ["n1_rows"], name="to_rows"),
        helper.make_node("Gemm", ["n1_rows", "w_qkv"], ["qkv_rows"], name="qkv", transB=1),
        helper.make_node("Reshape", ["qkv_rows", "tokens3"], ["qkv"], name="from_rows"),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], name="split", axis=-1, num_outputs=3),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="bmm1"),
        helper.make_node("Softmax", ["scores"], ["attn"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["attn", "v"], ["ctx"], name="bmm2"),
        helper.make_node("MatMul", ["ctx", "w_proj_t"], ["proj"], name="proj"),
        helper.make_node("Add", ["x", "proj"], ["r1"], name="residual1"),
        helper.make_node("LayerNormalization", ["r1", "g2", "b2"], ["n2"], name="norm2", axis=-1),
        helper.make_node("MatMul", ["n2", "w_fc1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "w_fc2"], ["mlp"], name="fc2"),
        helper.make_node("Add", ["r1", "mlp"], ["r2"], name="residual2"),
        helper.make_node("LayerNormalization", ["r2", "g3", "b3"], ["n3"], name="norm3", axis=-1),
        helper.make_node("ReduceMean", ["n3", "token_axis"], ["pooled"], name="pool", keepdims=0),
        helper.make_node("Gemm", ["pooled", "w_head"], ["y"], name="head", transB=1),
    ]
    inits += [numpy_helper.from_array(np.array([4, TOKENS, 3 * WIDTH], np.int64), "tokens3"),
              numpy_helper.from_array(np.array([1], np.int64), "token_axis"),
              weight("w_proj_t", WIDTH, WIDTH)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, TOKENS, WIDTH])
    graph = helper.make_graph(nodes, "block", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def images(count: int = 64) -> np.ndarray:
    """Token embeddings with two massive residual channels on the first token (an attention sink)."""
    x = np.random.default_rng(1).standard_normal((count, TOKENS, WIDTH)).astype(np.float32)
    x[:, 0, list(MASSIVE)] = SIZE * np.array([1.0, -1.0], np.float32)
    return x


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x[i:i + 4]})[0] for i in range(0, len(x), 4)])


HEAD = frozenset({"norm3", "pool", "head"})


def test_linear_quantizes_the_weight_gemms_only():
    graph = block_graph().graph
    plan = placement_plan(graph, "linear", HEAD)
    assert plan == {"qkv": (0, 1), "proj": (0, 1), "fc1": (0, 1), "fc2": (0, 1)}  # no bmm1/bmm2, Add, LN, head
    assert placement_plan(graph, "linear-sq", HEAD) == plan
    assert {"bmm1", "bmm2", "residual1", "norm2"} <= set(placement_plan(graph, "modelopt", HEAD))
    assert set(PLACEMENTS) == {"linear", "linear-sq", "modelopt", "skip"} and QdqConfig().placement == "linear-sq"


@pytest.mark.parametrize("placement", ["linear", "linear-sq"])
def test_linear_graph_follows_its_rules_and_leaves_the_stream_float(placement):
    quantized, report = quantize_int8(block_graph(), "block", QdqConfig(placement=placement, float_precision="float32"),
                                      Calibration(images), head=HEAD)
    assert qdq_violations(quantized, placement) == []
    assert report["quantized_nodes"] == {"MatMul": 3, "Gemm": 1, "Conv": 0, "Add": 0, "LayerNormalization": 0}
    producers = {o: n for n in quantized.graph.node for o in n.output}
    dequantized = {n.name for n in quantized.graph.node
                   if any(producers.get(i) is not None and producers[i].op_type == "DequantizeLinear" for i in n.input)}
    assert dequantized == {"qkv", "proj", "fc1", "fc2"}
    assert (placement == "linear-sq") == ("smoothquant" in report)
    # the modelopt rules refuse nothing here, but linear's refuse a Q/DQ on an attention MatMul
    assert any("attention MatMul" in p for p in qdq_violations(_dq_on_bmm(quantized), placement))


def _dq_on_bmm(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the qkv activation DQ also read by bmm1 (what linear must not do)."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    nodes = {n.name: n for n in broken.graph.node}
    rows_dq = nodes["qkv"].input[0]
    nodes["bmm1"].input[0] = rows_dq
    return broken


def test_smoothquant_is_exact_in_float32_and_narrows_the_channel_spread():
    model = block_graph()
    x = images()
    targets = smooth_targets(model.graph, HEAD)
    assert [(t.norm, t.gemms) for t in targets] == [("norm1", ("qkv",)), ("norm2", ("fc1",))]  # not the head's
    maxima = activation_channel_max(model, x, [t.output for t in targets])
    smoothed, report = smooth(model, maxima, 0.5, HEAD)
    before, after = run(model, x), run(smoothed, x)
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()
    for entry in report["smoothed"]:  # alpha 0.5: the spread of max |X_j| becomes about its square root
        assert entry["channel_spread_after"] < entry["channel_spread_before"] ** 0.75, entry
    inits = {t.name: numpy_helper.to_array(t) for t in smoothed.graph.initializer}
    original = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    s = smoothing_scales(maxima["n1"], np.abs(original["w_qkv"]).max(axis=0), 0.5)
    assert np.allclose(inits["g1"], original["g1"] / s) and np.allclose(inits["b1"], original["b1"] / s)
    assert np.allclose(inits["w_qkv"], original["w_qkv"] * s[None, :])  # transB: input channels on axis 1
    assert np.array_equal(inits["g3"], original["g3"]) and np.array_equal(inits["w_head"], original["w_head"])


def test_smoothquant_scales_follow_the_formula():
    s = smoothing_scales(np.array([100.0, 1.0, 0.0]), np.array([1.0, 4.0, 1.0]), 0.5)
    assert np.allclose(s, [10.0, 0.5, np.sqrt(1e-5)])
    assert np.allclose(smoothing_scales(np.array([8.0]), np.array([2.0]), 1.0), [8.0])
    with pytest.raises(CalibError, match="alpha"):
        smoothing_scales(np.ones(2), np.ones(2), 1.5)


def test_smoothquant_leaves_a_norm_read_by_anything_but_gemms():
    model = block_graph()
    model.graph.node.append(helper.make_node("Shape", ["n1"], ["n1_shape"], name="shape"))  # reads no value
    nodes = {n.name: n for n in model.graph.node}
    nodes["residual2"].input[0] = "n2"  # n2 now also feeds an Add: not smoothable without changing the Add
    assert [t.norm for t in smooth_targets(model.graph, HEAD)] == ["norm1"]


def test_linear_sq_caches_its_activation_maxima(tmp_path):
    config = QdqConfig(placement="linear-sq", float_precision="float32")
    calibration = Calibration(images, {"images": "block test"}, tmp_path)
    first, report = quantize_int8(block_graph(), "block", config, calibration, head=HEAD)
    assert report["smoothquant"]["cache_hit"] is False

    def no_images() -> np.ndarray:
        raise AssertionError("a cache hit reads no images")

    cached = Calibration(no_images, calibration.identity, tmp_path)
    again, second = quantize_int8(block_graph(), "block", config, cached, head=HEAD)
    assert second["smoothquant"]["cache_hit"] and second["calibration"]["cache_hit"]
    assert again.SerializeToString() == first.SerializeToString()
    with pytest.raises(CalibError, match="alpha"):
        quantize_int8(block_graph(), "block", QdqConfig(placement="linear-sq", smoothquant_alpha=2.0), calibration)


def test_linear_sq_keeps_more_of_the_function_than_linear_on_outlier_channels():
    """Per-tensor int8 of norm1's output is dominated by its 30x channels; smoothing shares them out."""
    x = images(128)
    reference = run(block_graph(), x)
    errors = {}
    for placement in ("linear", "linear-sq"):
        quantized, _ = quantize_int8(block_graph(), "block", QdqConfig(placement=placement, float_precision="float32"),
                                     Calibration(lambda: x), head=HEAD)
        errors[placement] = float(np.abs(run(quantized, x) - reference).mean())
    assert errors["linear-sq"] < errors["linear"], errors
