"""edge plan for several batches (a weighted cost) and with TensorRT's fast shapes (candidates removed, counted).

Nothing is timed: the tables are the Orin Nano estimator's (deterministic), or its numbers under an ONNX
Runtime or TensorRT target (fake_table) where a test needs another backend's rules.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Hashable
from dataclasses import dataclass, replace

import pytest
import torch

from edge._compat import ensure_torchvision_importable

ensure_torchvision_importable()

from edge.cli import main  # noqa: E402
from edge.compress import CompressConfig, compress, load_artifact  # noqa: E402
from edge.compress.moves import Move  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.latency import LatencyTable, Target, model_parts, predict_model  # noqa: E402
from edge.latency.grid import GridConfig, grid_parts  # noqa: E402
from edge.latency.orin import estimate_table  # noqa: E402
from edge.latency.table import here  # noqa: E402
from edge.latency.tensorrt_shapes import new_violations  # noqa: E402
from edge.models import create_model  # noqa: E402
from edge.planner import SearchConfig, search  # noqa: E402
from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget  # noqa: E402
from edge.planner.objective import LatencyMix, parse_batches, parse_weights  # noqa: E402

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=64,num_heads=2"
# two blocks of head size 64: WPAC's levels give 64, 48, 32, 16 (int8 fused attention takes 16, 32 and 64)
WIDE = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=128,num_heads=2"
FAST = dict(data="fmnist-mini", samples=40, holdout=40, shortlist=3, refresh=3)


def seeded(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model(name).eval()
    for key, p in model.named_parameters():   # timm zero-initialises biases; give every layer some
        if key.endswith("bias"):
            torch.nn.init.normal_(p, std=0.02)
    return model


@pytest.fixture(scope="module")
def tiny():
    return seeded(TINY)


def estimated(model, batch: int = 1, precision: str = "fp16", align: int = 16, mlp_align: int = 64) -> LatencyTable:
    return estimate_table(grid_parts(model, GridConfig("full", align=align, mlp_align=mlp_align)), "MAXN_SUPER",
                          precision, batch)


def fake_table(table: LatencyTable, target: Target) -> LatencyTable:
    """The estimator's part latencies under another target, as edge.latency.measure.measure_table (ONNX Runtime
    here) or edge.latency.device_table (TensorRT on a Jetson) would write them: only the target differs."""
    return replace(table, target=target)


# ---- several batches ---------------------------------------------------------------------------

def test_the_cost_of_several_batches_is_the_weighted_sum_of_latency_ratios(tiny):
    one, many = estimated(tiny, 1), estimated(tiny, 32)
    mix = LatencyMix((one, many), (1.0, 3.0))                    # weights are normalised: 0.25 and 0.75
    assert mix.shares == (0.25, 0.75) and mix.batches == (1, 32)
    original, plan = ((1, 2.0), (32, 40.0)), ((1, 1.0), (32, 30.0))
    # the original's weighted mean (0.25 x 2 + 0.75 x 40 = 30.5 ms) times the plan's share (0.25 x 0.5 + 0.75 x 0.75)
    assert mix.cost(plan, original) == pytest.approx(30.5 * 0.6875, rel=1e-12)
    assert mix.cost(original, original) == pytest.approx(30.5, rel=1e-12)
    assert LatencyMix.single(one).cost(((1, 1.25),), ((1, 2.0),)) == 1.25    # one batch: the latency itself
    with pytest.raises(EdgeError, match="2 batch weights for 1 batches"):
        LatencyMix((one,), (0.5, 0.5))
    with pytest.raises(EdgeError, match="two latency tables of one batch"):
        LatencyMix((one, one), (0.5, 0.5))
    with pytest.raises(EdgeError, match="batch weight -1"):
        LatencyMix((one, many), (-1.0, 2.0))


def test_a_search_over_two_batches_scores_every_plan_at_both(tiny):
    one, many = estimated(tiny, 1), estimated(tiny, 32)
    mix = LatencyMix((one, many), (0.5, 0.5))
    result = search(tiny, {"model": TINY}, SearchConfig(budget=0.8, **FAST), mix)
    base = dict(result.original.batch_ms)
    assert base == {1: pytest.approx(predict_model(tiny, one).total_ms),
                    32: pytest.approx(predict_model(tiny, many).total_ms)}
    chosen = result.chosen
    model, _ = compress(copy.deepcopy(tiny), {"model": TINY}, CompressConfig(plan=chosen.plan, data="fmnist-mini",
                                                                              samples=40))
    ms = {1: predict_model(model, one).total_ms, 32: predict_model(model, many).total_ms}
    assert dict(chosen.batch_ms) == {b: pytest.approx(v, rel=1e-9) for b, v in ms.items()}
    share = 0.5 * ms[1] / base[1] + 0.5 * ms[32] / base[32]
    assert chosen.predicted_ms == pytest.approx((0.5 * base[1] + 0.5 * base[32]) * share, rel=1e-9)
    assert share <= 0.8 + 1e-9 < 0.5 * 1 + 0.5 * 1                   # the budget is a share of the mix
    assert result.to_json()["chosen"]["batch_ms"] == {"1": pytest.approx(ms[1]), "32": pytest.approx(ms[32])}


def test_plan_to_budget_estimates_a_table_per_batch_and_records_the_mix(tiny, tmp_path):
    target = TargetConfig(backend="estimate", batches=(1, 32), batch_weights=(1.0, 3.0))
    record = plan_to_budget(tiny, {"model": TINY}, tmp_path / "out",
                            PlanJobConfig(SearchConfig(budget=0.8, **FAST), target=target))
    out = tmp_path / "out"
    assert {"latency-table-b1.json", "latency-table-b32.json"} <= {p.name for p in out.iterdir()}
    assert [(b["batch"], b["weight"]) for b in record["batches"]] == [(1, 0.25), (32, 0.75)]
    assert LatencyTable.load(out / "latency-table-b32.json").target.batch == 32
    assert record["target"]["backend"] == "estimate" and record["timed"] is None
    _, manifest = load_artifact(out / "model")
    assert set(manifest["latency_plan"]["batch_ms"]) == {"1", "32"}


@pytest.mark.parametrize("target, search_config, message", [
    (TargetConfig(backend="estimate", batches=(1, 32)), SearchConfig(budget_ms=1.0, **FAST),
     "--budget-ms 1 with several batches"),
    (TargetConfig(backend="estimate", batches=(1, 32), batch_weights=(1.0,)), SearchConfig(budget=0.8, **FAST),
     "1 batch weights for 2 batches"),
])
def test_what_has_no_meaning_across_batches_is_refused_before_anything_is_written(tiny, tmp_path, target,
                                                                                 search_config, message):
    with pytest.raises(EdgeError, match=message):
        plan_to_budget(tiny, {"model": TINY}, tmp_path / "out", PlanJobConfig(search_config, target=target))
    assert not (tmp_path / "out").exists()


def test_a_table_of_a_batch_not_planned_for_or_a_batch_without_a_table_is_refused(tiny, tmp_path):
    path = estimated(tiny, 8).save(tmp_path / "b8.json")
    with pytest.raises(EdgeError, match="is of batch 8"):
        plan_to_budget(tiny, {"model": TINY}, tmp_path / "out", PlanJobConfig(
            SearchConfig(budget=0.8, **FAST), target=TargetConfig(table=str(path), batches=(1, 32))))
    one = estimated(tiny, 1).save(tmp_path / "b1.json")
    hosted = fake_table(LatencyTable.load(one), here(1, 2))
    hosted.save(one)
    with pytest.raises(EdgeError, match="no latency table of batch 32"):
        plan_to_budget(tiny, {"model": TINY}, tmp_path / "out", PlanJobConfig(
            SearchConfig(budget=0.8, **FAST), target=TargetConfig(table=(str(one),), batches=(1, 32))))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, expected", [("1", (1,)), ("1,32", (1, 32)), (" 4 , 8 ", (4, 8))])
def test_batches_parse(text, expected):
    assert parse_batches(text) == expected


@pytest.mark.parametrize("text, message", [("0", "each 1 <= batch"), ("1,1", "named twice"), ("1,x", "whole numbers"),
                                           ("70000", "each 1 <= batch")])
def test_batches_that_are_not_batches_are_refused(text, message):
    with pytest.raises(EdgeError, match=message):
        parse_batches(text)
    with pytest.raises(EdgeError, match="positive finite"):
        parse_weights("0.5,0")


def test_the_cli_plans_for_two_batches_with_weights(tmp_path, capfd):
    out = tmp_path / "plan"
    assert main(["plan", TINY, "--budget", "0.8x", "--backend", "estimate", "--batch", "1,32", "--batch-weights",
                 "1,3", "--data", "fmnist-mini", "--samples", "10", "--holdout", "10", "--out", str(out)]) == 0
    record = json.loads((out / "plan.json").read_text())
    assert [(b["batch"], b["weight"]) for b in record["batches"]] == [(1, 0.25), (32, 0.75)]
    assert record["search"]["shape_rules"] == "auto" and record["result"]["shape_rules"]["precision"] == "fp16"
    capfd.readouterr()
    assert main(["plan", TINY, "--budget", "0.8x", "--batch", "1,0", "--out", str(tmp_path / "no")]) == 2
    assert "argument --batch: '1,0'" in capfd.readouterr().err
    assert not (tmp_path / "no").exists()


# ---- TensorRT's fast shapes --------------------------------------------------------------------

@dataclass(frozen=True)
class FakeFineWidthSearch:
    """Width moves at a finer alignment than the planner's, mirroring wpac's WidthSearch
    (edge/compress/methods/wpac/method.py) with the real ``wpac`` steps and their ``align``/``mlp_align``
    options: block 0's heads to 12 (0.375 of 32), block 1's MLP to 100 (of 256), block 2's heads to 16, block 3's
    MLP to 64."""

    method: str = "wpac"
    MOVES = {"fine-attn:0": ((0,), "wpac:qk=0.375:v=0.375:mlp=1:blocks=0:align=4"),
             "fine-mlp:1": ((1,), "wpac:qk=1:v=1:mlp=0.390625:blocks=1:mlp_align=4"),
             "fine-attn:2": ((2,), "wpac:qk=0.5:v=0.5:mlp=1:blocks=2"),
             "fine-mlp:3": ((3,), "wpac:qk=1:v=1:mlp=0.25:blocks=3")}

    def initial(self) -> frozenset:
        return frozenset()

    def moves(self, state: Hashable) -> list[Move]:
        assert isinstance(state, frozenset)
        return [Move(key, key, state | {key}, blocks) for key, (blocks, _) in self.MOVES.items() if key not in state]

    def steps(self, state: Hashable) -> str:
        assert isinstance(state, frozenset)
        return ",".join(self.MOVES[key][1] for key in sorted(state))

    def release(self, state: Hashable, blocks: tuple[int, ...]) -> frozenset:
        assert isinstance(state, frozenset)
        return frozenset(k for k in state if not set(self.MOVES[k][0]) & set(blocks))


HEAD_12, MLP_100 = FakeFineWidthSearch.MOVES["fine-attn:0"][1], FakeFineWidthSearch.MOVES["fine-mlp:1"][1]


def fine_search(model, table: LatencyTable, **config):
    return search(model, {"model": TINY}, SearchConfig(budget=0.99, **{**FAST, **config}), table,
                  spaces=[FakeFineWidthSearch()])


@pytest.fixture(scope="module")
def fine_table(tiny):
    """Every part the fine moves make (head widths and MLP widths in steps of 4), as the estimator predicts them."""
    return estimated(tiny, align=4, mlp_align=4)


@pytest.mark.parametrize("target", [None, Target("tensorrt", "Jetson Orin Nano 8GB", "fp16", 1, None, "MAXN_SUPER")])
def test_head_12_and_width_100_are_removed_for_tensorrt_and_the_record_names_the_rule(tiny, fine_table, target):
    table = fine_table if target is None else fake_table(fine_table, target)    # estimate, or TensorRT measured
    result = fine_search(tiny, table)
    measured = {p.plan for p in result.points}
    assert HEAD_12 not in measured and MLP_100 not in measured
    assert FakeFineWidthSearch.MOVES["fine-attn:2"][1] in measured                # head 16 keeps the rules
    shapes = result.to_json()["shape_rules"]
    assert shapes["precision"] == "fp16" and shapes["removed"] == 2
    fusion, gemm = shapes["rules"]["attention-fusion"], shapes["rules"]["gemm-width"]
    assert fusion["removed"] == 1 and fusion["examples"][0]["plan"] == HEAD_12 and fusion["examples"][0]["value"] == 12
    assert "outside fp16 fused attention" in fusion["examples"][0]["what"]
    # head 12 makes a qkv 72 wide as well; the MLP of 100 is the other plan
    assert gemm["removed"] == 2 and {e["plan"] for e in gemm["examples"]} == {HEAD_12, MLP_100}
    assert shapes["original_breaks"] == [{"rule": "gemm-width", "value": 10, "part": model_parts(tiny)[-1].key,
                                          "what": "classes width 10 is not a multiple of 16"}]


def test_onnx_runtime_keeps_every_candidate_unless_asked(tiny, fine_table):
    cpu = fake_table(fine_table, here(1, 2))
    result = fine_search(tiny, cpu)
    assert {HEAD_12, MLP_100} <= {p.plan for p in result.points} and result.to_json()["shape_rules"] == {}
    asked = fine_search(tiny, cpu, shape_rules="int8")
    assert {HEAD_12, MLP_100}.isdisjoint(p.plan for p in asked.points) and asked.shapes["precision"] == "int8"
    off = fine_search(tiny, fine_table, shape_rules="off")                        # the estimator, rules off
    assert {HEAD_12, MLP_100} <= {p.plan for p in off.points}


def test_for_int8_a_head_narrowed_to_48_goes_on_to_32_and_no_plan_breaks_fused_attention():
    wide = seeded(WIDE)
    table = estimated(wide, precision="int8")
    result = search(wide, {"model": WIDE}, SearchConfig(budget=0.9, **FAST), table)
    shapes = result.shapes
    assert shapes["precision"] == "int8" and shapes["rules"]["attention-fusion"]["removed"] >= 2
    assert all(e["value"] == 48 for e in shapes["rules"]["attention-fusion"]["examples"])
    assert shapes["carried_on"]["wpac-attn:0:1"] == "wpac-attn:0:1>wpac-attn:0:2"   # 64 -> 48 (removed) -> 32
    assert any("qk=0.5" in p.plan for p in result.points)
    original = model_parts(wide)
    for point in [p for p in [result.chosen, *result.front] if p.plan]:   # the front holds the original
        model, _ = compress(copy.deepcopy(wide), {"model": WIDE}, CompressConfig(plan=point.plan, data="fmnist-mini",
                                                                                  samples=40))
        assert new_violations(model_parts(model), original, "int8") == [], point.plan
