"""benchmarks/recipe_walltime.py: the built-in recipe with keys changed, and its table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edge.pipeline.recipe import default_recipe_text, parse_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from recipe_walltime import changed_recipe, markdown  # noqa: E402


def test_each_change_replaces_one_key_and_the_rest_of_the_built_in_recipe_stays():
    text = default_recipe_text()
    document, applied = changed_recipe(text, ["precision.variants=[planned]", "evaluate.subset=1000",
                                              "profile.rounds=20"])
    assert applied == {"precision.variants": (["planned", "original"], ["planned"]),
                       "evaluate.subset": (2000, 1000), "profile.rounds": (40, 20)}
    changed, builtin = parse_recipe(document), parse_recipe(__import__("yaml").safe_load(text))
    assert (changed.precision.variants, changed.evaluate.subset, changed.profile.rounds) == (("planned",), 1000, 20)
    assert changed.plan == builtin.plan and changed.variants == builtin.variants and changed.bundle == builtin.bundle


@pytest.mark.parametrize("change, message", [
    ("evaluate.subsets=1000", "the built-in recipe has no key 'evaluate.subsets'"),
    ("evaluate.subset", "expected KEY=VALUE"),
    ("model.name=x", "the built-in recipe has no key 'model.name'"),
])
def test_a_key_the_recipe_lacks_or_a_change_without_a_value_is_refused_naming_it(change, message):
    with pytest.raises(SystemExit, match=message):
        changed_recipe(default_recipe_text(), [change])


def test_the_table_gives_every_run_and_each_recipes_walls_in_order():
    run = {"exit": 0, "contention": {"other_cpu_share": 0.01, "stolen_cpu_share": 0.004}, "plan": "linear:3-5",
           "steps": {"evaluate": 170.4, "plan": 80.0, "profile": 64.2, "quantize": 55.0}}
    record = {"command": "python benchmarks/recipe_walltime.py", "hardware": {"cpu": "c", "cpu_count": 2},
              "versions": {"onnxruntime": "1", "torch": "2"},
              "changes": {"evaluate.subset": {"built-in": 2000, "changed": 1000}},
              "runs": [{**run, "recipe": "built-in", "wall_s": 502.0}, {**run, "recipe": "changed", "wall_s": 405.3},
                       {**run, "recipe": "built-in", "wall_s": 507.0}, {**run, "recipe": "changed", "wall_s": 330.0}]}
    text = markdown(record)
    assert "Changed: `evaluate.subset` 2000 -> 1000." in text
    assert "| 2 | changed | 0 | 405 | 1.0 % (0.4 %) | `linear:3-5` | 170 s | 80 s | 64 s | 55 s |" in text
    assert "- built-in: 502 s, 507 s." in text and "- changed: 405 s, 330 s." in text


def test_a_value_the_recipe_refuses_is_refused_before_any_run():
    with pytest.raises(SystemExit, match=r"--set evaluate.subset=-5: .*evaluate.subset"):
        changed_recipe(default_recipe_text(), ["evaluate.subset=-5"])
