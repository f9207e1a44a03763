"""``edge compress``: apply a plan to a model with calibration data; report what changed."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from edge.analysis.collect import collect_block_moments
from edge.compress.approximate import apply_spans
from edge.compress.block_approx import ApproximatedSpan
from edge.compress.cost import analytic_flops, count_params, measured_flops
from edge.compress.dwconv import drop_prefix_tokens
from edge.compress.dwconv_apply import build_dwconv, has_dwconv, place_dwconv
from edge.compress.plan import Plan, parse_plan
from edge.compress.planner import plan_auto
from edge.data import calibration_set
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.models.info import model_info
from edge.models.zoo import data_config
from edge.progress import log
from edge.runtime import hardware


@dataclass
class CompressConfig:
    plan: str
    data: str = "fmnist"
    samples: int = 500
    seed: int = 0
    holdout: float = 0.2      # part of the calibration samples the planner scores on (auto plans)
    batch_size: int = 64


def costs(model: nn.Module) -> dict:
    size = tuple(data_config(model)["input_size"])
    measured, analytic = measured_flops(model, size), analytic_flops(model)
    return {"params": count_params(model), "flops": measured, "flops_analytic": analytic}


def compress(model: nn.Module, source: dict, config: CompressConfig) -> tuple[nn.Module, dict]:
    """Compress ``model`` (modified in place and returned) by ``config.plan``; returns ``(model, manifest)``.

    ``source`` records how to rebuild the uncompressed model (``{"model": spec, "img_size": ...}``).
    """
    start = time.perf_counter()
    if any(isinstance(m, ApproximatedSpan) for m in model.blocks) or has_dwconv(model):
        raise EdgeError(f"{source.get('model')} is already compressed",
                        expected="an uncompressed model (plans index the original blocks)",
                        fix="compress the original model with one plan that lists every span, "
                            "e.g. --plan linear:2-3,linear:9-10")
    info = model_info(model)
    plan = parse_plan(config.plan).validate(info.num_blocks)
    spec = InputSpec.from_data_config(data_config(model))
    calibration = calibration_set(config.data, config.samples, config.seed)
    before = costs(model)
    dropped = _drop_prefix(model, plan)
    table: list[dict] = []
    if plan.has_auto_spans:
        n_hold = max(1, int(round(config.samples * config.holdout)))
        if config.samples - n_hold < 2:
            raise EdgeError(f"{config.samples} calibration samples are too few for an auto plan",
                            expected="--samples >= 10", fix="raise --samples")
        fit_part = calibration.subset(torch.arange(config.samples - n_hold), "fit")
        holdout = calibration.subset(torch.arange(config.samples - n_hold, config.samples), "holdout")
        moments = collect_block_moments(model, fit_part, spec, batch_size=config.batch_size, desc="fit statistics")
        log(f"planning {plan}: {len(fit_part)} fit / {len(holdout)} held-out samples")
        planned, table = plan_auto(model, plan, moments, holdout, spec, config.seed)
        plan = Plan((*planned.steps, *plan.dwconv)).validate(info.num_blocks)
        log(f"planner chose {plan}")
    # Depthwise-convolution kernels are fitted on the original attention, before any block is replaced.
    span_blocks = {b for s in plan.spans for b in s.blocks}
    dw_steps, dw_modules, dw_stats = build_dwconv(model, plan.dwconv, calibration, spec, excluded=span_blocks,
                                                  batch_size=config.batch_size) if plan.dwconv else ((), {}, {})
    plan = Plan((*plan.spans, *dw_steps)).validate(info.num_blocks)
    fit_stats = {}
    if plan.spans:
        # The chosen (or given) plan is fitted on all calibration samples.
        moments = collect_block_moments(model, calibration, spec, batch_size=config.batch_size,
                                        desc="fit statistics")
        # apply_spans reads every feature it needs before it replaces any block.
        fit_stats = apply_spans(model, plan.spans, moments, calibration, spec, config.seed)
    place_dwconv(model, dw_modules)
    if dw_stats:
        fit_stats["dwconv"] = {**dw_stats, "prefix_dropped": dropped}
    after = costs(model)
    manifest = {
        "source": source,
        "plan": str(plan),
        "requested_plan": config.plan,
        "calibration": {"data": calibration.name, "samples": len(calibration), "seed": config.seed,
                        "holdout": config.holdout if table else 0.0},
        "fit": fit_stats,
        "planner": table,
        "before": before,
        "after": after,
        "config": asdict(config),
        "seconds": round(time.perf_counter() - start, 2),
        "hardware": hardware(),
    }
    return model, manifest


def _drop_prefix(model: nn.Module, plan: Plan) -> bool:
    """``prefix=drop`` (the paper's [CLS] handling) changes the whole model, so all dwconv steps must agree."""
    modes = {s.option("prefix") == "drop" for s in plan.dwconv}
    if len(modes) > 1:
        raise EdgeError(f"plan {plan} drops the prefix tokens in some dwconv steps only",
                        expected="prefix=drop on every dwconv step or on none (it removes [CLS] from the model)")
    if modes != {True} or not model.num_prefix_tokens:
        return False
    if plan.spans or plan.has_auto_spans:
        raise EdgeError(f"plan {plan} combines prefix=drop with block spans",
                        expected="prefix=drop only in plans of dwconv steps", fix="use prefix=mean")
    drop_prefix_tokens(model)
    return True

