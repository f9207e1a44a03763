"""The main job: a recipe of variants, each compressed, exported, cleaned, verified, evaluated and profiled.

``run_pipeline(load_recipe(path), out)`` runs it with a content-hash step cache and writes
``out/report.json``, ``out/report.md`` and a self-contained ``out/report.html``. Importing this
package is cheap (the CLI's ``--help`` reads :data:`STEPS`); the runner loads torch when called.
"""

from edge.pipeline.layout import STEPS
from edge.pipeline.recipe import (
    DEFAULT_RECIPE,
    Recipe,
    Variant,
    default_recipe_text,
    load_recipe,
    with_overrides,
)


def run_pipeline(recipe: Recipe, out, *, redo: tuple[str, ...] = ()) -> dict:
    """See :func:`edge.pipeline.run.run_pipeline`."""
    from edge.pipeline.run import run_pipeline as run

    return run(recipe, out, redo=redo)


__all__ = ["DEFAULT_RECIPE", "STEPS", "Recipe", "Variant", "default_recipe_text", "load_recipe", "run_pipeline",
           "with_overrides"]
