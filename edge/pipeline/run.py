"""The main job: for every variant of a recipe compress, count, export, clean, verify, evaluate; then
profile all variants together (side by side, with an A/A control).

Every step is one library call (``edge.compress``, ``edge.export``, ``edge.graph.clean``,
``edge.check.verify``, ``edge.check.accuracy``, ``edge.profile.sidebyside``) run through the :class:`StepCache`
(the steps: edge.pipeline.steps), so a rerun redoes only the steps whose inputs changed; the profile step is one
step over all variants, so latency ratios always come from one measurement. Layout of ``OUT``::

    OUT/report.json, report.md, report.html
    OUT/onnxruntime.log                ONNX Runtime's notes of the last run that had any (kept off the terminal)
    OUT/analysis/                      analysis.json and heatmaps of the original model
    OUT/analysis.done.json, profile.done.json   the shared steps' cache markers
    OUT/variants/NAME/model/           the compressed artifact (variants with a plan)
    OUT/variants/NAME/model.onnx       static batch: verified, cleaned, profiled (deployment form)
    OUT/variants/NAME/model.clean.onnx
    OUT/variants/NAME/model.batched.onnx, model.batched.clean.onnx   dynamic batch: accuracy
    OUT/variants/NAME/STEP.done.json   the cache markers (key, output hashes, result)

Everything the recipe names is checked before anything is written.
"""

from __future__ import annotations

import time
from pathlib import Path

from edge.errors import EdgeError, plural
from edge.pipeline.cache import StepCache
from edge.pipeline.layout import ORT_LOG, STEPS, VARIANTS, reference_variant
from edge.pipeline.recipe import Recipe
from edge.pipeline.steps.analysis import run_analysis
from edge.pipeline.steps.bundle import run_bundle
from edge.pipeline.steps.context import Context
from edge.pipeline.steps.plan import run_plan
from edge.pipeline.steps.precision import PrecisionRun
from edge.pipeline.steps.profile import run_profile
from edge.pipeline.steps.variant import PlannedRun, VariantRun
from edge.progress import log


def resolve_data(recipe: Recipe) -> tuple[str, str | None]:
    """The data set the run uses, and the notice when a fallback replaced it. Without ``data`` a bundled model
    uses its own data set, falling back to its smaller check set when that is not installed; a recipe that names
    data that cannot be read stops the run there (exit 2) unless it names a ``fallback_data`` too."""
    from edge.data import load_dataset
    from edge.models import bundled_source

    try:
        data, fallback = recipe.data, recipe.fallback_data
        if data is None:
            bundled = bundled_source(recipe.model)
            if bundled is None:
                raise EdgeError(f"the recipe names no data for {recipe.model}, which is not a model bundled with "
                                "edge", expected="data: your images (a folder with train/ and val/ or test/)",
                                fix="add `data: DIR` to the recipe or pass --data DIR (docs/your-own-model.md)")
            data, fallback = bundled.data, fallback or bundled.check_data
    except EdgeError as e:
        raise e.at(f"recipe {recipe.source}, key data") from e
    try:
        load_dataset(data, "test")
        return data, None
    except EdgeError as e:
        if not fallback or fallback == data:
            raise e.at(f"recipe {recipe.source}, key data") from e
        load_dataset(fallback, "test")
        return fallback, f"data {data!r} is not available ({e.what}); using {fallback!r} instead"


def check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise EdgeError(f"--out {out} is a file", expected="a folder (new, or one written by edge pipeline)")
    ours = (VARIANTS, "report.json", "analysis.done.json")
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in ours):
        raise EdgeError(f"--out {out} is a folder that edge pipeline did not write",
                        fix="choose a new or empty folder (a previous pipeline folder is reused: cached steps "
                            "are not redone)")


def check_plans(recipe: Recipe, num_blocks: int) -> None:
    from edge.compress.plan import parse_plan

    for index, variant in enumerate(recipe.variants):
        if variant.plan is None:
            continue
        try:
            parse_plan(variant.plan).validate(num_blocks)
        except EdgeError as e:
            raise e.at(f"recipe {recipe.source}, key variants[{index}].plan",
                       default_fix=f"{recipe.model} has {num_blocks} blocks (0..{num_blocks - 1})") from e


def run_pipeline(recipe: Recipe, out: str | Path, *, redo: tuple[str, ...] = ()) -> dict:
    """Run (or find in the cache) every step of ``recipe`` in ``out``; write the reports; return report.json."""
    import torch

    from edge.compress.artifact import source_state_sha256
    from edge.compress.load import load_model
    from edge.models import model_info
    from edge.pipeline.report.model import build_report
    from edge.pipeline.report.write import write_reports
    from edge.runtime import set_threads

    start = time.perf_counter()
    out = Path(out)
    unknown = sorted(set(redo) - set(STEPS))
    if unknown:
        raise EdgeError(f"--redo {unknown[0]} is not a step", expected=f"one of {', '.join(STEPS)}")
    check_out_dir(out)
    set_threads(recipe.threads)
    data, notice = resolve_data(recipe)
    if notice:
        log(f"edge pipeline: {notice}")
    torch.manual_seed(recipe.seed)  # timm architectures without weights: the same random model every run
    model = load_model(recipe.model, weights=recipe.weights, img_size=recipe.img_size)
    check_plans(recipe, model_info(model).num_blocks)
    ctx = Context(recipe, out, StepCache(redo), data, model, source_state_sha256(model))
    out.mkdir(parents=True, exist_ok=True)
    log(f"edge pipeline: {plural(len(recipe.variants), 'variant')} of {recipe.model} on {data} -> {out}")
    analysis = run_analysis(ctx)
    planned = run_plan(ctx)
    runs: list[VariantRun] = []
    for variant in recipe.run_variants():
        if variant.searched:
            assert planned is not None  # a searched variant comes from the plan section
            runs.append(PlannedRun(ctx, variant, planned))
        else:
            runs.append(VariantRun(ctx, variant))
    reference = reference_variant(recipe)   # first: the other variants' subset figures are paired with its own
    order = sorted(range(len(runs)), key=lambda i: runs[i].variant.name != reference)
    done = {i: runs[i].run() for i in order}
    cleaned = [done[i] for i in range(len(runs))]
    by_name = {run.variant.name: (run, record) for run, record in zip(runs, cleaned)}
    precisions = []
    if recipe.precision is not None:
        for name in recipe.precision.variants:
            base, record = by_name[name]
            for precision in recipe.precision.precisions:
                precision_run = PrecisionRun(base, precision)
                precisions.append((precision_run, precision_run.run(record)))
    latency = run_profile(ctx, runs, cleaned, precisions)
    bundle = run_bundle(ctx, {n: r for n, (r, _) in by_name.items()}, {n: c for n, (_, c) in by_name.items()},
                        precisions)
    ort_log = write_ort_messages(out)
    report = build_report(ctx, runs, analysis, latency, ort_log, notice, time.perf_counter() - start,
                          planned=planned, precisions=[p for p, _ in precisions], bundle=bundle)
    write_reports(out, report)
    return report


def write_ort_messages(out: Path) -> dict:
    """ONNX Runtime's notes of this run (kept off the terminal) to ``OUT/onnxruntime.log``, with their count."""
    from edge.check.compare import ORT_MESSAGES, write_ort_log

    lines = ORT_MESSAGES.take()
    path = out / ORT_LOG
    if not lines:
        path.unlink(missing_ok=True)
        return {"lines": 0, "file": None}
    write_ort_log(lines, path)
    log(f"edge pipeline: {len(lines)} ONNX Runtime notes (warnings about its own optimisations, not errors) "
        f"are in {path}")
    return {"lines": len(lines), "file": ORT_LOG}
