"""The shapes TensorRT runs fastest on a Jetson Orin: which parts of a (compressed) model break them.

A plan chosen on a CPU can narrow a head to a size TensorRT's fused multi-head attention kernel does
not take, or a GEMM to a width Tensor Core kernels cannot load aligned; on the device that part then
runs slower than the table said. The rules, each from a stated source:

* ``attention-fusion``: TensorRT fuses MatMul -> Softmax -> MatMul into one attention kernel only
  for a head size H with ``16 <= H <= 256`` and ``H % 8 == 0`` in fp16 (bf16), and H in {16, 32, 64}
  with sequence lengths <= 512 in int8 (TensorRT developer guide, "Multi-Head Attention Fusion",
  quoted in NVIDIA/TensorRT#2981 and #4167; the fp16 range is :data:`edge.check.tensorrt_rules.FUSED_HEAD_SIZE`,
  which ``edge check`` reports on graphs). An fp32 engine has no fused attention kernel: the rule
  does not apply there.
* ``equal-head-sizes``: Q/K and V keep one head size. TensorRT's ``IAttention`` layer takes Q, K and
  V of one shape ``[B, N, S, H]``; whether the pattern fusion takes a V head size other than Q/K's is
  not documented, so a plan keeps them equal (a precaution: the Orin estimator charges nothing for it).
* ``gemm-width``: every GEMM's inner (K) and output (N) widths are multiples of 16. Tensor Core
  kernels load operands in 16-byte vectors, 8 fp16 or 16 int8 elements (NVIDIA's "Matrix
  Multiplication Background User's Guide", Tensor Core requirements); 16 keeps one ONNX graph
  aligned for both the fp16 and the int8 engine a bundle builds from it.

A rule a part breaks is a :class:`Violation` naming the value that breaks it. :func:`new_violations`
keeps those the original model does not already have (a model whose own head size is 12 is not
refused every plan): the planner removes a candidate with any (``edge plan``'s record counts them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edge.errors import EdgeError
from edge.check.tensorrt_rules import FUSED_HEAD_SIZE
from edge.latency.parts import Part

RULES = ("attention-fusion", "equal-head-sizes", "gemm-width")
INT8_FUSED_HEAD_SIZES = (16, 32, 64)
INT8_FUSED_MAX_TOKENS = 512
GEMM_ALIGN = 16
PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True, order=True)
class Violation:
    rule: str
    value: int          # the size that breaks the rule
    part: str           # the part's key
    what: str

    def to_json(self) -> dict:
        return {"rule": self.rule, "value": self.value, "part": self.part, "what": self.what}


def fusion_blocker(head_size: int, tokens: int, precision: str) -> str | None:
    """Why TensorRT runs attention of this head size unfused at ``precision``; None where it fuses it."""
    if precision not in PRECISIONS:
        raise EdgeError(f"precision {precision!r}", expected=f"one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return "fp32 engines have no fused attention kernel"
    if precision == "int8":
        if head_size not in INT8_FUSED_HEAD_SIZES:
            return f"head size {head_size} is not one of int8 fused attention's {INT8_FUSED_HEAD_SIZES}"
        if tokens > INT8_FUSED_MAX_TOKENS:
            return f"{tokens} tokens is more than int8 fused attention's {INT8_FUSED_MAX_TOKENS}"
        return None
    low, high, step = FUSED_HEAD_SIZE
    if not (low <= head_size <= high and head_size % step == 0):
        return f"head size {head_size} is outside fp16 fused attention's multiples of {step} in [{low}, {high}]"
    return None


def gemm_widths(part: Part) -> list[tuple[str, int]]:
    """The K and N widths of the GEMMs a part runs, by name (the token count M is not constrained)."""
    d, kind = part.dim, part.kind
    if kind == "attention":
        h, qk, v = part.size("heads"), part.size("qk"), part.size("v")
        return [("qkv in", d), ("qkv out", h * (2 * qk + v)), ("proj in", h * v), ("proj out", d)]
    if kind == "mlp":
        hidden = part.size("hidden")
        return [("fc1 in", d), ("fc1 out", hidden), ("fc2 in", hidden), ("fc2 out", d)]
    if kind in ("attn_map", "span"):
        return [("map", d)]
    if kind == "dwconv":
        width, kept, hd = part.size("width"), part.size("kept"), part.size("head_dim")
        widths = [("value out", width), ("proj in", width + kept * hd), ("proj out", d)]
        return widths + ([("kept qkv out", 3 * kept * hd)] if kept else [])
    if kind == "head":
        return [("head in", d), ("classes", part.size("classes"))] if part.size("classes") else []
    return [("embed out", d)] if kind == "embed" else []


def _attention_heads(part: Part) -> list[tuple[int, int]]:
    """(Q/K head size, V head size) of each attention a part runs."""
    if part.kind == "attention":
        return [(part.size("qk"), part.size("v"))]
    if part.kind == "dwconv" and part.size("kept"):
        return [(part.size("head_dim"), part.size("head_dim"))]
    return []


def part_violations(part: Part, precision: str) -> list[Violation]:
    """Every rule ``part`` breaks in an engine of ``precision`` (module notes)."""
    found = []
    for qk, v in _attention_heads(part):
        if precision != "fp32":
            for size in sorted({qk, v}):
                reason = fusion_blocker(size, part.tokens, precision)
                if reason:
                    found.append(Violation("attention-fusion", size, part.key, reason))
            if qk != v:
                found.append(Violation("equal-head-sizes", v, part.key,
                                       f"Q/K head size {qk} and V head size {v} differ"))
    misaligned: dict[int, list[str]] = {}
    for name, width in gemm_widths(part):
        if width % GEMM_ALIGN:
            misaligned.setdefault(width, []).append(name)
    for width, names in misaligned.items():
        found.append(Violation("gemm-width", width, part.key,
                               f"{' and '.join(names)} width {width} is not a multiple of {GEMM_ALIGN}"))
    return found


def violations(parts: Iterable[Part], precision: str) -> list[Violation]:
    return sorted({v for p in parts for v in part_violations(p, precision)})


def new_violations(parts: Iterable[Part], original: Iterable[Part], precision: str) -> list[Violation]:
    """The rules ``parts`` break with a value the original's parts do not already break them with."""
    known = {(v.rule, v.value) for v in violations(original, precision)}
    return [v for v in violations(parts, precision) if (v.rule, v.value) not in known]
