"""The Orin Nano estimator (edge.latency.orin): the roofline arithmetic (known FLOPs and bytes give a
known time), the kernels of a part, the calibration (reproducible, and within its tolerance of the
published figures it was fitted to), and its refusals."""

from __future__ import annotations

import pytest

from edge.errors import EdgeError
from edge.latency import Part, Target, model_parts, orin, predict_parts
from edge.latency.orin import Efficiency, Op, op_seconds, part_ops
from tests.conftest import TINY

SUPER = orin.MODES["MAXN_SUPER"]


def test_peaks_and_bandwidth_per_mode():
    # 8 SMs x 1024 dense FP16 FMA per clock x 2 at 1020 MHz: 16.7 TFLOPS; 128-bit LPDDR5 at 3199 MHz: 102 GB/s
    assert SUPER.tensor_peak("fp16") == pytest.approx(16.71e12, rel=1e-3)
    assert SUPER.tensor_peak("int8") == 2 * SUPER.tensor_peak("fp16") == 4 * SUPER.tensor_peak("fp32")
    assert SUPER.cuda_peak("fp32") == pytest.approx(2.089e12, rel=1e-3)
    assert SUPER.bandwidth == pytest.approx(102.4e9, rel=1e-3)
    assert orin.MODES["15W"].bandwidth == pytest.approx(68.3e9, rel=1e-3)


def test_roofline_arithmetic():
    peak = SUPER.tensor_peak("fp16")
    op = Op("gemm", "tensor", flops=peak * 1e-3, bytes=SUPER.bandwidth * 0.5e-3)   # 1 ms of math, 0.5 ms of memory
    assert op_seconds(op, SUPER, "fp16", Efficiency(1.0, 1.0, 0.0)) == pytest.approx(1e-3, rel=1e-12)
    assert op_seconds(op, SUPER, "fp16", Efficiency(0.5, 1.0, 0.0)) == pytest.approx(2e-3, rel=1e-12)
    assert op_seconds(op, SUPER, "fp16", Efficiency(1.0, 0.25, 0.0)) == pytest.approx(2e-3, rel=1e-12)  # memory-bound
    assert op_seconds(op, SUPER, "fp16", Efficiency(1.0, 1.0, 2.5)) == pytest.approx(1e-3 + 2.5e-6, rel=1e-12)
    layernorm = Op("ln", "cuda", flops=0.0, bytes=SUPER.bandwidth * 1e-3)
    assert op_seconds(layernorm, SUPER, "fp32", Efficiency(0.3, 0.5, 0.0)) == pytest.approx(2e-3, rel=1e-12)


def test_kernels_of_an_mlp_and_an_attention():
    mlp = Part.make("mlp", 192, 50, hidden=768, bias=1, scaled=0, ls=0)
    ln, fc1, fc2 = part_ops(mlp, 2, "fp16")
    m = 2 * 50
    assert fc1.flops == 2 * m * 192 * 768 and fc1.bytes == (m * 192 + 192 * 768 + m * 768) * 2
    assert fc2.bytes == (m * 768 + 768 * 192 + m * 192) * 2 + m * 192 * 2   # + the residual read in the epilogue
    assert ln.bytes == 2 * m * 192 * 2 and ln.unit == "cuda"
    attention = Part.make("attention", 192, 50, heads=3, qk=32, v=64, qkv_bias=1, proj_bias=1, ls=0)
    fused = [op for op in part_ops(attention, 1, "fp16") if op.name == "fused attention"]
    assert len(fused) == 1 and fused[0].flops == 2 * 3 * 50 * 50 * (32 + 64)
    unfused = part_ops(attention, 1, "fp32")
    assert [op.name for op in unfused][2:5] == ["q k^T", "softmax", "attn v"]   # fp32: scores through memory
    assert part_ops(Part.make("overhead", 8, 8), 1, "fp16") == []


def test_vit_parts_match_a_timm_model():
    from edge.models import create_model

    model = create_model(TINY)
    assert orin.vit_parts(dim=32, depth=4, heads=2, hidden=128, patch=7, size=28, classes=10,
                          in_chans=1) == model_parts(model)


def test_calibration_is_reproducible_and_close_to_what_it_was_fitted_to():
    assert orin.calibrate() == orin.CALIBRATED
    rows = {(r["name"], r["mode"]): r for r in orin.report()}
    for (name, mode), row in rows.items():
        if row["calibrated_on"]:
            assert abs(row["error"]) < 0.05, (name, mode, row["error"])
    held_out = rows[("DINOv2-B/14 224", "original")]
    assert not held_out["calibrated_on"] and abs(held_out["error"]) < 0.10
    assert all(r["source"].startswith("https://") or "github.com" in r["source"] for r in rows.values())


def test_estimate_table_predicts_and_is_never_taken_for_a_measured_one():
    parts = orin.vit_parts(dim=768, depth=12, heads=12, hidden=3072, patch=16, size=224)
    table = orin.estimate_table(list(dict.fromkeys(parts)), "MAXN_SUPER", "fp16", 1)
    assert table.target == orin.target("MAXN_SUPER", "fp16", 1)
    prediction = predict_parts(parts, table, orin.target("MAXN_SUPER", "fp16", 1))
    assert prediction.total_ms == pytest.approx(orin.estimate_ms(parts, "MAXN_SUPER", "fp16", 1, orin.CALIBRATED))
    measured = Target("tensorrt", "NVIDIA Jetson Orin Nano Developer Kit", "fp16", 1, None, "MAXN_SUPER")
    with pytest.raises(EdgeError, match="backend, device differ") as refused:
        predict_parts(parts, table, measured)
    assert "estimate on Jetson Orin Nano 8GB, power mode MAXN_SUPER" in str(refused.value)


def test_unknown_mode_and_precision_are_refused():
    with pytest.raises(EdgeError, match="(?s)power mode '7W'.*expected: one of 15W, 25W, MAXN_SUPER, original"):
        orin.estimate_table([], "7W")
    with pytest.raises(EdgeError, match="precision 'bf16'"):
        orin.estimate_table([], "MAXN_SUPER", "bf16")
