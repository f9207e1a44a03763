"""Cut a sub-network from a super-network artifact: ``edge compress SUPERNET --plan wpac:macs=F``.

A super-network is an artifact whose manifest carries a ``supernet`` record
(:mod:`edge.compress.methods.wpac.supernet`): a wpac model at its widths plus the order in which
its aligned units go (``edge compress MODEL --plan wpac:macs=1`` ranks them once, ``edge finetune
--piad`` trains them). Extraction drops that order's entries until the MACs are at most ``F`` of
the artifact's own, slices the weights, and writes an ordinary wpac artifact: no data, no
training, seconds. Its manifest records the extraction (``extracted``) and keeps the rest of the
order, so it is a super-network itself (a sub-network of it equals one cut deeper from the
original).

``wpac:latency-ms=X:table=FILE`` walks the same order and keeps the first sub-network whose
latency a predictor puts at ``X`` ms or less: ``predict(model) -> ms``, which the CLI builds from
the latency table (:mod:`edge.latency`, a layer above this one: the predictor is passed in).

The artifact is read and written by :mod:`edge.compress.derive` (``derive_model``), which reaches
this module through the method's ``derives`` / ``check_derivation`` / ``derive`` hooks.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from edge.compress.cost import analytic_flops
from edge.compress.methods.wpac.build import cut_widths
from edge.compress.methods.wpac.module import WpacStep
from edge.compress.methods.wpac.supernet import (
    Part,
    Selection,
    check_record,
    dropped_flops,
    remaining_record,
    select,
    widths_after,
)
from edge.errors import EdgeError, InternalError

Predictor = Callable[[nn.Module], float]
REQUESTS = "wpac:macs=F alone (0 < F <= 1 of the artifact's MACs), or wpac:latency-ms=X:table=FILE"


def is_extraction(step: WpacStep) -> bool:
    """Whether ``step`` asks for a sub-network (``wpac:macs=F`` or ``wpac:latency-ms=X:table=FILE``)."""
    return step.macs is not None or step.latency_ms is not None


def check_request(step: WpacStep, request: str, manifest: dict, where: str, predict: Predictor | None) -> dict:
    """Refuse, before the weights load, a request the artifact at ``where`` cannot answer; its super-network record."""
    if step.blocks or set(step.options) not in ({"macs"}, {"latency-ms", "table"}):
        raise EdgeError(f"--plan {request} on the artifact {where}: a compressed model takes only a sub-network "
                        f"plan", expected=f"--plan {REQUESTS}",
                        fix="ask for wpac:macs=F, or compress the original model with the other plan")
    if step.latency_ms is not None and predict is None:
        raise EdgeError(f"--plan {request} needs a latency predictor", expected="predict=model -> ms "
                        "(edge compress builds it from the table with edge.latency.predict_model)",
                        fix="run it through `edge compress`, or pass predict=")
    return check_record(manifest.get("supernet"), where)


def select_by_latency(model: nn.Module, record: dict, budget_ms: float, predict: Predictor,
                      where: str) -> tuple[Selection, dict]:
    """Cut ``model`` (in place) along the order until ``predict(model) <= budget_ms``; the selection and figures.

    The first sub-network of the order within the budget is kept (the largest, as for MACs); a
    budget below every sub-network's prediction is refused, naming the smallest one's.
    """
    parts = {p.name: p for p in map(Part.from_dict, record["parts"])}
    order, full = list(record["order"]), int(record["flops"])
    widths = {name: part.width for name, part in parts.items()}
    predicted = [float(predict(model))]
    while predicted[-1] > budget_ms and len(predicted) <= len(order):
        widths = widths_after(parts, [order[len(predicted) - 1]], widths)
        cut_widths(model, widths)
        predicted.append(float(predict(model)))
    drops = len(predicted) - 1
    if predicted[-1] > budget_ms:
        raise EdgeError(f"latency-ms={budget_ms:g} is below the smallest sub-network of {where}: every droppable "
                        f"unit dropped is predicted at {predicted[-1]:.4g} ms", expected=f"latency-ms >= "
                        f"{predicted[-1]:.4g} (each head-dim and MLP part keeps one aligned unit)",
                        fix="raise the budget, or measure the table on the target you deploy to")
    flops = full - dropped_flops(parts, widths)
    coarser = full - dropped_flops(parts, widths_after(parts, order[:drops - 1])) if drops else None
    smallest = full - dropped_flops(parts, widths_after(parts, order))
    figures = {"budget_ms": budget_ms, "predicted_ms": predicted[-1],
               "coarser_predicted_ms": predicted[-2] if drops else None}
    return Selection(flops / full, drops, widths, flops, full, coarser, smallest), figures



def cut_subnetwork(model: nn.Module, record: dict, step: WpacStep, where: str, *, predict: Predictor | None = None,
                   predictor: dict | None = None) -> tuple[Selection, dict | None]:
    """Cut ``model`` (in place) to the sub-network ``step`` asks of its super-network ``record``.

    ``wpac:macs=F``: at most ``F`` of its MACs. ``wpac:latency-ms=X:table=FILE``: at most ``X`` ms by
    ``predict`` (``predictor`` describes it for the manifest: the table, its target). Returns the
    selection and the latency figures (None for a MAC cut).
    """
    flops = analytic_flops(model)
    if flops != int(record["flops"]):
        raise EdgeError(f"{where}'s sub-network record counts {record['flops']:,} FLOPs, its model "
                        f"{flops:,}", fix="re-create the super-network (the record does not belong to these weights)")
    latency = None
    if step.latency_ms is not None and predict is not None:
        chosen, latency = select_by_latency(model, record, float(step.latency_ms), predict, where)
        latency["predictor"] = predictor or {}
    else:
        chosen = select(record, float(step.options["macs"]), where)
        cut_widths(model, chosen.widths)
    if analytic_flops(model) != chosen.flops:
        raise InternalError(f"the cut model counts {analytic_flops(model):,} FLOPs, the record {chosen.flops:,}")
    return chosen, latency


def extraction_record(chosen: Selection, record: dict, manifest: dict, where: str, latency: dict | None) -> dict:
    """The manifest's ``extracted`` entry: where the sub-network came from and what was cut."""
    return {"from": where, "plan": manifest.get("plan"), "fraction": chosen.fraction,
            "flops": chosen.flops, "full_flops": chosen.full_flops, "coarser_flops": chosen.coarser_flops,
            "smallest_flops": chosen.smallest_flops, "drops": chosen.drops, "ranked_by": record.get("by"),
            "trained": chosen.drops <= int(record.get("trained", 0)) if record.get("by") == "piad" else None,
            "widths": chosen.widths, **({"latency": latency} if latency else {})}


def remaining(record: dict, chosen: Selection) -> dict:
    """The super-network record the sub-network keeps (the rest of the order)."""
    return remaining_record(record, chosen, chosen.flops)


__all__ = ["Predictor", "check_request", "cut_subnetwork", "extraction_record", "is_extraction", "remaining",
           "select_by_latency"]
