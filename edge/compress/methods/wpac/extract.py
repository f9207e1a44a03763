"""Cut a sub-network from a super-network artifact: ``edge compress SUPERNET --plan wpac:macs=F``.

A super-network is an artifact whose manifest carries a ``supernet`` record
(:mod:`edge.compress.methods.wpac.supernet`): a wpac model at its widths plus the order in which its aligned
units go (``edge compress MODEL --plan wpac:macs=1`` ranks them once, ``edge finetune --piad``
trains them). Extraction drops that order's entries until the MACs are at most ``F`` of the
artifact's own, slices the weights, and writes an ordinary wpac artifact: no data, no training,
seconds. Its manifest records the extraction (``extracted``) and keeps the rest of the order, so
it is a super-network itself (a sub-network of it equals one cut deeper from the original).

``wpac:latency-ms=X:table=FILE`` walks the same order and keeps the first sub-network whose
latency a predictor puts at ``X`` ms or less: ``predict(model) -> ms``, which the CLI builds from
the latency table (:mod:`edge.latency`, a layer above this one: the predictor is passed in).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from torch import nn

from edge.compress.artifact import load_artifact, read_manifest
from edge.compress.compressor import costs
from edge.compress.methods.wpac.build import cut_widths, wpac_records
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
from edge.compress.plan import parse_plan
from edge.errors import EdgeError, InternalError
from edge.runtime import hardware

Predictor = Callable[[nn.Module], float]


def extraction_step(plan_text: str) -> WpacStep | None:
    """The ``wpac:macs=F`` or ``wpac:latency-ms=X:table=FILE`` step of a plan asking for a sub-network, else None."""
    steps = parse_plan(plan_text).steps
    if len(steps) == 1 and isinstance(steps[0], WpacStep) and \
            (steps[0].macs is not None or steps[0].latency_ms is not None):
        return steps[0]
    return None


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


def extract_subnetwork(folder: str | Path, plan_text: str, *, predict: Predictor | None = None,
                       predictor: dict | None = None) -> tuple[nn.Module, dict]:
    """The sub-network of the super-network artifact ``folder`` that the plan asks for: ``(model, manifest)``.

    ``wpac:macs=F``: at most ``F`` of its MACs. ``wpac:latency-ms=X:table=FILE``: at most ``X`` ms by
    ``predict`` (``predictor`` describes it for the manifest: the table, its target).
    """
    start = time.perf_counter()
    folder = Path(folder)
    step = extraction_step(plan_text)
    if step is None or step.blocks or set(step.options) not in ({"macs"}, {"latency-ms", "table"}):
        raise EdgeError(f"--plan {plan_text} on the artifact {folder}: a compressed model takes only a sub-network "
                        "plan", expected="--plan wpac:macs=F alone (0 < F <= 1 of the artifact's MACs), or "
                                         "wpac:latency-ms=X:table=FILE",
                        fix="ask for wpac:macs=F, or compress the original model with the other plan")
    if step.latency_ms is not None and predict is None:
        raise EdgeError(f"--plan {plan_text} needs a latency predictor", expected="predict=model -> ms "
                        "(edge compress builds it from the table with edge.latency.predict_model)",
                        fix="run it through `edge compress`, or pass predict=")
    record = check_record(read_manifest(folder).get("supernet"), str(folder))
    model, manifest = load_artifact(folder)
    before = costs(model)
    if before["flops_analytic"] != int(record["flops"]):
        raise EdgeError(f"{folder}'s sub-network record counts {record['flops']:,} FLOPs, its model "
                        f"{before['flops_analytic']:,}", fix="re-create the super-network (the record does not "
                        "belong to these weights)")
    latency = None
    if step.latency_ms is not None and predict is not None:
        chosen, latency = select_by_latency(model, record, float(step.latency_ms), predict, str(folder))
        latency["predictor"] = predictor or {}
    else:
        chosen = select(record, float(step.options["macs"]), str(folder))
        cut_widths(model, chosen.widths)
    after = costs(model)
    if after["flops_analytic"] != chosen.flops:
        raise InternalError(f"the cut model counts {after['flops_analytic']:,} FLOPs, the record {chosen.flops:,}")
    steps = []
    for entry in manifest["steps"]:
        if entry["method"] == "wpac":
            blocks = tuple(b["block"] for b in entry["record"]["blocks"])
            options = {**{k: v for k, v in entry["options"].items() if k in ("align", "mlp_align")}, **step.options}
            named = getattr(parse_plan(entry["step"]).steps[0], "blocks", ())
            entry = {**entry, "step": str(WpacStep(blocks=named, options=options)), "options": options,
                     "record": {**entry["record"], "blocks": wpac_records(model, blocks)}}
        steps.append(entry)
    extracted = {"from": str(folder), "plan": manifest.get("plan"), "fraction": chosen.fraction,
                 "flops": chosen.flops, "full_flops": chosen.full_flops, "coarser_flops": chosen.coarser_flops,
                 "smallest_flops": chosen.smallest_flops, "drops": chosen.drops, "ranked_by": record.get("by"),
                 "trained": chosen.drops <= int(record.get("trained", 0)) if record.get("by") == "piad" else None,
                 "widths": chosen.widths, **({"latency": latency} if latency else {})}
    plan = ",".join(entry["step"] for entry in steps)
    manifest = {**manifest, "plan": plan, "requested_plan": plan_text, "before": before, "after": after,
                "steps": steps, "supernet": remaining_record(record, chosen, chosen.flops),
                "extracted": extracted, "seconds": round(time.perf_counter() - start, 2), "hardware": hardware()}
    return model, manifest


__all__ = ["Predictor", "extract_subnetwork", "extraction_step", "select_by_latency"]
