"""An Orin Nano latency estimate where no device table exists: a roofline per operation and power mode.

Each part (:mod:`edge.latency.parts`) becomes the kernels TensorRT runs for it, with their FLOPs and
the bytes they move (:func:`part_ops`; fusions assumed as TensorRT makes them: bias, GELU, LayerScale
and the residual Add in the GEMM's epilogue; fp16/int8 attention as one fused kernel where its head
size is one the fused kernels take, else, as fp32 attention always, QK^T, Softmax, AV through memory
(:func:`edge.latency.tensorrt_shapes.fusion_blocker`: the head sizes of TensorRT's developer guide)).
A GEMM whose K or N is not a multiple of the 16 bytes Tensor Core kernels load (8 fp16, 16 int8,
4 tf32 elements) is charged the work of the GEMM padded to that multiple (an assumption: tile
quantization's cost; a kernel with narrower loads may be slower still). One kernel takes

    time = max(FLOPs / (peak x e_compute), bytes / (bandwidth x e_memory)) + launch

with the peak of its unit (Tensor Cores for matrix products: FP16, INT8, or TF32 for an fp32 engine;
the CUDA cores for the rest) at the power mode's GPU clock, and the bandwidth at its memory clock.
``e_compute`` and ``e_memory`` are fitted to published Orin Nano figures (:data:`PUBLISHED`, each
with its source) by :func:`calibrate`; ``launch`` is fixed (:data:`LAUNCH_US`, an assumption: a
CUDA-graph kernel launch on Orin costs a few microseconds; no published figure was found).

The hardware (NVIDIA's Jetson Orin Nano Super Developer Kit data sheet, December 2024, and its
announcement, :data:`_SUPER_BLOG`; the power modes' clocks are JetPack 6.2's nvpmodel Super modes, :data:`MODES`):
8 SMs, 1024 CUDA cores and 32 Tensor Cores; dense FP16 Tensor Core work 16 384 FLOP per clock
(16.7 TFLOPS at 1020 MHz), INT8 twice that, TF32 half, FP32 CUDA cores 2048 FLOP per clock; 128-bit
LPDDR5: 68 GB/s at 2133 MHz memory clock (15 W and the original, pre-Super modes), 102 GB/s at 3200
MHz (25 W, MAXN_SUPER).

The estimate is a table like a measured one (backend ``estimate``, device ``Jetson Orin Nano 8GB``,
the power mode, precision and batch): :func:`edge.latency.predict.predict_parts` sums it, and its
target is never mistaken for a measured TensorRT table's (the backend differs, so a check refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.errors import EdgeError
from edge.latency.parts import Part, overhead_part
from edge.latency.table import LatencyTable, Target
from edge.latency.tensorrt_shapes import fusion_blocker

DEVICE = "Jetson Orin Nano 8GB"
BACKEND = "estimate"      # a roofline estimate of TensorRT, not a measurement
PRECISIONS = ("fp32", "fp16", "int8")
SM_COUNT = 8
TENSOR_FLOP_PER_CLOCK = {"fp16": 16384, "int8": 32768, "fp32": 8192}   # fp32 engines run GEMMs as TF32
CUDA_FLOP_PER_CLOCK = {"fp16": 4096, "int8": 4096, "fp32": 2048}       # FP16 on CUDA cores at twice FP32
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}
OTHER_BYTES = {"fp32": 4, "fp16": 2, "int8": 2}   # int8 engines keep LayerNorm, Softmax, ... in fp16
BUS_BYTES = 16            # 128-bit LPDDR5
LAUNCH_US = 2.5           # per kernel (assumption, see the module notes)


@dataclass(frozen=True)
class PowerMode:
    name: str
    gpu_mhz: float
    memory_mhz: float     # the EMC clock; bandwidth = 2 (DDR) x 16 bytes x clock
    source: str

    @property
    def bandwidth(self) -> float:
        return 2 * BUS_BYTES * self.memory_mhz * 1e6

    def tensor_peak(self, precision: str) -> float:
        return TENSOR_FLOP_PER_CLOCK[precision] * self.gpu_mhz * 1e6

    def cuda_peak(self, precision: str) -> float:
        return CUDA_FLOP_PER_CLOCK[precision] * self.gpu_mhz * 1e6


_MODES_SOURCE = ("NVIDIA's Jetson Orin Nano Super announcement (nvpmodel modes of JetPack 6.2's Super configuration): "
                 "https://developer.nvidia.com/blog/nvidia-jetson-orin-nano-developer-kit-gets-a-super-boost/")
MODES = {m.name: m for m in (
    PowerMode("15W", 612, 2133, _MODES_SOURCE),
    PowerMode("25W", 918, 3199, _MODES_SOURCE),
    PowerMode("MAXN_SUPER", 1020, 3199, _MODES_SOURCE),
    # before JetPack 6.2 ("original" in NVIDIA's Super comparison): GPU 625 MHz, 68 GB/s
    PowerMode("original", 625, 2133, _MODES_SOURCE + "; https://www.brojogopalsapui.com/dark/ai-foundations/"
              "sub_contents/AI_hardware/jetson_orin_nano_dark.html (625 MHz -> 1.02 GHz, 68 -> 102 GB/s)"),
)}


@dataclass(frozen=True)
class Op:
    """One kernel: ``flops`` on ``unit`` (``tensor`` or ``cuda``) and ``bytes`` through memory."""

    name: str
    unit: str
    flops: float
    bytes: float


@dataclass(frozen=True)
class Efficiency:
    compute: float    # share of the unit's peak a kernel reaches
    memory: float     # share of the bandwidth
    launch_us: float = LAUNCH_US


def _padded(width: int, e: int) -> int:
    """``width`` rounded up to the 16 bytes a Tensor Core kernel loads (module notes)."""
    step = max(1, 16 // e)
    return -(-width // step) * step


def _gemm(name: str, m: int, k: int, n: int, e: int, extra_bytes: float = 0.0, pad: bool = True) -> Op:
    """A GEMM [m, k] x [k, n]; ``pad``: charged as padded to Tensor Core alignment (not the patch convolution,
    an implicit GEMM over the image's channels)."""
    kp, np_ = (_padded(k, e), _padded(n, e)) if pad else (k, n)
    return Op(name, "tensor", 2.0 * m * kp * np_, float(m * k + k * n + m * n) * e + extra_bytes)


def _memory(name: str, elements: float, o: int, flops_per_element: float = 5.0) -> Op:
    return Op(name, "cuda", flops_per_element * elements / 2, elements * o)


def _attention_core(b: int, heads: int, t: int, qk: int, v: int, precision: str) -> list[Op]:
    e, o = ELEMENT_BYTES[precision], OTHER_BYTES[precision]
    qkv_bytes = b * t * heads * (2 * qk + v) * e
    flops = 2.0 * b * heads * t * t * (qk + v)
    if fusion_blocker(qk, t, precision) is None and fusion_blocker(v, t, precision) is None:
        # one fused kernel: scores stay on chip
        return [Op("fused attention", "tensor", flops, qkv_bytes + b * t * heads * v * e)]
    scores = b * heads * t * t
    return [Op("q k^T", "tensor", 2.0 * scores * qk, b * t * heads * 2 * qk * e + scores * o),
            _memory("softmax", 2 * scores, o),
            Op("attn v", "tensor", 2.0 * scores * v, scores * o + b * t * heads * v * e * 2)]


def part_ops(part: Part, batch: int, precision: str) -> list[Op]:
    """The kernels of ``part`` at ``batch`` and ``precision`` (see the module notes for the fusions assumed)."""
    if precision not in PRECISIONS:
        raise EdgeError(f"precision {precision!r}", expected=f"one of {', '.join(PRECISIONS)}")
    b, d, t = batch, part.dim, part.tokens
    e, o = ELEMENT_BYTES[precision], OTHER_BYTES[precision]
    m = b * t
    stream = m * d
    norm = _memory("layernorm", 2 * stream, o)
    residual = stream * o     # the residual read by the epilogue of the sub-layer's last GEMM
    kind = part.kind
    if kind == "overhead":
        return []
    if kind == "attention":
        h, qk, v = part.size("heads"), part.size("qk"), part.size("v")
        return [norm, _gemm("qkv", m, d, h * (2 * qk + v), e), *_attention_core(b, h, t, qk, v, precision),
                _gemm("proj", m, h * v, d, e, residual)]
    if kind == "mlp":
        hidden = part.size("hidden")
        return [norm, _gemm("fc1+gelu", m, d, hidden, e), _gemm("fc2", m, hidden, d, e, residual)]
    if kind == "attn_map":
        return [norm, _gemm("map", m, d, d, e, residual)]
    if kind == "span":
        p = part.size("prefix_map")
        if not p:
            return [_gemm("map", m, d, d, e)]
        return [_gemm("prefix map", b * p, d, d, e), _gemm("map", b * (t - p), d, d, e),
                _memory("concat", 2 * stream, o)]
    if kind == "dwconv":
        return _dwconv_ops(part, b, precision, norm, residual)
    if kind == "embed":
        c, ph, pw = part.size("in_chans"), part.size("patch_h"), part.size("patch_w")
        patches = (part.size("height") // ph) * (part.size("width") // pw)
        ops = [_gemm("patch conv", b * patches, c * ph * pw, d, e, pad=False),
               _memory("prefix + position", 2 * stream, o)]
        return ops + ([_memory("norm_pre", 2 * stream, o)] if part.size("norm_pre") else [])
    if kind == "head":
        classes, pooled = part.size("classes"), b * d
        ops = [_memory("norm + pool", 2 * stream if part.size("norm") else stream, o)]
        if part.size("fc_norm"):
            ops.append(_memory("fc_norm", 2 * pooled, o))
        return ops + ([_gemm("head", b, d, classes, e)] if classes else [])
    raise EdgeError(f"part {part.key} has no kernels in the Orin Nano estimator")


def _dwconv_ops(part: Part, b: int, precision: str, norm: Op, residual: float) -> list[Op]:
    e, o = ELEMENT_BYTES[precision], OTHER_BYTES[precision]
    d, t = part.dim, part.tokens
    width, k, kept, hd = part.size("width"), part.size("k"), part.size("kept"), part.size("head_dim")
    p, prefix = part.size("prefix_tokens"), str(part.get("prefix"))
    patches = t - p
    ops = [norm]
    value_tokens = t if prefix in ("pool", "attend") else patches
    if part.size("dense"):
        ops.append(Op("dense conv", "tensor", 2.0 * b * patches * d * width * k * k,
                      (b * patches * (d + width) + d * width * k * k) * e))
    else:
        ops += [_gemm("value", b * value_tokens, d, width, e),
                Op("depthwise conv", "cuda", 2.0 * b * patches * width * k * k, (2 * b * patches * width) * o)]
    if prefix == "pool":
        ops.append(Op("prefix pool", "cuda", 2.0 * b * p * t * width, (b * t * width + p * t * width) * o))
    elif prefix == "mean":
        ops += [_memory("patch mean", b * patches * d, o), _gemm("value of mean", b, d, width, e)]
    elif prefix == "attend":
        ops += [_gemm("prefix q", b * p, d, width, e), _gemm("k", b * t, d, width, e),
                Op("prefix attention", "cuda", 8.0 * b * p * t * width, 3 * b * t * width * o)]
    if kept:
        ops += [_gemm("kept qkv", b * t, d, 3 * kept * hd, e), *_attention_core(b, kept, t, hd, hd, precision)]
    if p or kept:
        ops.append(_memory("concat", 2 * b * t * (width + kept * hd), o))
    return ops + [_gemm("proj", b * t, kept * hd + width, d, e, residual)]


def op_seconds(op: Op, mode: PowerMode, precision: str, efficiency: Efficiency) -> float:
    """One kernel's time: the slower of its compute and its memory traffic, plus a launch."""
    peak = mode.tensor_peak(precision) if op.unit == "tensor" else mode.cuda_peak(precision)
    compute = op.flops / (peak * efficiency.compute)
    memory = op.bytes / (mode.bandwidth * efficiency.memory)
    return max(compute, memory) + efficiency.launch_us * 1e-6


def part_ms(part: Part, mode: PowerMode, precision: str, batch: int, efficiency: Efficiency) -> float:
    return 1e3 * sum(op_seconds(op, mode, precision, efficiency) for op in part_ops(part, batch, precision))


def power_mode(name: str) -> PowerMode:
    try:
        return MODES[name]
    except KeyError:
        raise EdgeError(f"power mode {name!r} of the Orin Nano estimator", expected=f"one of {', '.join(MODES)}",
                        fix="measure a table on the device in that mode (edge deploy --latency-table "
                            "--power-mode NAME)") from None


def target(mode: str, precision: str, batch: int) -> Target:
    return Target(BACKEND, DEVICE, precision, batch, None, power_mode(mode).name)


def estimate_table(parts: list[Part], mode: str, precision: str = "fp16", batch: int = 1,
                   efficiency: Efficiency | None = None) -> LatencyTable:
    """The estimated latency of each part as a table (overhead: one launch for the input copy)."""
    efficiency = efficiency or CALIBRATED
    pm = power_mode(mode)
    if precision not in PRECISIONS:
        raise EdgeError(f"precision {precision!r}", expected=f"one of {', '.join(PRECISIONS)}")
    overhead = efficiency.launch_us * 1e-3
    medians = {p: {"median_ms": overhead + part_ms(p, pm, precision, batch, efficiency)} for p in parts
               if p.kind != "overhead"}
    if parts:
        medians[overhead_part(parts[0].dim, parts[0].tokens)] = {"median_ms": overhead}
    return LatencyTable.from_medians(target(mode, precision, batch), medians, source={
        "estimator": "edge.latency.orin (roofline per kernel)", "efficiency": efficiency.__dict__,
        "calibration": [p.name for p in PUBLISHED if p.calibrate]}, clock="estimate, not measured")


# ---- published figures and the fit -----------------------------------------------------------

def vit_parts(*, dim: int, depth: int, heads: int, hidden: int, patch: int, size: int, prefix: int = 1,
              classes: int = 1000, ls: int = 0, pool: str = "token", dwconv_blocks: int = 0,
              in_chans: int = 3) -> list[Part]:
    """The parts of a plain ViT (``dwconv_blocks`` of its blocks with every head a depthwise conv, no prefix)."""
    grid = size // patch
    t = grid * grid + prefix
    embed = Part.make("embed", dim, t, in_chans=in_chans, height=size, width=size, patch_h=patch, patch_w=patch,
                      prefix=prefix, pos="all", norm_pre=0)
    attention = Part.make("attention", dim, t, heads=heads, qk=dim // heads, v=dim // heads, qkv_bias=1, proj_bias=1,
                          ls=ls)
    dwconv = Part.make("dwconv", dim, t, width=dim, k=3, dense=0, kept=0, head_dim=dim // heads,
                       prefix="none" if not prefix else "pool", prefix_tokens=prefix, rows=grid, cols=grid,
                       qkv_bias=1, ls=ls)
    mlp = Part.make("mlp", dim, t, hidden=hidden, bias=1, scaled=0, ls=ls)
    head = Part.make("head", dim, t, pool=pool, prefix=prefix, norm=1, fc_norm=0, classes=classes)
    blocks = [*([dwconv, mlp] * dwconv_blocks), *([attention, mlp] * (depth - dwconv_blocks))]
    return [embed, *blocks, head]


@dataclass(frozen=True)
class Published:
    """A published Orin Nano 8GB latency: the model, the settings, the figure and where it was published."""

    name: str
    parts: tuple[Part, ...]
    mode: str | None        # None: not stated
    precision: str | None   # None: not stated
    batch: int
    ms: float
    source: str
    note: str = ""
    calibrate: bool = False

    @property
    def settings_known(self) -> bool:
        return self.mode is not None and self.precision is not None


_SUPER_BLOG = "https://developer.nvidia.com/blog/nvidia-jetson-orin-nano-developer-kit-gets-a-super-boost/"
_SUPER_NOTE = ("NVIDIA's Super announcement (FPS; precision and batch not stated there: taken as TensorRT fp16, "
               "batch 1)")
_DW_PAPER = ("Scribano et al., Accelerating Vision Foundation Models with Drop-in Depthwise Convolution, Table 2 "
             "(code: https://github.com/cscribano/DWConv_VFM); TensorRT on Orin Nano, batch 1, 336x336, [CLS] "
             "removed; precision and power mode not stated")


def _vit_b(**options: Any) -> tuple[Part, ...]:
    return tuple(vit_parts(dim=768, depth=12, heads=12, hidden=3072, **options))


def _vit_l(**options: Any) -> tuple[Part, ...]:
    return tuple(vit_parts(dim=1024, depth=24, heads=16, hidden=4096, **options))


PUBLISHED = (
    Published("ViT-B/16 224 (vit-base-patch16-224)", _vit_b(patch=16, size=224),
              "MAXN_SUPER", "fp16", 1, 1000 / 158, _SUPER_BLOG, _SUPER_NOTE + "; 158 FPS", calibrate=True),
    Published("ViT-B/16 224 (vit-base-patch16-224)", _vit_b(patch=16, size=224),
              "original", "fp16", 1, 1000 / 98, _SUPER_BLOG, _SUPER_NOTE + "; 98 FPS", calibrate=True),
    Published("DINOv2-B/14 224", _vit_b(patch=14, size=224, ls=1, classes=0),
              "MAXN_SUPER", "fp16", 1, 1000 / 126, _SUPER_BLOG, _SUPER_NOTE + "; 126 FPS", calibrate=True),
    Published("DINOv2-B/14 224", _vit_b(patch=14, size=224, ls=1, classes=0),
              "original", "fp16", 1, 1000 / 75, _SUPER_BLOG, _SUPER_NOTE + "; 75 FPS (held out of the fit)"),
    Published("DINOv2 ViT-B/14 336 (no [CLS])", _vit_b(patch=14, size=336, prefix=0, ls=1, classes=0,
                                                       pool="avg"),
              None, None, 1, 49.9, _DW_PAPER, "CB1"),
    Published("DINOv2 ViT-B/14 336, 6/12 blocks depthwise", _vit_b(
        patch=14, size=336, prefix=0, ls=1, classes=0, pool="avg", dwconv_blocks=6),
              None, None, 1, 40.8, _DW_PAPER, "CB2"),
    Published("DINOv2 ViT-L/14 336 (no [CLS])", _vit_l(patch=14, size=336, prefix=0, ls=1, classes=0,
                                                       pool="avg"),
              None, None, 1, 161.4, _DW_PAPER, "CL1"),
    Published("DINOv2 ViT-L/14 336, 12/24 blocks depthwise", _vit_l(
        patch=14, size=336, prefix=0, ls=1, classes=0, pool="avg", dwconv_blocks=12),
              None, None, 1, 133.6, _DW_PAPER, "CL3"),
)


def estimate_ms(parts: tuple[Part, ...] | list[Part], mode: str, precision: str, batch: int,
                efficiency: Efficiency) -> float:
    pm = power_mode(mode)
    return efficiency.launch_us * 1e-3 + sum(part_ms(p, pm, precision, batch, efficiency) for p in parts)


def _terms(point: Published, mode: str, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel: compute seconds and memory seconds at full efficiency, and the kernel count."""
    pm = power_mode(mode)
    compute, memory = [], []
    for part in point.parts:
        for op in part_ops(part, point.batch, precision):
            peak = pm.tensor_peak(precision) if op.unit == "tensor" else pm.cuda_peak(precision)
            compute.append(op.flops / peak)
            memory.append(op.bytes / pm.bandwidth)
    return np.asarray(compute), np.asarray(memory)


def calibrate(points: tuple[Published, ...] | None = None, launch_us: float = LAUNCH_US) -> Efficiency:
    """The efficiencies that minimise the squared log error over ``points`` (default: those marked calibrate),
    on a grid of 0.005 steps in (0, 1]."""
    points = tuple(p for p in PUBLISHED if p.calibrate) if points is None else points
    if not points or not all(p.settings_known for p in points):
        raise EdgeError("calibration points without a stated power mode and precision",
                        expected="published figures with their settings")
    grid = np.arange(0.005, 1.0001, 0.005)
    error = np.zeros((grid.size, grid.size))
    for point in points:
        assert point.mode is not None and point.precision is not None
        compute, memory = _terms(point, point.mode, point.precision)
        # seconds[i, j] = sum over kernels of max(compute / e_c[i], memory / e_m[j]) + launches
        seconds = np.maximum(compute[None, None, :] / grid[:, None, None], memory[None, None, :] / grid[None, :, None])
        total = seconds.sum(axis=2) + (compute.size + 1) * launch_us * 1e-6
        error += np.log(total * 1e3 / point.ms) ** 2
    i, j = np.unravel_index(int(np.argmin(error)), error.shape)
    return Efficiency(round(float(grid[i]), 3), round(float(grid[j]), 3), launch_us)


#: :func:`calibrate` on the points marked ``calibrate`` (a test checks this stays its result)
CALIBRATED = Efficiency(compute=0.375, memory=0.47, launch_us=LAUNCH_US)


def report(efficiency: Efficiency | None = None) -> list[dict]:
    """Each published figure against the estimate (settings not stated: every mode and precision the
    figure could have been taken in), and for the calibration points their leave-one-out estimate."""
    efficiency = efficiency or CALIBRATED
    rows = []
    fitted = [p for p in PUBLISHED if p.calibrate or (p.settings_known and p.source == _SUPER_BLOG)]
    for point in PUBLISHED:
        row = {"name": point.name, "published_ms": point.ms, "mode": point.mode, "precision": point.precision,
               "batch": point.batch, "source": point.source, "note": point.note, "calibrated_on": point.calibrate}
        if point.settings_known:
            assert point.mode is not None and point.precision is not None
            estimate = estimate_ms(point.parts, point.mode, point.precision, point.batch, efficiency)
            row.update(estimate_ms=estimate, error=estimate / point.ms - 1)
            others = tuple(p for p in fitted if p is not point)
            held_out = calibrate(others, efficiency.launch_us)
            loo = estimate_ms(point.parts, point.mode, point.precision, point.batch, held_out)
            row.update(leave_one_out={"efficiency": held_out.__dict__, "estimate_ms": loo, "error": loo / point.ms - 1})
        else:
            row["estimates_ms"] = {f"{mode} {precision}": estimate_ms(point.parts, mode, precision, point.batch,
                                                                      efficiency)
                                   for mode in ("original", "MAXN_SUPER") for precision in ("fp16", "fp32")}
        rows.append(row)
    return rows


#: published speedups of depthwise blocks over the same model (the estimate's relative figures, which no
#: absolute setting can fit: a check of the parts' relative costs)
SPEEDUPS = (("DINOv2 ViT-B/14 336 (no [CLS])", "DINOv2 ViT-B/14 336, 6/12 blocks depthwise"),
            ("DINOv2 ViT-L/14 336 (no [CLS])", "DINOv2 ViT-L/14 336, 12/24 blocks depthwise"))


def speedups(efficiency: Efficiency | None = None) -> list[dict]:
    """Published vs estimated latency saved by depthwise blocks (1 - compressed / original), per setting."""
    efficiency = efficiency or CALIBRATED
    by_name = {p.name: p for p in PUBLISHED}
    rows = []
    for base, compressed in SPEEDUPS:
        a, b = by_name[base], by_name[compressed]
        estimated = {f"{mode} {precision}": 1 - estimate_ms(b.parts, mode, precision, 1, efficiency)
                     / estimate_ms(a.parts, mode, precision, 1, efficiency)
                     for mode in ("original", "MAXN_SUPER") for precision in ("fp16", "fp32")}
        rows.append({"original": base, "compressed": compressed, "published_saving": 1 - b.ms / a.ms,
                     "estimated_saving": estimated, "source": a.source})
    return rows
