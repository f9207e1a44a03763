"""The peers of an edge model: Torch-Pruning (uniform, global) at a ratio, token merging at a merge count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from _peers_names import slug
from _peers_pruning import PruneConfig, prune
from tome import apply_tome, token_counts
from torch import nn

from edge.compress.load import load_model

FAMILIES = ("edge", "torch-pruning uniform", "torch-pruning global", "tome")


@dataclass
class Candidate:
    """One peer model: its family, parameter (ratio or r) and how to build it from the original."""

    family: str
    parameter: float
    build: Callable[[], tuple[nn.Module, dict]]

    @property
    def key(self) -> str:
        p = int(self.parameter) if self.family == "tome" else f"{self.parameter:.4f}"
        return f"{slug(self.family)}-{p}"

    @property
    def label(self) -> str:
        return f"ToMe r={int(self.parameter)}" if self.family == "tome" else \
            f"Torch-Pruning {self.family.split()[-1]} {100 * self.parameter:.1f} %"


def candidate(family: str, parameter: float, *, model: str, data: str, taylor_batches: int, seed: int,
              taylor: Callable[[], list]) -> Candidate:
    """The peer of ``family`` at ``parameter``, built from the original ``model`` when asked (``taylor``: the
    Taylor batches Torch-Pruning ranks on, made once by the caller)."""
    if family == "tome":
        def build() -> tuple[nn.Module, dict]:
            return apply_tome(load_model(model).eval(), int(parameter)), {"r": int(parameter)}
    else:
        config = PruneConfig(ratio=parameter, global_pruning=family.endswith("global"), data=data,
                             taylor_batches=taylor_batches, seed=seed)

        def build() -> tuple[nn.Module, dict]:
            return prune(load_model(model), config, taylor())
    return Candidate(family, parameter, build)


def tome_rs(model: nn.Module) -> list[int]:
    """Every merge count ``r >= 1`` the model's token count allows in all of its blocks."""
    tokens = model.patch_embed.num_patches + int(getattr(model, "num_prefix_tokens", 1))
    feasible, r = [], 1
    while True:
        try:
            token_counts(tokens, len(model.blocks), r)
        except ValueError:
            return feasible
        feasible.append(r)
        r += 1
