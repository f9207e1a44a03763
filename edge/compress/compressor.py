"""``edge compress``: apply a plan to a model with calibration data; report what changed."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace

from torch import nn

from edge import distributed
from edge.compress.cost import analytic_flops, count_params, measured_flops
from edge.compress.method import BuildCache, BuildContext, Built, Method, prepared_key
from edge.compress.plan import Plan, parse_plan
from edge.compress.registry import method_of, methods
from edge.config import MAX_BATCH, MAX_SAMPLES, MAX_SEED, option
from edge.data import calibration_set, load_dataset
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.models.info import model_info
from edge.models.zoo import data_config, data_for
from edge.runtime import hardware, resolve_device


@dataclass
class CompressConfig:
    plan: str
    data: str | None = None   # None: the bundled model's data set (edge.models.data_for); other models need it
    # None: the largest default of the plan's methods (500; wpac 1024), at most the training split
    samples: int | None = option(None, minimum=1, maximum=MAX_SAMPLES)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    holdout: float = option(0.2, above=0.0, below=1.0)  # share of the samples the planner scores on (auto plans)
    batch_size: int = option(64, minimum=1, maximum=MAX_BATCH)
    # where the passes over the calibration images run: cpu, cuda[:N] or auto (edge.runtime.computing_on); the
    # statistics, fits and the model stay on the CPU
    device: str = "auto"


def costs(model: nn.Module) -> dict:
    size = tuple(data_config(model)["input_size"])
    measured, analytic = measured_flops(model, size), analytic_flops(model)
    return {"params": count_params(model), "flops": measured, "flops_analytic": analytic}


def _cache_key(source: dict, config: CompressConfig) -> str:
    return json.dumps({"source": source, "data": config.data, "samples": config.samples, "seed": config.seed,
                       "holdout": config.holdout, "batch_size": config.batch_size}, sort_keys=True, default=str)


def _build(method, steps: tuple, context: BuildContext, cache: BuildCache | None) -> Built:
    """``method.build`` of ``steps``; with a cache, each separable step is built once and the pieces merged."""
    if cache is None or not all(method.separable(s) for s in steps):
        return method.build(steps, context)
    prepared = prepared_key(context.prepared)
    return method.merge([cache.built((method.name, str(step), prepared),
                                     lambda step=step: method.build((step,), context)) for step in steps])


def apply_plan(model: nn.Module, plan: Plan, config: CompressConfig, calibration, *,
               cache: BuildCache | None = None) -> tuple[Plan, dict[str, Built], dict[str, dict]]:
    """Prepare, build and place ``plan`` (parsed, validated, ``config.samples`` resolved) in ``model``.

    Returns the resolved plan, what each method built and what each method's prepare did. ``cache``
    (:class:`~edge.compress.method.BuildCache`) keeps built steps and statistics across calls on copies
    of one model with one calibration set (``edge plan``).
    """
    info = model_info(model)
    used = [m for m in methods() if plan.steps_of(m)]
    spec = InputSpec.from_data_config(data_config(model))
    prepared = {m.name: m.prepare(model, plan.steps_of(m), plan) for m in used}
    context = BuildContext(model, info, spec, calibration, config.samples, config.seed, config.holdout,
                           config.batch_size, prepared=prepared, cache=cache, device=resolve_device(config.device))
    built: dict[str, Built] = {}
    for method in used:
        built[method.name] = result = _build(method, plan.steps_of(method), context, cache)
        others = tuple(s for s in plan.steps if method_of(s) is not method)
        plan = Plan.canonical((*others, *result.steps)).validate(info.num_blocks)
        context.removed |= result.removed
    for method in used:
        method.place(model, built[method.name])
    return plan, built, prepared


def resolve_samples(config: CompressConfig, plan: Plan) -> CompressConfig:
    """``config`` with ``samples`` set: the plan's methods' largest default, at most the training split."""
    if config.samples is not None:
        return config
    wanted = max((m.calibration_samples for m in methods() if plan.steps_of(m)), default=Method.calibration_samples)
    return replace(config, samples=min(wanted, len(load_dataset(config.data, "train"))))


def compress(model: nn.Module, source: dict, config: CompressConfig, *,
             cache: BuildCache | None = None) -> tuple[nn.Module, dict]:
    """Compress ``model`` (modified in place and returned) by ``config.plan``; returns ``(model, manifest)``.

    ``source`` records how to rebuild the uncompressed model (``{"model": spec, "img_size": ...}``).
    The plan is applied in the phases of :mod:`edge.compress.method`, each method in the registry's
    order: prepare, build (resolve and fit on the model before any replacement), place, record.
    ``cache``: see :func:`apply_plan` (the same model, source and calibration settings every call).

    Under torchrun (``torchrun --nproc_per_node N -m edge compress ...``) every process streams its
    share of the calibration images and the statistics are summed over the processes before any fit
    or choice, so every process returns the same model; the caller writes it from the main process.
    """
    start = time.perf_counter()
    distributed.init("cpu")
    resolve_device(config.device)   # a GPU asked for where there is none: said before any work
    if any(method.is_applied(model) for method in methods()):
        raise EdgeError(f"{source.get('model')} is already compressed",
                        expected="an uncompressed model (plans index the original blocks)",
                        fix="compress the original model with one plan that lists every span, "
                            "e.g. --plan linear:2-3,linear:9-10")
    info = model_info(model)
    config = replace(config, data=data_for(config.data, source.get("model")))
    plan = parse_plan(config.plan).validate(info.num_blocks)
    config = resolve_samples(config, plan)
    if cache is not None:
        cache.bind(_cache_key(source, config))
    calibration = calibration_set(config.data, config.samples, config.seed)
    before = costs(model)
    plan, built, prepared = apply_plan(model, plan, config, calibration, cache=cache)
    used = [m for m in methods() if m.name in built]
    fit = {k: v for m in used for k, v in built[m.name].fit.items()}
    table = [row for m in used for row in built[m.name].planner]
    steps = []
    for step in plan.steps:
        method = method_of(step)
        steps.append({"method": method.name, "step": str(step), "options": dict(step.options),
                      "record": method.record(model, step, prepared[method.name])})
    after = costs(model)
    manifest = {
        "source": source,
        "plan": str(plan),
        "requested_plan": config.plan,
        "calibration": {"data": calibration.name, "samples": len(calibration), "seed": config.seed,
                        "holdout": config.holdout if table else 0.0},
        "fit": fit,
        "planner": table,
        "before": before,
        "after": after,
        "config": asdict(config),
        "seconds": round(time.perf_counter() - start, 2),
        "hardware": hardware(resolve_device(config.device)),
        "steps": steps,
    }
    for method in used:   # top-level entries a method adds (wpac:macs's sub-network order)
        manifest.update(built[method.name].manifest)
    return model, manifest
