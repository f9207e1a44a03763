"""What `edge check` says of a TokenDepthwiseConv node TensorRT would refuse (issue 43, defects 9 and 10).

The facts are onnx-tensorrt's (onnxOpImporters.cpp, 10.0-GA to 10.16): its fallback plugin importer takes
IPluginCreatorV3One creators from 10.0, looks the creator up by op type, ``plugin_version`` and
``plugin_namespace``, and ``loadFields`` hands each other attribute to it as a plugin field of the attribute's
type (FLOAT and FLOATS -> kFLOAT32, INT and INTS -> kINT32, STRING -> kCHAR, a TENSOR by its element type:
BFLOAT16 -> kBF16, INT32 -> kINT32; INT64 stops the parse). The creator (plugins/tokenDepthwiseConv/
tokenDepthwiseConvPlugin.cpp) reads kINT32 for kernel_size, grid (2) and prefix_tokens, kFLOAT32 or kFLOAT16 for
the weights, kCHAR for prefix_mode, and takes float32 or float16 tokens of shape [B, P + H*W, C].
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.check.plugin_ops import DOMAIN, MIN_TENSORRT, TOKEN_DEPTHWISE_CONV, read_fields
from edge.errors import EdgeError
from edge.check.tensorrt_rules import ERROR, INFO, check_model, check_plugin
from edge.check.tensorrt_support import PARSERS

GRID, CHANNELS, K = (3, 4), 4, 3
TOKENS = 1 + GRID[0] * GRID[1]


def weight(dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones((CHANNELS, 1, K, K), dtype))


def node(**changes) -> onnx.NodeProto:
    fields = {"kernel_size": K, "grid": list(GRID), "prefix_tokens": 1, "prefix_mode": "mean", "weight": weight(),
              "plugin_version": "1", "plugin_namespace": "", **changes}
    return helper.make_node(TOKEN_DEPTHWISE_CONV, ["x"], ["y"], name="mixer", domain=DOMAIN,
                            **{k: v for k, v in fields.items() if v is not None})


def model(plugin: onnx.NodeProto, tokens_type: int = TensorProto.FLOAT,
          shape: list = ("B", TOKENS, CHANNELS)) -> onnx.ModelProto:
    graph = helper.make_graph([plugin], "g", [helper.make_tensor_value_info("x", tokens_type, list(shape))],
                              [helper.make_tensor_value_info("y", tokens_type, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def plugin_finding(m: onnx.ModelProto):
    return next(f for f in check_model(m) if f.rule == "plugin")


def test_a_node_edge_writes_passes_with_float16_weights_too():
    assert read_fields(node()).channels == CHANNELS
    assert read_fields(node(weight=weight(np.float16))).weight.dtype == np.float16  # kFLOAT16: the creator takes it
    assert plugin_finding(model(node())).severity == INFO
    assert plugin_finding(model(node(), TensorProto.FLOAT16)).severity == INFO


@pytest.mark.parametrize("change, says", [
    ({"kernel_size": 3.0}, "kernel_size: a FLOAT attribute (kFLOAT32 field): expected an INT"),
    ({"grid": [3.0, 4.0]}, "grid: a FLOATS attribute (kFLOAT32 field): expected INTS of 2"),
    ({"grid": 3}, "grid: a INT attribute (kINT32 field): expected INTS of 2"),
    ({"weight": numpy_helper.from_array(np.ones((CHANNELS, 1, K, K), np.int32))},
     "weight: a TENSOR of INT32 attribute (kINT32 field): expected a FLOAT or FLOAT16 tensor"),
    ({"weight": helper.make_tensor("w", TensorProto.BFLOAT16, [CHANNELS, 1, K, K], [0] * CHANNELS * K * K)},
     "weight: a TENSOR of BFLOAT16 attribute (kBF16 field)"),
    ({"weight": numpy_helper.from_array(np.ones((CHANNELS, 1, K, K), np.int64))},
     "weight: a TENSOR of INT64 attribute, which TensorRT's parser cannot pass to a plugin"),
    ({"weight": [1.0] * CHANNELS * K * K}, "weight: a FLOATS attribute (its values without their shape)"),
    ({"prefix_mode": 1}, "prefix_mode: a INT attribute (kINT32 field): expected a STRING"),
    ({"plugin_namespace": "acme"}, "plugin_namespace 'acme': the creator is registered under ''"),
])
def test_attributes_tensorrt_would_refuse_are_named_not_crashed_on(change, says):
    with pytest.raises(EdgeError, match="TensorRT would refuse its attributes") as e:
        read_fields(node(**change))
    assert says in str(e.value)
    finding = plugin_finding(model(node(**change)))
    assert finding.severity == ERROR and says in finding.what


@pytest.mark.parametrize("tokens_type, shape, says", [
    (TensorProto.INT32, ("B", TOKENS, CHANNELS), "tokens of type INT32: expected FLOAT or FLOAT16"),
    (TensorProto.FLOAT, (1, TOKENS + 1, CHANNELS), f"tokens of shape [1, {TOKENS + 1}, {CHANNELS}]: expected "
                                                   f"[B, {TOKENS}, {CHANNELS}]"),
    (TensorProto.FLOAT, (1, TOKENS, CHANNELS, 1), "tokens of shape [1, 13, 4, 1]"),
])
def test_an_input_the_plugin_refuses_is_an_error(tokens_type, shape, says):
    finding = plugin_finding(model(node(), tokens_type, list(shape)))
    assert finding.severity == ERROR and says in finding.what


def test_v3_plugins_are_imported_from_tensorrt_10_0():
    """onnx-tensorrt 10.0-GA's FallbackPluginImporter already takes IPluginCreatorV3One creators."""
    assert MIN_TENSORRT == (10, 0)
    parser = next(iter(PARSERS.values()))
    for release, severity in (("10.0", INFO), ("9.3", ERROR)):
        older = type(parser)(**{**parser.__dict__, "tensorrt": release})
        (finding,) = check_plugin(node(), "mixer", older)
        assert finding.severity == severity, release
