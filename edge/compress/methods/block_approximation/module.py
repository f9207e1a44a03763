"""Block approximation (TOAST / RBA): blocks S+1..E of ``model.blocks`` become one module.

:class:`ApproximatedSpan` takes the place of the replaced blocks in ``model.blocks`` (an
``nn.Sequential``), so timm's own ``forward_features`` runs it like any block. It maps the
output of block S to an approximation of the output of block E:

* ``linear`` / ``affine`` / ``identity``: ``y = x W + b`` on every token (one ``nn.Linear``,
  bias for affine), or with ``prefix=own`` a second map for the class/register tokens;
* ``skip``: ``y = x`` (the blocks are removed; the papers' baseline);
* ``mlp`` / ``resmlp``: the papers' trained translators.

The module records which original blocks it replaces (``replaced``), so a compressed model can always be
described in the original model's block indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from edge.analysis.fit import FittedMap
from edge.compress.cost import linear_flops
from edge.compress.options import format_options, option_defaults, plan_option
from edge.errors import InternalError
from edge.models.info import original_block_indices

CLOSED_FORM = ("identity", "linear", "affine")
TRAINED = ("mlp", "resmlp")
SPAN_METHODS = (*CLOSED_FORM, "skip", *TRAINED)
AUTO_METHODS = ("auto-linear", "auto-affine")


@dataclass(frozen=True)
class SpanOptions:
    """The options of a block-approximation step (``affine:9-11:ridge=1e-4``, ``mlp:2-3:steps=500``)."""

    ridge: float = plan_option(0.0, minimum=0)                    # relative ridge term of the closed-form fit
    prefix: Literal["shared", "own"] = plan_option("shared")      # prefix tokens: the patch tokens' map, or their own
    steps: int = plan_option(300, minimum=1)                      # mlp, resmlp: training steps
    lr: float = plan_option(1e-3, above=0)                        # mlp, resmlp: learning rate


@dataclass(frozen=True)
class SpanStep:
    """Replace blocks ``start+1 .. end`` by one map (block indices of the original model)."""

    method: str
    start: int
    end: int
    options: dict = field(default_factory=dict, compare=True, hash=False)

    is_resolved = True

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(range(self.start + 1, self.end + 1))

    def option(self, key: str):
        """The option's value, or its default."""
        return self.options.get(key, option_defaults(SpanOptions)[key])

    @property
    def ridge(self) -> float:
        return float(self.option("ridge"))

    @property
    def prefix(self) -> str:
        return str(self.option("prefix"))

    def __str__(self) -> str:
        return f"{self.method}:{self.start}-{self.end}{format_options(self.options)}"


@dataclass(frozen=True)
class AutoStep:
    """Let the planner choose ``count`` blocks to replace with ``method`` maps."""

    method: str      # linear | affine
    count: int
    options: dict = field(default_factory=dict, hash=False)

    is_resolved = False

    def __str__(self) -> str:
        return f"auto-{self.method}:{self.count}{format_options(self.options)}"


class ResMLPTranslator(nn.Module):
    """TOAST's Res-MLP translator: LN -> (Linear, SiLU, Dropout, Linear) + residual -> LN."""

    def __init__(self, dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or dim
        self.norm_in = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Dropout(0.0), nn.Linear(hidden, dim))
        self.norm_out = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_in(x)
        return self.norm_out(x + self.ff(x))


class MLPTranslator(nn.Module):
    """TOAST's MLP translator: Linear to half the width, GELU, Linear back."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim // 2), nn.GELU(), nn.Linear(dim // 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _linear_from_map(fitted: FittedMap, dtype: torch.dtype = torch.float32) -> nn.Linear:
    dim_in, dim_out = fitted.weight.shape
    layer = nn.Linear(dim_in, dim_out, bias=fitted.bias is not None)
    with torch.no_grad():
        layer.weight.copy_(fitted.weight.T.to(dtype))
        if fitted.bias is not None:
            layer.bias.copy_(fitted.bias.to(dtype))
    return layer


class ApproximatedSpan(nn.Module):
    """Stands in ``model.blocks`` for the original blocks ``replaced`` (a contiguous range)."""

    def __init__(self, method: str, replaced: tuple[int, ...], dim: int, num_prefix_tokens: int = 0,
                 own_prefix_map: bool = False, bias: bool | None = None) -> None:
        super().__init__()
        self.method = method
        self.replaced = tuple(int(b) for b in replaced)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.own_prefix_map = bool(own_prefix_map and num_prefix_tokens)
        bias = (method == "affine") if bias is None else bias
        if method in ("skip", "identity"):
            self.map = nn.Identity()
        elif method in ("linear", "affine"):
            self.map = nn.Linear(dim, dim, bias=bias)
        elif method == "mlp":
            self.map = MLPTranslator(dim)
        elif method == "resmlp":
            self.map = ResMLPTranslator(dim)
        else:
            raise ValueError(f"unknown span method {method!r}")
        self.prefix_map = nn.Linear(dim, dim, bias=bias) if self.own_prefix_map and method in ("linear", "affine") \
            else None

    @classmethod
    def from_fit(cls, replaced: tuple[int, ...], fitted: FittedMap, prefix_fitted: FittedMap | None = None,
                 num_prefix_tokens: int = 0) -> ApproximatedSpan:
        dim = fitted.weight.shape[0]
        span = cls(fitted.method, replaced, dim, num_prefix_tokens, own_prefix_map=prefix_fitted is not None,
                   bias=fitted.bias is not None)
        if fitted.method in ("linear", "affine"):
            span.map = _linear_from_map(fitted)
        if prefix_fitted is not None and span.prefix_map is not None:
            span.prefix_map = _linear_from_map(prefix_fitted)
        return span

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prefix_map is None:
            return self.map(x)
        p = self.num_prefix_tokens
        return torch.cat([self.prefix_map(x[:, :p]), self.map(x[:, p:])], dim=1)

    def flops(self, tokens: int) -> int:
        """FLOPs of its matrix products for one image of ``tokens`` tokens."""
        prefix = self.num_prefix_tokens if self.prefix_map is not None else 0
        total = linear_flops(self.map, tokens - prefix)
        if self.prefix_map is not None:
            total += linear_flops(self.prefix_map, prefix)
        return total

    def extra_repr(self) -> str:
        prefix = ", own prefix map" if self.prefix_map is not None else ""
        return f"method={self.method}, replaces blocks {self.replaced[0]}..{self.replaced[-1]}{prefix}"


def replace_spans(model: nn.Module, spans: dict[tuple[int, ...], nn.Module]) -> nn.Module:
    """Rebuild ``model.blocks`` with each span of original blocks replaced by its module, in place."""
    entries = original_block_indices(model.blocks)
    new_blocks: list[nn.Module] = []
    position = 0
    while position < len(entries):
        first = entries[position][0]
        span = next((key for key in spans if key[0] == first), None)
        if span is None:
            module = model.blocks[position]
            if not isinstance(module, ApproximatedSpan):
                module.edge_original_index = first
            new_blocks.append(module)
            position += 1
            continue
        covered = []
        while position < len(entries) and entries[position][0] <= span[-1]:
            covered.extend(entries[position])
            position += 1
        if tuple(covered) != span:
            raise InternalError(f"span {span} does not line up with the model's current blocks {entries}")
        new_blocks.append(spans[span])
    model.blocks = nn.Sequential(*new_blocks)
    return model
