"""TensorRT's fast shapes (edge.latency.tensorrt_shapes) and what the Orin Nano estimator charges for breaking them."""

from __future__ import annotations

import pytest

from edge.latency import Part, orin
from edge.latency.orin import CALIBRATED, part_ms, part_ops
from edge.latency.tensorrt_shapes import fusion_blocker, new_violations, part_violations

SUPER = orin.MODES["MAXN_SUPER"]


def attention(qk: int, v: int | None = None, heads: int = 2, dim: int = 64, tokens: int = 17) -> Part:
    return Part.make("attention", dim, tokens, heads=heads, qk=qk, v=qk if v is None else v, qkv_bias=1, proj_bias=1,
                     ls=0)


def mlp(hidden: int, dim: int = 64) -> Part:
    return Part.make("mlp", dim, 17, hidden=hidden, bias=1, scaled=0, ls=0)


@pytest.mark.parametrize("size, precision, fused", [
    (16, "fp16", True), (24, "fp16", True), (48, "fp16", True), (256, "fp16", True), (12, "fp16", False),
    (8, "fp16", False), (20, "fp16", False), (264, "fp16", False),
    (16, "int8", True), (32, "int8", True), (64, "int8", True), (48, "int8", False), (24, "int8", False),
    (64, "fp32", False)])
def test_fused_attention_head_sizes_per_precision(size, precision, fused):
    assert (fusion_blocker(size, 50, precision) is None) is fused


def test_int8_fused_attention_takes_at_most_512_tokens():
    assert fusion_blocker(64, 512, "int8") is None
    assert "513 tokens" in fusion_blocker(64, 513, "int8")
    assert fusion_blocker(64, 513, "fp16") is None


def test_each_rule_names_the_value_that_breaks_it():
    rules = {(v.rule, v.value) for v in part_violations(attention(12), "fp16")}
    # head 12 is unfusable; qkv is 2 x 36 = 72 wide and proj takes 2 x 12 = 24: neither a multiple of 16
    assert rules == {("attention-fusion", 12), ("gemm-width", 72), ("gemm-width", 24)}
    assert {(v.rule, v.value) for v in part_violations(attention(32, 16), "fp16")} == {("equal-head-sizes", 16)}
    assert {(v.rule, v.value) for v in part_violations(attention(48), "int8")} == {("attention-fusion", 48)}
    assert part_violations(attention(48), "fp16") == []
    assert {(v.rule, v.value) for v in part_violations(mlp(100), "fp16")} == {("gemm-width", 100)}
    assert part_violations(mlp(128), "int8") == []
    # fp32 engines fuse no attention: only the GEMM widths count
    assert {v.rule for v in part_violations(attention(12), "fp32")} == {"gemm-width"}


def test_what_the_original_breaks_already_is_not_new():
    original = [attention(12), mlp(256)]
    assert new_violations([attention(12), mlp(256)], original, "fp16") == []
    found = new_violations([attention(12), mlp(100)], original, "fp16")
    assert [(v.rule, v.value) for v in found] == [("gemm-width", 100)]


def test_the_estimator_runs_an_unfusable_head_size_unfused_and_charges_more():
    names = [op.name for op in part_ops(attention(12), 1, "fp16")]
    assert names[2:5] == ["q k^T", "softmax", "attn v"] and "fused attention" not in names
    assert [op.name for op in part_ops(attention(16), 1, "fp16")][2] == "fused attention"
    # a narrower head that breaks fusion costs more than a wider one that keeps it (scores through memory,
    # three kernels instead of one)
    assert part_ms(attention(12), SUPER, "fp16", 1, CALIBRATED) > part_ms(attention(16), SUPER, "fp16", 1, CALIBRATED)
    assert part_ms(attention(48), SUPER, "int8", 1, CALIBRATED) > part_ms(attention(64), SUPER, "int8", 1, CALIBRATED)
    assert [op.name for op in part_ops(attention(48), 1, "int8")][2] == "q k^T"


def test_the_estimator_charges_a_misaligned_gemm_as_padded():
    m = 17
    fc1 = part_ops(mlp(100), 1, "fp16")[1]
    assert fc1.flops == 2 * m * 64 * 104          # 100 -> 104: 8 fp16 elements are 16 bytes
    assert part_ops(mlp(100), 1, "int8")[1].flops == 2 * m * 64 * 112   # 16 int8 elements
    assert part_ops(mlp(96), 1, "fp16")[1].flops == 2 * m * 64 * 96     # aligned: nothing added
    assert fc1.bytes == (m * 64 + 64 * 100 + m * 100) * 2                # the bytes moved are the real ones
