"""Width compression (SKD's WPAC): the plan step, the aligned widths and the narrower attention module.

A ``wpac`` step keeps a fraction of every attention head's dimensions and of the MLP's hidden
units in each of its blocks, after ordering them by a criterion (:mod:`edge.compress.methods.wpac.statistics`):

    wpac:keep=0.5                      half of the Q/K and V head dims and of the MLP width
    wpac:qk=0.5:v=0.75:mlp=0.5         per part (``keep`` is the default of the parts not named)
    wpac:keep=0.5:align=16:mlp_align=64:criterion=wpac:blocks=0+1+2
    wpac:macs=0.6                      60 % of the model's MACs, the units ranked on the images

``keep=1`` truncates nothing: the rotated model computes the same function as the original.
``macs=F`` (0 < F <= 1) ranks the aligned units of every part on the calibration images
(:mod:`edge.compress.methods.wpac.importance`, PIAD's importance without training) and drops the lowest until
the MACs are at most ``F`` of the model's (attention products counted); the artifact keeps the
rest of that order (its ``supernet`` record), so ``macs=1`` makes a super-network of WPAC alone.
On an artifact that carries such a record (``macs=`` or ``edge finetune --piad``), ``edge
compress ARTIFACT --plan wpac:macs=F`` cuts a sub-network from the record without data
(:mod:`edge.compress.methods.wpac.extract`), and ``wpac:latency-ms=X:table=FILE`` the largest one whose latency
predicted from a latency table (``edge profile MODEL --latency-table FILE --grid full``) is at most
``X`` ms.

Widths are multiples of an alignment: ``align`` (default 16) for the head dims, ``mlp_align``
(default 64) for the MLP width. A kept width is ``keep x width`` rounded to the nearest multiple
(never above the original, never below one unit). Why: the narrowed layers run as matrix
products whose sizes are these widths, and Tensor Cores multiply fixed tiles. NVIDIA's "Matrix
Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/performance/
dl-performance-matrix-multiplication, sections "Tensor Core Requirements" and "Tile
Quantization") says performance is better when M, N and K are multiples of 16 bytes (128 bytes
on A100, an Ampere GPU like Orin's), a hard requirement for Tensor Cores in cuBLAS before 11.0,
and that a size just past a tile boundary pays for a whole extra tile. One Ampere ``mma.sync``
instruction is m16n8k16 for FP16 and m16n8k32 for INT8 (PTX ISA). A head dim of 16 elements is
32 bytes in FP16 and 16 bytes in INT8, one MMA K-step in FP16: the smallest unit that keeps both
precisions aligned, fine enough to cut a 64-wide head in quarters. The MLP width, the largest
products of a block, is kept at 64 elements = 128 bytes in FP16, the A100/Ampere figure.

Criteria (``criterion=``) order the dims before truncation: ``wpac`` (Taylor-weighted PCA
rotation of Q/K jointly and of V per head; MLP units by Taylor importance), ``taylor``
(first-order Taylor ``|grad x activation|`` per dim, no rotation), ``magnitude`` (L1 norm of each
dim's weights) and ``random`` (a seeded permutation, ``seed=S``).

:class:`NarrowAttention` stands at ``blocks[i].attn``: one ``qkv`` Linear producing per head a
``qk_dim``-wide query and key and a ``v_dim``-wide value, softmax attention scaled by the
ORIGINAL head dim (``scale`` is kept, so a truncated head approximates the original scores, not
a rescaled version of them), and a ``proj`` Linear from ``heads x v_dim``. It exports as plain
MatMuls of those sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import nn
from torch.nn import functional as F

from edge.compress.cost import linear_flops
from edge.compress.options import format_options, option_defaults, plan_option
from edge.errors import EdgeError

WPAC = "wpac"
Criterion = Literal["wpac", "taylor", "magnitude", "random"]
CRITERIA: tuple[str, ...] = get_args(Criterion)
PARTS = ("qk", "v", "mlp")


@dataclass(frozen=True)
class WpacOptions:
    """The options of a ``wpac`` step (``wpac:qk=0.5:v=0.75:mlp=0.5:blocks=0+1``); ``qk``, ``v`` and ``mlp``
    default to ``keep``; ``macs`` and ``latency-ms`` + ``table`` stand alone."""

    keep: float = plan_option(1.0, above=0, maximum=1)                   # kept fraction of every part
    qk: float | None = plan_option(None, above=0, maximum=1)             # of the Q/K head dims
    v: float | None = plan_option(None, above=0, maximum=1)              # of the V head dims
    mlp: float | None = plan_option(None, above=0, maximum=1)            # of the MLP width
    macs: float | None = plan_option(None, above=0, maximum=1)           # fraction of the model's MACs kept
    latency_ms: float | None = plan_option(None, key="latency-ms", above=0, maximum=1e9)  # budget by a table
    table: str | None = plan_option(None, metavar="FILE")                 # the latency table of latency-ms
    align: int = plan_option(16, minimum=1)                               # head dims: multiples of align
    mlp_align: int = plan_option(64, minimum=1)                           # MLP width: multiples of mlp_align
    criterion: Criterion = plan_option("wpac")                            # how dims are ordered before truncation
    seed: int = plan_option(0, minimum=0)                                 # criterion=random
    blocks: str | None = plan_option(None, metavar="0+1+2")               # the blocks narrowed (default: all)
USAGE = ("wpac:keep=0.5, wpac:qk=0.5:v=0.75:mlp=0.5 or wpac:macs=0.6 (align=16, mlp_align=64, criterion=wpac, "
         "blocks=0+1)")


@dataclass(frozen=True)
class WpacStep:
    """Keep fractions of the head dims (``qk``, ``v``) and MLP width of ``blocks`` (empty: every block)."""

    blocks: tuple[int, ...] = ()
    options: dict = field(default_factory=dict, hash=False)

    @property
    def is_resolved(self) -> bool:
        return True

    def option(self, key: str):
        """The option's value, or its default (a part's default is ``keep``)."""
        if key in PARTS:
            return self.options.get(key, self.option("keep"))
        return self.options.get(key, option_defaults(WpacOptions)[key])

    @property
    def macs(self) -> float | None:
        """The MAC fraction of a ``macs=`` step (its parts are built whole, then ranked and cut), else None."""
        return self.options.get("macs")

    @property
    def latency_ms(self) -> float | None:
        """The latency budget of a ``latency-ms=X:table=FILE`` step (a cut from a super-network), else None."""
        return self.options.get("latency-ms")

    def keep(self) -> dict[str, float]:
        """The kept fraction of each part: ``{"qk": ..., "v": ..., "mlp": ...}``."""
        return {part: float(self.option(part)) for part in PARTS}

    def __str__(self) -> str:
        options = dict(self.options)
        if self.blocks:
            options["blocks"] = "+".join(map(str, self.blocks))
        return f"{WPAC}{format_options(options)}"


def aligned_width(width: int, keep: float, align: int, what: str) -> int:
    """``keep x width`` rounded to the nearest multiple of ``align``, at most ``width``; ``width`` for keep 1.

    Refuses an alignment larger than the width and a target below one alignment unit (``what``
    names the width in the message, e.g. ``"blocks[3] head dim"``).
    """
    if keep >= 1.0:
        return width
    if align > width:
        raise EdgeError(f"{what} is {width}, smaller than the alignment {align}",
                        expected=f"an alignment <= {width}", fix=f"use align={_largest_divisor_unit(width)} or less")
    target = keep * width
    if target < align:
        raise EdgeError(f"{what}: keeping {keep:g} of {width} is {target:g}, below one alignment unit of {align}",
                        expected=f"a kept width >= {align} (keep >= {align / width:.4g})",
                        fix="raise the keep fraction or lower the alignment")
    units = min(int(target / align + 0.5), width // align)
    return units * align


def _largest_divisor_unit(width: int) -> int:
    """The largest power of two that divides ``width`` (a sensible alignment to suggest)."""
    return width & -width


class NarrowAttention(nn.Module):
    """Multi-head self-attention with per-head Q/K width ``qk_dim`` and V width ``v_dim`` (may differ).

    ``scale`` is the original model's ``head_dim ** -0.5``, kept through truncation.
    """

    def __init__(self, dim: int, num_heads: int, qk_dim: int, v_dim: int, scale: float, *,
                 qkv_bias: bool = True, proj_bias: bool = True, index: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk_dim = qk_dim
        self.v_dim = v_dim
        self.attn_dim = num_heads * v_dim
        self.scale = float(scale)
        self.fused_attn = True     # edge.models.attention.explicit_attention switches it off for export and counting
        self.qkv = nn.Linear(dim, num_heads * (2 * qk_dim + v_dim), bias=qkv_bias)
        self.proj = nn.Linear(self.attn_dim, dim, bias=proj_bias)
        self.index = index

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        B, N, _ = x.shape
        H, dq, dv = self.num_heads, self.qk_dim, self.v_dim
        q, k, v = self.qkv(x).split([H * dq, H * dq, H * dv], dim=-1)
        q = q.reshape(B, N, H, dq).transpose(1, 2)
        k = k.reshape(B, N, H, dq).transpose(1, 2)
        v = v.reshape(B, N, H, dv).transpose(1, 2)
        if self.fused_attn or attn_mask is not None or is_causal:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, self.attn_dim))

    def flops(self, tokens: int) -> int:
        """The projections and both attention products (``q k^T``: ``qk_dim``, ``attn v``: ``v_dim`` per head)."""
        return linear_flops(self, tokens) + 2 * tokens * tokens * self.num_heads * (self.qk_dim + self.v_dim)

    def record(self) -> dict:
        return {"heads": self.num_heads, "qk": self.qk_dim, "v": self.v_dim, "scale": self.scale,
                "qkv_bias": self.qkv.bias is not None, "proj_bias": self.proj.bias is not None}

    @classmethod
    def from_record(cls, dim: int, record: dict, index: int | None = None) -> NarrowAttention:
        return cls(dim, int(record["heads"]), int(record["qk"]), int(record["v"]), float(record["scale"]),
                   qkv_bias=bool(record["qkv_bias"]), proj_bias=bool(record["proj_bias"]), index=index)

    def extra_repr(self) -> str:
        return f"index={self.index}, heads={self.num_heads}, qk_dim={self.qk_dim}, v_dim={self.v_dim}, " \
               f"scale={self.scale:.6g}"
