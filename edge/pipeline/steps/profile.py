"""The profile step: every graph of the run timed side by side in one measurement, with an A/A control."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from edge.pipeline.cache import StepRecord
from edge.pipeline.layout import DEPLOYED, clean_name, reference_variant
from edge.pipeline.steps.context import SHARED, Context, step
from edge.pipeline.steps.precision import PrecisionRun
from edge.pipeline.steps.variant import VariantRun


def run_profile(ctx: Context, runs: list[VariantRun], cleaned: list[StepRecord],
                precisions: Sequence[tuple[PrecisionRun, StepRecord]] = ()) -> StepRecord:
    """Every variant's cleaned static-batch graph timed side by side, in one run, with an A/A control.

    One step for all variants: their latency ratios always come from one measurement, so a variant
    whose graph changed has every variant timed again.
    """
    from edge.runtime import cpu_name

    recipe = ctx.recipe
    graph = clean_name(DEPLOYED)
    graphs = {run.variant.name: (run.folder / graph, record.outputs[graph]) for run, record in zip(runs, cleaned)}
    graphs |= {run.name: (run.folder / DEPLOYED, record.outputs[DEPLOYED]) for run, record in precisions}
    reference = reference_variant(recipe)
    inputs = {"graphs": {name: digest for name, (_, digest) in graphs.items()}, "reference": reference,
              "settings": dataclasses.asdict(recipe.profile),
              "threads": recipe.threads, "seed": recipe.seed,
              "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count()}}

    def work() -> dict:
        from edge.profile.fresh import time_fresh_settings
        from edge.profile.sidebyside import SideBySideConfig

        # in a new interpreter, as edge plan times its front (edge.profile.fresh: a process after a plan search
        # timed its plan 2.19x, a new one 1.87-1.91x): this one's heap and thread pools are not a user's
        settings = dataclasses.asdict(recipe.profile)
        processes = settings.pop("processes") or recipe.profile.sessions    # None: one per session set
        config = SideBySideConfig(**settings, seed=recipe.seed)
        summary = time_fresh_settings({name: path for name, (path, _) in graphs.items()}, reference, config,
                                      recipe.threads, seed=recipe.seed, processes=processes)
        return {**summary, "graph": graph}

    return step(ctx, SHARED, "profile", ctx.out, inputs, work)
