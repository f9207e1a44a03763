"""Cut a sub-network from a super-network artifact: ``edge compress SUPERNET --plan wpac:macs=F``.

A super-network is an artifact whose manifest carries a ``supernet`` record
(:mod:`edge.compress.supernet`): a wpac model at its widths plus the order in which its aligned
units go (``edge compress MODEL --plan wpac:macs=1`` ranks them once, ``edge finetune --piad``
trains them). Extraction drops that order's entries until the MACs are at most ``F`` of the
artifact's own, slices the weights, and writes an ordinary wpac artifact: no data, no training,
seconds. Its manifest records the extraction (``extracted``) and keeps the rest of the order, so
it is a super-network itself (a sub-network of it equals one cut deeper from the original).
"""

from __future__ import annotations

import time
from pathlib import Path

from torch import nn

from edge.compress.artifact import load_artifact, read_manifest
from edge.compress.compressor import costs
from edge.compress.plan import parse_plan
from edge.compress.supernet import check_record, remaining_record, select
from edge.compress.width import WpacStep
from edge.compress.wpac_apply import cut_widths, wpac_records
from edge.errors import EdgeError, InternalError
from edge.runtime import hardware


def extraction_step(plan_text: str) -> WpacStep | None:
    """The ``wpac:macs=F`` step of a plan that asks for a sub-network, else None (any other plan)."""
    steps = parse_plan(plan_text).steps
    if len(steps) == 1 and isinstance(steps[0], WpacStep) and steps[0].macs is not None:
        return steps[0]
    return None


def extract_subnetwork(folder: str | Path, plan_text: str) -> tuple[nn.Module, dict]:
    """The sub-network of the super-network artifact ``folder`` that ``wpac:macs=F`` asks for: ``(model, manifest)``."""
    start = time.perf_counter()
    folder = Path(folder)
    step = extraction_step(plan_text)
    if step is None or set(step.options) != {"macs"} or step.blocks:
        raise EdgeError(f"--plan {plan_text} on the artifact {folder}: a compressed model takes only a sub-network "
                        "plan", expected="--plan wpac:macs=F alone (0 < F <= 1 of the artifact's MACs)",
                        fix="ask for wpac:macs=F, or compress the original model with the other plan")
    record = check_record(read_manifest(folder).get("supernet"), str(folder))
    model, manifest = load_artifact(folder)
    before = costs(model)
    if before["flops_analytic"] != int(record["flops"]):
        raise EdgeError(f"{folder}'s sub-network record counts {record['flops']:,} FLOPs, its model "
                        f"{before['flops_analytic']:,}", fix="re-create the super-network (the record does not "
                        "belong to these weights)")
    chosen = select(record, float(step.options["macs"]), str(folder))
    cut_widths(model, chosen.widths)
    after = costs(model)
    if after["flops_analytic"] != chosen.flops:
        raise InternalError(f"the cut model counts {after['flops_analytic']:,} FLOPs, the record {chosen.flops:,}")
    steps = []
    for entry in manifest["steps"]:
        if entry["method"] == "wpac":
            blocks = tuple(b["block"] for b in entry["record"]["blocks"])
            options = {**{k: v for k, v in entry["options"].items() if k in ("align", "mlp_align")}, "macs": step.macs}
            named = getattr(parse_plan(entry["step"]).steps[0], "blocks", ())
            entry = {**entry, "step": str(WpacStep(blocks=named, options=options)), "options": options,
                     "record": {**entry["record"], "blocks": wpac_records(model, blocks)}}
        steps.append(entry)
    extracted = {"from": str(folder), "plan": manifest.get("plan"), "fraction": chosen.fraction,
                 "flops": chosen.flops, "full_flops": chosen.full_flops, "coarser_flops": chosen.coarser_flops,
                 "smallest_flops": chosen.smallest_flops, "drops": chosen.drops, "ranked_by": record.get("by"),
                 "trained": chosen.drops <= int(record.get("trained", 0)) if record.get("by") == "piad" else None,
                 "widths": chosen.widths}
    plan = ",".join(entry["step"] for entry in steps)
    manifest = {**manifest, "plan": plan, "requested_plan": plan_text, "before": before, "after": after,
                "steps": steps, "supernet": remaining_record(record, chosen, chosen.flops),
                "extracted": extracted, "seconds": round(time.perf_counter() - start, 2), "hardware": hardware()}
    return model, manifest


__all__ = ["extract_subnetwork", "extraction_step"]
