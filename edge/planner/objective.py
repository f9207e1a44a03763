"""What ``edge plan`` minimises: the latency of a plan at one batch, or a weighted mix of batches.

A user who serves batch 1 and batch 32 wants the plan that is fast at both. With one latency table
per batch (each measured or estimated on the target at that batch) and weights ``w_b`` (normalised to
sum to 1), a plan's cost is the weighted sum of its latency ratios to the original's:

    share(plan) = sum_b w_b * ms_b(plan) / ms_b(original)

Why the weighted sum and not the largest ratio: with ``w_b`` the share of the device's time the
original spends at batch ``b``, the sum is exactly the plan's share of the total time (what a server
that runs both pays), and each batch's saving counts. The largest ratio would give no credit for a
move that speeds up one batch only, so a greedy walk can stall on it; the ratios at every batch are
in the record (``batch_ms``) for a user who needs each batch within the budget.

To keep one unit everywhere (a budget share, KL per ms saved, the Pareto plot), the cost is expressed
in milliseconds: ``share(plan) x sum_b w_b ms_b(original)``, the original's weighted mean latency
times the plan's share. With one batch that is the plan's predicted latency itself. An absolute
budget (``--budget-ms``) has no meaning across batches and is refused there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from edge.config import MAX_BATCH
from edge.errors import EdgeError
from edge.latency import LatencyTable, predict_model


@dataclass(frozen=True)
class LatencyMix:
    """One latency table per batch and the weight of each; :meth:`predict` is a plan's cost (module notes)."""

    tables: tuple[LatencyTable, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.tables:
            raise EdgeError("no latency table to plan with", expected="one table per batch")
        batches = [t.target.batch for t in self.tables]
        if len(set(batches)) != len(batches):
            raise EdgeError(f"two latency tables of one batch ({', '.join(map(str, batches))})",
                            expected="one table per batch", fix="pass each batch's table once")
        check_weights(self.weights, len(self.tables))

    @classmethod
    def single(cls, table: LatencyTable) -> LatencyMix:
        return cls((table,), (1.0,))

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(t.target.batch for t in self.tables)

    @property
    def shares(self) -> tuple[float, ...]:
        total = sum(self.weights)
        return tuple(w / total for w in self.weights)

    @property
    def target(self):
        """The first table's target (the one a single-batch plan is for)."""
        return self.tables[0].target

    def describe(self) -> str:
        if len(self.tables) == 1:
            return self.target.describe()
        mix = " + ".join(f"{s:.3g} x batch {b}" for b, s in zip(self.batches, self.shares))
        return f"{self.target.describe().rsplit(', batch', 1)[0]}; cost {mix} (latency ratios to the original)"

    def batch_ms(self, model: nn.Module) -> tuple[tuple[int, float], ...]:
        """The predicted latency of ``model`` at each batch."""
        return tuple((t.target.batch, predict_model(model, t).total_ms) for t in self.tables)

    def cost(self, batch_ms: tuple[tuple[int, float], ...], original: tuple[tuple[int, float], ...]) -> float:
        """The cost in ms (module notes) of a plan whose latency at each batch is ``batch_ms``."""
        if len(self.tables) == 1:
            return batch_ms[0][1]
        base = dict(original)
        reference = sum(s * base[b] for b, s in zip(self.batches, self.shares))
        return reference * sum(s * ms / base[b] for (b, ms), s in zip(batch_ms, self.shares))


def check_weights(weights: tuple[float, ...], count: int) -> None:
    if len(weights) != count:
        raise EdgeError(f"{len(weights)} batch weights for {count} batches",
                        expected="one weight per batch, in the order of --batch",
                        fix="e.g. --batch 1,32 --batch-weights 0.5,0.5, or leave the weights out (equal)")
    bad = [w for w in weights if not (math.isfinite(w) and w > 0)]
    if bad:
        raise EdgeError(f"batch weight {bad[0]!r}", expected="positive finite numbers (they are normalised to "
                        "sum to 1)", fix="e.g. --batch-weights 0.5,0.5")


def check_budget(budget_ms: float | None, batches: tuple[int, ...]) -> None:
    """An absolute budget has no meaning across batches (module notes)."""
    if budget_ms is not None and len(batches) > 1:
        raise EdgeError(f"--budget-ms {budget_ms:g} with several batches ({', '.join(map(str, batches))})",
                        expected="a share of the original's latency (--budget 0.5x): a plan's cost over several "
                                 "batches is a weighted share of their latencies",
                        fix="pass --budget Fx, or one --batch")


def parse_batches(text: str) -> tuple[int, ...]:
    """``"1,32"`` -> (1, 32): distinct batches, each 1 <= batch <= MAX_BATCH."""
    items = [t.strip() for t in text.split(",")]
    try:
        batches = tuple(int(t) for t in items)
    except ValueError:
        raise EdgeError(f"batches {text!r}", expected="comma-separated whole numbers, e.g. 1 or 1,32",
                        fix="pass e.g. --batch 1,32") from None
    bad = [b for b in batches if not 1 <= b <= MAX_BATCH]
    if bad or len(set(batches)) != len(batches):
        raise EdgeError(f"batches {text!r}", expected=f"distinct batches, each 1 <= batch <= {MAX_BATCH}",
                        found=f"{bad[0]}" if bad else "a batch named twice", fix="pass e.g. --batch 1,32")
    return batches


def parse_weights(text: str) -> tuple[float, ...]:
    """``"0.5,0.5"`` -> (0.5, 0.5): positive finite weights (their count is checked against the batches later)."""
    try:
        weights = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise EdgeError(f"batch weights {text!r}", expected="comma-separated numbers, e.g. 0.5,0.5",
                        fix="pass one weight per batch of --batch") from None
    check_weights(weights, len(weights))
    return weights
