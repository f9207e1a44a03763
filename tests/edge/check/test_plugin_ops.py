"""ONNX Runtime runs edge's plugin ops as their numpy references: the rewrite, the session, the missing package."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.check.compare import ort_session
from edge.check.plugin_ops import DOMAIN, TOKEN_DEPTHWISE_CONV, reference_library, session_model
from edge.errors import EdgeError
from plugins.tokenDepthwiseConv import reference

pytest.importorskip("onnxruntime_extensions", reason="onnxruntime-extensions runs the plugin's reference in ORT "
                    "(pip install -e '.[test]')")

RNG = np.random.default_rng(0)
GRID, CHANNELS, K = (3, 4), 6, 3


def _plugin_graph(prefix_tokens: int, mode: str) -> tuple[onnx.ModelProto, dict]:
    tokens = prefix_tokens + GRID[0] * GRID[1]
    fields = {"weight": RNG.standard_normal((CHANNELS, 1, K, K)).astype(np.float32),
              "bias": RNG.standard_normal(CHANNELS).astype(np.float32)}
    if mode == "pool" and prefix_tokens:
        fields["prefix_weights"] = RNG.uniform(0, 1, (prefix_tokens, tokens, CHANNELS)).astype(np.float32)
    node = helper.make_node(TOKEN_DEPTHWISE_CONV, ["x"], ["y"], name="mixer", domain=DOMAIN, kernel_size=K,
                            grid=list(GRID), prefix_tokens=prefix_tokens, prefix_mode=mode, plugin_version="1",
                            plugin_namespace="", **{k: numpy_helper.from_array(v) for k, v in fields.items()})
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", tokens, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", tokens, CHANNELS])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return model, fields


@pytest.mark.parametrize("prefix_tokens, mode", [(2, "pool"), (2, "mean"), (0, "mean")])
def test_a_plugin_graph_runs_in_onnx_runtime_as_the_numpy_reference(prefix_tokens, mode, tmp_path):
    model, fields = _plugin_graph(prefix_tokens, mode)
    onnx.save(model, str(tmp_path / "plugin.onnx"))
    x = RNG.standard_normal((3, prefix_tokens + GRID[0] * GRID[1], CHANNELS)).astype(np.float32)
    expected = reference.token_depthwise_conv(x, fields["weight"], fields["bias"], grid=GRID,
                                              prefix_tokens=prefix_tokens, prefix_mode=mode,
                                              prefix_weights=fields.get("prefix_weights"))
    for source in (model.SerializeToString(), str(tmp_path / "plugin.onnx")):   # bytes and a path
        out = ort_session(source).run(None, {"x": x})[0]
        np.testing.assert_array_equal(out, expected)


def test_a_graph_without_plugin_ops_goes_to_onnx_runtime_as_it_came():
    model, _ = _plugin_graph(0, "mean")
    model.graph.node[0].CopyFrom(helper.make_node("Relu", ["x"], ["y"]))
    data = model.SerializeToString()
    assert session_model(data) == (data, None)


def test_without_onnxruntime_extensions_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)   # an import of it now fails
    with pytest.raises(EdgeError, match="onnxruntime-extensions, and that package is not installed") as caught:
        reference_library.__wrapped__()
    assert "pip install onnxruntime-extensions" in caught.value.fix


def test_float16_tokens_run_through_casts_around_the_float32_reference():
    """A graph converted to fp16 (edge quantize --precision fp16) feeds the plugin float16 tokens, as TensorRT may."""
    model, fields = _plugin_graph(1, "pool")
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    x = RNG.standard_normal((2, 1 + GRID[0] * GRID[1], CHANNELS)).astype(np.float16)
    out = ort_session(model.SerializeToString()).run(None, {"x": x})[0]
    expected = reference.token_depthwise_conv(x.astype(np.float32), fields["weight"], fields["bias"], grid=GRID,
                                              prefix_tokens=1, prefix_mode="pool",
                                              prefix_weights=fields["prefix_weights"])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
