"""The analysis step: statistics of the original model (CKA, cosine, Block Redundancy, heatmaps) in ``OUT/analysis``."""

from __future__ import annotations

from edge.fileio import atomic_folder
from edge.pipeline.cache import StepRecord
from edge.pipeline.steps.context import SHARED, Context, step


def run_analysis(ctx: Context) -> StepRecord | None:
    settings = ctx.recipe.analysis
    if not settings.enabled:
        return None
    inputs = {"source": ctx.source_hash, "data": ctx.train_hash, "samples": settings.samples,
              "seed": ctx.recipe.seed}

    def work() -> dict:
        from edge.analysis.analyze import analyze
        from edge.data import calibration_set

        calibration = calibration_set(ctx.data, settings.samples, ctx.recipe.seed)
        with atomic_folder(ctx.out / "analysis") as folder:
            result = analyze(ctx.model, ctx.recipe.model, calibration, ctx.input_spec, folder)
        br = result["block_redundancy"]
        return {"samples": result["samples"], "data": result["data"], "num_blocks": result["num_blocks"],
                "block_redundancy": br, "most_redundant_block": max(range(len(br)), key=br.__getitem__),
                "pictures": {k: f"analysis/{v}" for k, v in result["pictures"].items()},
                "json": "analysis/analysis.json", "seconds": result["seconds"]}

    return step(ctx, SHARED, "analysis", ctx.out, inputs, work, ("analysis",))
