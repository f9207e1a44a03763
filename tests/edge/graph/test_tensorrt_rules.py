"""TensorRT's rules, checked without TensorRT: a constructed graph that breaks one rule fails with that rule
named (one test per rule), and the graph it was made from passes.

The graphs edge writes (every precision, every method) are checked in test_tensorrt_rules_edge_graphs.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.errors import EdgeError
from edge.check.tensorrt_rules import ERROR, INFO, RULES, check_file, check_model, errors
from edge.check.tensorrt_support import PARSERS

HEADS, SEQ, HEAD = 2, 8, 16


def _initializer(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def attention_graph(head: int = HEAD, opset: int = 19, ir_version: int = 9) -> onnx.ModelProto:
    """q, k, v [1, H, S, D] -> MatMul(q, k^T) -> Mul(scale) -> Softmax -> MatMul(., v) -> Reshape [S*H, D]
    -> Q/DQ (per tensor) -> MatMul with a per-channel int8 weight (DQ, axis 1) -> Gemm -> y [S*H, 4].

    Every rule holds: opset 19 at IR 9, symmetric int8, positive float32 scales, alpha = beta = 1.
    """
    rng = np.random.default_rng(0)
    shape = [1, HEADS, SEQ, head]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v")]
    initializers = [
        _initializer("scale", np.array(head ** -0.5, np.float32)),
        _initializer("flat_shape", np.array([HEADS * SEQ, head], np.int64)),
        _initializer("act_scale", np.array(0.05, np.float32)),
        _initializer("act_zero", np.array(0, np.int8)),
        _initializer("w_int8", rng.integers(-127, 128, (head, 4)).astype(np.int8)),
        _initializer("w_scale", np.full(4, 0.01, np.float32)),
        _initializer("w_zero", np.zeros(4, np.int8)),
        _initializer("gemm_w", rng.standard_normal((4, 4)).astype(np.float32)),
        _initializer("gemm_b", np.zeros(4, np.float32)),
    ]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kT"], name="k_transpose", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kT"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_scores"),
        helper.make_node("Softmax", ["scaled"], ["weights"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["weights", "v"], ["context"], name="av"),
        helper.make_node("Reshape", ["context", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("QuantizeLinear", ["flat", "act_scale", "act_zero"], ["flat_q"], name="q_act"),
        helper.make_node("DequantizeLinear", ["flat_q", "act_scale", "act_zero"], ["flat_dq"], name="dq_act"),
        helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w"], name="dq_weight", axis=1),
        helper.make_node("MatMul", ["flat_dq", "w"], ["projected"], name="proj"),
        helper.make_node("Gemm", ["projected", "gemm_w", "gemm_b"], ["y"], name="head", alpha=1.0, beta=1.0),
    ]
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [HEADS * SEQ, 4])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    onnx.checker.check_model(model, full_check=True)
    return model


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in model.graph.initializer if t.name == name)


def replace_initializer(model: onnx.ModelProto, name: str, array: np.ndarray) -> None:
    initializer(model, name).CopyFrom(numpy_helper.from_array(array, name))


def set_attribute(model: onnx.ModelProto, node_name: str, **attributes) -> None:
    target = node(model, node_name)
    kept = [a for a in target.attribute if a.name not in attributes]
    del target.attribute[:]
    target.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in attributes.items() if v is not None])


def error_rules(model: onnx.ModelProto, tensorrt: str = "10.3") -> set[tuple[str, str]]:
    return {(f.rule, f.node) for f in errors(check_model(model, tensorrt))}


@pytest.mark.parametrize("tensorrt", sorted(PARSERS))
def test_the_constructed_graph_passes_every_rule(tensorrt):
    findings = check_model(attention_graph(), tensorrt)
    assert errors(findings) == []
    assert [(f.rule, f.node, f.severity) for f in findings] == [("attention-fusion", "softmax", INFO)]
    assert "head size 16" in findings[0].what and "fuses" in findings[0].what


def test_operator_outside_the_support_table():
    model = attention_graph()
    node(model, "k_transpose").op_type = "Unique"  # the table marks Unique N
    node(model, "k_transpose").ClearField("attribute")
    assert ("operator", "k_transpose") in error_rules(model)


def test_operator_of_another_domain():
    model = attention_graph()
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    node(model, "softmax").domain = "com.microsoft"
    found = error_rules(model)
    assert ("operator", "softmax") in found


def test_opset_above_the_parser():
    model = attention_graph(opset=21, ir_version=10)   # 10.3 parses opsets 9..20; 10.16 up to 24
    assert error_rules(model, "10.3") == {("opset", "graph")}
    assert error_rules(model, "10.16") == set()


def test_ir_version_below_the_opsets_minimum():
    model = attention_graph(ir_version=8)   # opset 19 needs IR 9: what calib.qdq wrote before issue 29
    finding = next(f for f in check_model(model) if f.rule == "ir-version")
    assert finding.severity == ERROR and "IR version 8 is below 9" in finding.what and "ir_version = 9" in finding.fix


def test_input_type_outside_the_table():
    model = attention_graph()
    cast = helper.make_node("Cast", ["flat"], ["flat_int"], name="to_int32", to=TensorProto.INT32)
    ints = helper.make_node("MatMul", ["flat_int", "flat_int_t"], ["gram"], name="int_matmul")
    transpose = helper.make_node("Transpose", ["flat_int"], ["flat_int_t"], name="int_transpose", perm=[1, 0])
    model.graph.node.extend([cast, transpose, ints])
    model.graph.output.append(helper.make_tensor_value_info("gram", TensorProto.INT32, [HEADS * SEQ, HEADS * SEQ]))
    finding = next(f for f in check_model(model) if f.rule == "input-type")
    assert finding.node == "int_matmul" and "INT32" in finding.what and "FP32, FP16, BF16" in finding.what


def test_per_channel_qdq_without_an_explicit_axis():
    model = attention_graph()
    set_attribute(model, "dq_weight", axis=None)   # ONNX's default (1) is right here, but TensorRT wants it written
    assert error_rules(model) == {("qdq-axis", "dq_weight")}


def test_per_channel_weight_not_along_its_output_channels():
    model = attention_graph()
    set_attribute(model, "dq_weight", axis=0)     # the MatMul weight [K, N]: output channels are axis 1
    replace_initializer(model, "w_scale", np.full(HEAD, 0.01, np.float32))
    replace_initializer(model, "w_zero", np.zeros(HEAD, np.int8))
    finding = next(f for f in check_model(model) if f.rule == "qdq-axis")
    assert finding.node == "dq_weight" and "output channels are axis 1" in finding.what


def test_a_float_weight_quantized_by_a_qdq_pair_is_a_weight_and_its_axis_checked():
    """AddQDQPairToWeight style: Q(float weight) -> DQ -> MatMul; per channel along axis 1 passes, axis 0 fails."""
    model = attention_graph()
    float_weight = np.random.default_rng(1).standard_normal((HEAD, 4)).astype(np.float32)
    model.graph.initializer.append(_initializer("w_float", float_weight))
    model.graph.node.insert(8, helper.make_node("QuantizeLinear", ["w_float", "w_scale", "w_zero"], ["w_q"],
                                                name="q_weight", axis=1))
    node(model, "dq_weight").input[0] = "w_q"
    assert error_rules(model) == set()
    for name in ("q_weight", "dq_weight"):
        set_attribute(model, name, axis=0)
    replace_initializer(model, "w_scale", np.full(HEAD, 0.01, np.float32))
    replace_initializer(model, "w_zero", np.zeros(HEAD, np.int8))
    assert error_rules(model) == {("qdq-axis", "q_weight"), ("qdq-axis", "dq_weight")}


def test_per_channel_scales_on_an_activation():
    model = attention_graph()
    replace_initializer(model, "act_scale", np.full(HEAD, 0.05, np.float32))
    replace_initializer(model, "act_zero", np.zeros(HEAD, np.int8))
    set_attribute(model, "q_act", axis=1)
    set_attribute(model, "dq_act", axis=1)
    assert ("qdq-axis", "dq_act") in error_rules(model)


def test_float16_scale_that_rounds_to_zero():
    model = attention_graph()
    replace_initializer(model, "w_scale", np.array([0.01, 1e-9, 0.01, 0.01], np.float32).astype(np.float16))
    set_attribute(model, "dq_weight", axis=1)
    found = [f for f in check_model(model) if f.rule == "qdq-scale"]
    assert [f.node for f in found] == ["dq_weight"] and "FLOAT16" in found[0].what and "1 of 4" in found[0].what


def test_negative_scale():
    model = attention_graph()
    replace_initializer(model, "act_scale", np.array(-0.05, np.float32))
    assert error_rules(model) == {("qdq-scale", "q_act"), ("qdq-scale", "dq_act")}


def test_non_zero_zero_point():
    model = attention_graph()
    replace_initializer(model, "act_zero", np.array(3, np.int8))
    assert error_rules(model) == {("qdq-zero-point", "q_act"), ("qdq-zero-point", "dq_act")}


def test_quantize_input_type_differs_from_its_scale():
    model = attention_graph()
    replace_initializer(model, "act_scale", np.array(0.05, np.float16))  # the Q reads float32 x
    assert ("qdq-input-type", "q_act") in error_rules(model)


def test_gemm_alpha_beta_not_one():
    model = attention_graph()
    set_attribute(model, "head", alpha=0.5)
    finding = next(f for f in check_model(model) if f.rule == "gemm-alpha-beta")
    assert finding.node == "head" and "alpha 0.5" in finding.what


def test_attention_split_by_a_cast_is_reported_as_information_only():
    model = attention_graph()
    node(model, "softmax").input[0] = "scaled_fp32"
    cast = helper.make_node("Cast", ["scaled"], ["scaled_fp32"], name="island", to=TensorProto.FLOAT)
    model.graph.node.insert(3, cast)
    findings = check_model(model)
    attention = [f for f in findings if f.rule == "attention-fusion"]
    assert errors(findings) == [] and attention[0].severity == INFO and "not in the fusable shape" in attention[0].what
    assert "Cast" in attention[0].what


def test_head_size_outside_the_fused_kernels_is_information_only():
    findings = check_model(attention_graph(head=12))
    attention = next(f for f in findings if f.rule == "attention-fusion")
    assert errors(findings) == [] and "head size 12" in attention.what and "multiple of 8" in attention.what


def test_every_rule_is_tested_here():
    # "plugin": tests/edge/graph/test_token_depthwise_conv.py (edge clean --plugins writes the plugin op)
    tested = {"operator", "plugin", "opset", "ir-version", "input-type", "qdq-axis", "qdq-scale", "qdq-zero-point",
              "qdq-input-type", "gemm-alpha-beta", "attention-fusion"}
    assert tested == set(RULES)


def test_unknown_tensorrt_version_and_missing_file_name_the_fix(tmp_path):
    with pytest.raises(EdgeError, match="TensorRT '9.9' has no support table"):
        check_model(attention_graph(), "9.9")
    with pytest.raises(EdgeError, match="does not exist"):
        check_file(tmp_path / "missing.onnx")


def test_edge_check_exits_2_naming_the_rule_and_0_on_a_passing_graph(tmp_path, capsys):
    from edge.cli import main

    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(attention_graph(), good)
    broken = attention_graph()
    set_attribute(broken, "head", beta=2.0)
    onnx.save(broken, bad)
    assert main(["check", str(good)]) == 0
    assert "passes for TensorRT 10.3" in capsys.readouterr().out
    assert main(["check", str(good), str(bad), "--trt", "10.16"]) == 2
    captured = capsys.readouterr()
    assert "[gemm-alpha-beta] head: Gemm with alpha 1, beta 2" in captured.out and "bad.onnx" in captured.err
    assert main(["check", str(bad), "--json"]) == 2
    result = json.loads(capsys.readouterr().out)
    found = [(f["rule"], f["severity"]) for f in result["graphs"][0]["findings"]]
    assert result["passed"] is False and sorted(found) == [("attention-fusion", "info"), ("gemm-alpha-beta", "error")]


def test_edge_bundle_refuses_a_graph_that_breaks_a_rule_unless_told(tmp_path):
    from edge.bundle import BundleConfig, make_bundle

    broken = attention_graph()
    set_attribute(broken, "head", alpha=2.0)
    onnx.save(broken, tmp_path / "broken.onnx")
    with pytest.raises(EdgeError, match=r"break the rules of TensorRT 10\.3") as refused:
        make_bundle([tmp_path / "broken.onnx"], tmp_path / "bundle", BundleConfig(precisions=("fp32",)))
    assert "[gemm-alpha-beta] head" in str(refused.value) and "--no-trt-check" in str(refused.value)
    assert not (tmp_path / "bundle").exists()  # nothing written
    said = []
    make_bundle([tmp_path / "broken.onnx"], tmp_path / "bundle",
                BundleConfig(precisions=("fp32",), check_tensorrt=False, gate_images=0),  # not a classifier: no gate
                progress=said.append)
    assert (tmp_path / "bundle" / "graphs/broken/fp32.onnx").is_file()
    assert any("broken.fp32: breaks 1 rule(s) of TensorRT 10.3" in line for line in said)
    onnx.save(attention_graph(), tmp_path / "good.onnx")
    make_bundle([tmp_path / "good.onnx"], tmp_path / "good",
                BundleConfig(precisions=("fp32",), tensorrt="10.16", gate_images=0))
    assert (tmp_path / "good" / "graphs/good/fp32.onnx").is_file()
