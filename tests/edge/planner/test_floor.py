"""edge plan's fidelity floor: no move below it, a budget only destroyed plans meet refused, every record's margin."""

from __future__ import annotations

import json
import math

import pytest
import torch

from edge._compat import ensure_torchvision_importable

ensure_torchvision_importable()

from edge.cli import main  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.latency.grid import GridConfig, grid_parts  # noqa: E402
from edge.latency.orin import estimate_table  # noqa: E402
from edge.models import create_model  # noqa: E402
from edge.planner import SearchConfig, search  # noqa: E402
from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget  # noqa: E402
from edge.planner.report import markdown  # noqa: E402
from edge.planner.plans import MIN_AGREEMENT  # noqa: E402
from edge.planner.search import Search  # noqa: E402

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=64,num_heads=2"
SOURCE = {"model": TINY}
FAST = dict(data="fmnist-mini", samples=40, holdout=40, shortlist=3, refresh=3)
FLOOR = 0.8   # on this model every block replaced by one map (linear:-1-3, 0.16x) keeps 0.675 agreement: below it


@pytest.fixture(scope="module")
def sharp():
    """A random ViT whose class depends on its features: a head of unit-variance weights and no bias (timm's
    small init leaves the class to the head's bias, and every plan then agrees with the original on every image)."""
    torch.manual_seed(0)
    model = create_model(TINY).eval()
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.02)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    torch.nn.init.zeros_(model.head.bias)
    return model


@pytest.fixture(scope="module")
def table(sharp):
    return estimate_table(grid_parts(sharp, GridConfig("full", align=16, mlp_align=64)), "MAXN_SUPER", "fp16", 1)


def test_a_budget_only_plans_below_the_floor_meet_is_refused_naming_the_fastest_above(sharp, table):
    config = SearchConfig(budget=0.2, min_agreement=FLOOR, **FAST)
    walk = Search(sharp, SOURCE, config, table)
    budget_ms = walk.budget_ms()
    with pytest.raises(EdgeError) as caught:
        walk.run_to(budget_ms)
    reached, text = walk.now, str(caught.value)
    assert reached.plan and reached.agreement >= FLOOR and reached.predicted_ms > budget_ms
    assert "is met only by plans below the agreement floor" in text and "below the floor of 0.8 (chance: 0.1)" in text
    assert f"the fastest plan the search reaches above the floor is {reached.plan} " in text
    assert f"agreement {reached.agreement:.4f}, {reached.agreement - FLOOR:+.4f} above the floor" in text
    share = math.ceil(1000 * reached.predicted_ms / walk.original.predicted_ms) / 1000
    assert f"--budget {share:g}x" in text and "--min-agreement" in text
    # every move taken kept the floor; below-floor plans were measured (what makes this a refusal, not a miss)
    assert walk.rounds and all(r["agreement"] >= FLOOR and r["floor_margin"] >= 0 for r in walk.rounds)
    below = [p for p in walk.planner.points.values() if p.agreement < FLOOR and p.predicted_ms <= budget_ms]
    assert below and all(p.floor_margin == pytest.approx(p.agreement - FLOOR) for p in below)
    # the budget the refusal names is met, by the plan it names (the walk is deterministic)
    met = search(sharp, SOURCE, SearchConfig(budget=share, min_agreement=FLOOR, **FAST), table)
    assert met.chosen.plan == reached.plan
    # without a floor the same budget is met, by a plan below it: the floor is what refused it
    destroyed = search(sharp, SOURCE, SearchConfig(budget=0.2, min_agreement=0.0, **FAST), table)
    assert destroyed.chosen.predicted_ms <= budget_ms and destroyed.chosen.agreement < FLOOR


def test_a_budget_no_plan_reaches_names_the_fastest_above_the_floor_when_the_fastest_is_below(sharp, table):
    with pytest.raises(EdgeError) as caught:
        search(sharp, SOURCE, SearchConfig(budget=0.1, min_agreement=FLOOR, **FAST), table)
    text = str(caught.value)
    assert "no plan reaches" in text and "the fastest there is, linear:-1-3, is predicted at " in text
    assert "below the floor of 0.8" in text and "the fastest plan the search reaches above the floor is " in text


def test_every_plan_record_carries_its_margin_above_the_floor(sharp, table):
    result = search(sharp, SOURCE, SearchConfig(budget=0.7, min_agreement=FLOOR, **FAST), table)
    record = result.to_json()
    assert record["min_agreement"] == FLOOR
    for point in [record["chosen"], record["original"], *record["front"], *record["points"], *record["rounds"]]:
        assert point["floor_margin"] == pytest.approx(point["agreement"] - FLOOR, abs=1e-12)
    assert record["original"]["floor_margin"] == pytest.approx(1 - FLOOR)
    assert all(c["floor_margin"] == pytest.approx(c["agreement"] - FLOOR) for r in record["rounds"]
               for c in r["candidates"])
    json.dumps(record, allow_nan=False)   # a margin is always a number in a record


def test_a_floor_the_walk_never_crosses_changes_nothing(sharp, table):
    """Only the floor's margins differ: the same rounds, the same moves measured, the same plan."""
    kept = search(sharp, SOURCE, SearchConfig(budget=0.5, **FAST), table)   # the default floor, 0.5
    free = search(sharp, SOURCE, SearchConfig(budget=0.5, min_agreement=0.0, **FAST), table)
    assert min(r["agreement"] for r in free.rounds) >= MIN_AGREEMENT
    assert kept.chosen.plan == free.chosen.plan

    def without_margins(rounds):
        return [{k: v for k, v in r.items() if k not in ("floor_margin", "candidates")} for r in rounds]
    assert without_margins(kept.rounds) == without_margins(free.rounds)


@pytest.mark.parametrize("floor", [-0.1, 1.5])
def test_a_floor_out_of_range_is_refused(floor):
    with pytest.raises(EdgeError, match="min_agreement"):
        SearchConfig(budget=0.5, min_agreement=floor).check()


def test_plan_to_budget_refused_by_the_floor_leaves_nothing(sharp, table, tmp_path):
    out = tmp_path / "plan"
    config = PlanJobConfig(SearchConfig(budget=0.2, min_agreement=FLOOR, **FAST), TargetConfig(backend="estimate"))
    with pytest.raises(EdgeError, match="met only by plans below the agreement floor"):
        plan_to_budget(sharp, SOURCE, out, config)
    assert list(tmp_path.iterdir()) == []     # neither OUT nor its temporary folder


def test_plan_md_shows_each_plans_margin_above_the_floor(sharp, table, tmp_path):
    out = tmp_path / "plan"
    config = PlanJobConfig(SearchConfig(budget=0.7, min_agreement=FLOOR, **FAST), TargetConfig(backend="estimate"))
    record = plan_to_budget(sharp, SOURCE, out, config)
    written = json.loads((out / "plan.json").read_text())
    chosen = written["result"]["chosen"]
    assert written["search"]["min_agreement"] == FLOOR
    text = (out / "plan.md").read_text()
    assert f"{chosen['floor_margin']:+.4f} above the fidelity floor (0.8 agreement" in text
    assert "| agreement | above floor |" in text and text == markdown(record)


def test_the_cli_refuses_a_budget_only_destroyed_plans_meet(sharp, tmp_path, capsys):
    from edge.models.weights_io import save_safetensors

    weights = tmp_path / "sharp.safetensors"
    save_safetensors(sharp.state_dict(), weights)
    out = tmp_path / "plan"
    args = ["plan", TINY, "--weights", str(weights), "--budget", "0.2x", "--backend", "estimate", "--data",
            "fmnist-mini", "--samples", "40", "--holdout", "40", "--shortlist", "3", "--refresh", "3",
            "--out", str(out)]
    assert main([*args, "--min-agreement", str(FLOOR)]) == 2
    err = capsys.readouterr().err
    assert "met only by plans below the agreement floor" in err and "the fastest plan the search reaches above " \
        "the floor is " in err and "--min-agreement" in err
    assert not out.exists()


@pytest.mark.slow   # walks the reference model down to the floor (13 rounds; half a minute or more on 2 cores)
def test_the_reference_model_at_0_02x_is_refused_naming_the_fastest_plan_above_the_floor(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", "fmnist-deit-tiny", "--budget", "0.02x", "--backend", "estimate", "--data", "fmnist-mini",
                 "--samples", "32", "--holdout", "32", "--min-step", "0.05", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no plan reaches" in err and "the fastest there is, linear:-1-11, is predicted at " in err
    assert "the fastest plan the search reaches above the floor is " in err and "raise the budget to --budget 0." in err
    assert f"below the floor of {MIN_AGREEMENT:g} (chance: 0.1)" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_training_split_smaller_than_both_sets_is_shared_in_the_proportion_asked(tmp_path, capsys):
    from edge.planner.plans import fit_split
    from tests.rgb_folder import make_rgb_folder

    make_rgb_folder(tmp_path, train=5, val=1, size=8)   # 50 training images
    shrunk = fit_split(SearchConfig(budget=0.5, data=str(tmp_path), samples=60, holdout=40))
    assert (shrunk.samples, shrunk.holdout) == (30, 20)
    assert f"60 calibration and 40 held-out images asked for, the training split of {tmp_path} holds 50: using 30 " \
           "and 20" in capsys.readouterr().err
    kept = SearchConfig(budget=0.5, data=str(tmp_path), samples=20, holdout=30)
    assert fit_split(kept) is kept
    make_rgb_folder(tmp_path / "few", train=1, val=1, size=8)   # 10 images: not two sets of 10
    with pytest.raises(EdgeError, match="training split holds 10 images"):
        fit_split(SearchConfig(budget=0.5, data=str(tmp_path / "few")))
