"""Predicted latency of a model: the overhead of one call plus what each of its parts adds.

    predicted = overhead + sum over the model's parts of (part's median - overhead)

The overhead is the identity graph's median (one call's fixed cost, measured once in the same
table); each part's own graph paid it once too, so it is taken off every part and added back once.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from edge.latency.parts import Part, model_parts
from edge.latency.table import LatencyTable, Target


@dataclass(frozen=True)
class Prediction:
    total_ms: float
    overhead_ms: float
    parts: tuple[tuple[Part, float], ...]   # each part and what it adds (net ms), in the model's order
    target: Target

    def to_json(self) -> dict:
        return {"total_ms": self.total_ms, "overhead_ms": self.overhead_ms, "target": self.target.describe(),
                "parts": [{"key": p.key, "net_ms": ms} for p, ms in self.parts]}


def predict_parts(parts: list[Part], table: LatencyTable, target: Target | None = None) -> Prediction:
    """The predicted latency of a model made of ``parts`` (overhead parts among them are ignored).

    ``target``: the target the prediction is for; a table measured on another one is refused.
    """
    if target is not None:
        table.check(target)
    rows = tuple((p, table.entry(p).net_ms) for p in parts if p.kind != "overhead")
    return Prediction(table.overhead_ms + sum(ms for _, ms in rows), table.overhead_ms, rows, table.target)


def predict_model(model: nn.Module, table: LatencyTable, target: Target | None = None) -> Prediction:
    return predict_parts(model_parts(model), table, target)
