"""The plan step: ``edge plan``'s search to the recipe's budget, into ``OUT/plan`` (its model: the planned variant)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edge.fileio import sha256_file
from edge.pipeline.cache import StepRecord
from edge.pipeline.layout import ARTIFACT, PLAN
from edge.pipeline.steps.context import SHARED, Context, step
from edge.progress import log


def run_plan(ctx: Context) -> StepRecord | None:
    """``edge plan``'s search to the recipe's budget on its target, into ``OUT/plan`` (its model: the planned
    variant)."""
    settings, recipe = ctx.recipe.plan, ctx.recipe
    if settings is None:
        return None
    inputs = {"source": ctx.source_hash, "architecture": [recipe.model, recipe.img_size], "data": ctx.train_hash,
              "settings": dataclasses.asdict(settings), "seed": recipe.seed, "threads": recipe.threads,
              "table": sha256_file(Path(settings.table)) if settings.table else None}

    def work() -> dict:
        from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget
        from edge.planner.plans import SearchConfig

        search = SearchConfig(budget=settings.budget, data=ctx.data, samples=settings.samples,
                              holdout=settings.holdout, seed=recipe.seed, shortlist=settings.shortlist,
                              refresh=settings.refresh, min_step=settings.min_step)
        estimate = settings.backend == "estimate"
        target = TargetConfig(table=settings.table, backend=settings.backend, precision=settings.precision,
                              batch=settings.batch, threads=None if estimate else recipe.threads,
                              power_mode=settings.power_mode if estimate else None)
        # no whole-model timing in the search: the pipeline times the chosen plan beside every variant
        record = plan_to_budget(ctx.model, ctx.source, ctx.out / PLAN,
                                PlanJobConfig(search=search, target=target, measure=0, correct=0), progress=log)
        return plan_summary(record)

    return step(ctx, SHARED, "plan", ctx.out, inputs, work, (PLAN,))


def plan_summary(record: dict) -> dict:
    """What the report keeps of ``plan.json``: the budget, the target, the choice, every round and why, the front."""
    result = record["result"]
    rounds = [{k: r[k] for k in ("round", "method", "move", "label", "plan", "kl", "agreement", "predicted_ms",
                                  "saved_ms", "cost_kl_per_ms", "why", "measured")} for r in result["rounds"]]
    return {"budget": record["budget"], "budget_ms": record["budget_ms"], "target": record["target"],
            "table": record["table"], "search": record["search"], "chosen": result["chosen"],
            "original": result["original"], "rounds": rounds, "front": result["front"],
            "measured_plans": len(result["points"]), "refused": len(result["refused"]), "builds": result["builds"],
            "methods": result["methods"], "seconds": result["seconds"],
            "files": {k: f"{PLAN}/{v}" for k, v in (("record", "plan.json"), ("markdown", "plan.md"),
                                                     ("plot", "pareto.png"), ("model", ARTIFACT))}}
