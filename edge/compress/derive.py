"""A model derived from a compressed artifact without data: ``edge compress ARTIFACT --plan STEP``.

A method may cut a model out of an artifact of its own without calibration data (WPAC: a
sub-network of a super-network, ``wpac:macs=F`` or ``wpac:latency-ms=X:table=FILE``). The plan's
only step names the method (:meth:`~edge.compress.method.Method.derives`); this module reads the
artifact, lets the method refuse what it cannot give before the weights load
(``check_derivation``), cuts the loaded model (``derive``) and writes the manifest around what the
method returns: the new plan, the costs before and after, the time taken.
"""

from __future__ import annotations

import time
from pathlib import Path

from torch import nn

from edge.compress.artifact import load_artifact, read_manifest
from edge.compress.compressor import costs
from edge.compress.method import Step
from edge.compress.plan import parse_plan
from edge.compress.registry import method_of, methods
from edge.errors import EdgeError
from edge.runtime import hardware


def derivation_step(plan_text: str) -> Step | None:
    """The step of a one-step plan that derives a model from an artifact (e.g. ``wpac:macs=0.5``), else None."""
    steps = parse_plan(plan_text).steps
    if len(steps) == 1 and method_of(steps[0]).derives(steps[0]):
        return steps[0]
    return None


def derive_model(folder: str | Path, plan_text: str, *, predict=None,
                 predictor: dict | None = None) -> tuple[nn.Module, dict]:
    """The model the plan derives from the artifact ``folder``: ``(model, manifest)``.

    ``predict`` (``model -> ms``) and ``predictor`` (its description for the manifest) serve a
    latency budget (``wpac:latency-ms=X:table=FILE``).
    """
    start = time.perf_counter()
    folder = Path(folder)
    step = derivation_step(plan_text)
    if step is None:
        offered = " or ".join(m.derivations for m in methods() if m.derivations)
        raise EdgeError(f"--plan {plan_text} on the artifact {folder}: a compressed model takes only a sub-network "
                        "plan", expected=f"--plan {offered}",
                        fix="ask for one of those, or compress the original model with the other plan")
    method = method_of(step)
    method.check_derivation(step, plan_text, read_manifest(folder), str(folder), predict)
    model, manifest = load_artifact(folder)
    before = costs(model)
    changed = method.derive(model, manifest, step, str(folder), predict=predict, predictor=predictor)
    plan = ",".join(entry["step"] for entry in changed["steps"])
    manifest = {**manifest, "plan": plan, "requested_plan": plan_text, "before": before, "after": costs(model),
                **changed, "seconds": round(time.perf_counter() - start, 2), "hardware": hardware()}
    return model, manifest


__all__ = ["derivation_step", "derive_model"]
