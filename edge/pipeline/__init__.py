"""The main job: a recipe of variants, each compressed, exported, cleaned, verified, evaluated and profiled.

``run_pipeline(load_recipe(path), out)`` runs it with a content-hash step cache and writes
``out/report.json``, ``out/report.md`` and a self-contained ``out/report.html``. Importing this
package is cheap (the CLI's ``--help`` reads :data:`STEPS`); the runner loads torch when called.

After a run, :func:`deployed_graphs` lists the graphs to bundle, and :func:`add_device_results` puts
what ``edge deploy`` fetched (into :func:`device_results_folder`) into the run's report.
"""

from pathlib import Path

from edge.pipeline.layout import STEPS
from edge.pipeline.recipe import (
    DEFAULT_RECIPE,
    Recipe,
    Variant,
    default_recipe_text,
    load_recipe,
    with_overrides,
)
from edge.pipeline.run_folder import VariantGraph, deployed_graphs, device_results_folder


def run_pipeline(recipe: Recipe, out, *, redo: tuple[str, ...] = ()) -> dict:
    """See :func:`edge.pipeline.run.run_pipeline`."""
    from edge.pipeline.run import run_pipeline as run

    return run(recipe, out, redo=redo)


def add_device_results(run_dir, fetched) -> Path:
    """See :func:`edge.pipeline.report.write.add_device_results`."""
    from edge.pipeline.report.write import add_device_results as add

    return add(run_dir, fetched)


__all__ = ["DEFAULT_RECIPE", "STEPS", "Recipe", "Variant", "VariantGraph", "add_device_results", "default_recipe_text",
           "deployed_graphs", "device_results_folder", "load_recipe", "run_pipeline", "with_overrides"]
