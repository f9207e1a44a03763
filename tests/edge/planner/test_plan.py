"""edge plan: one plan across the methods within a latency budget (search, cache, record, bad input)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from edge._compat import ensure_torchvision_importable

ensure_torchvision_importable()

from edge.compress import CompressConfig, compress, load_artifact  # noqa: E402
from edge.compress.method import BuildCache  # noqa: E402
from edge.compress.registry import method_named  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.latency import LatencyTable, Target, predict_model  # noqa: E402
from edge.latency.grid import GridConfig, grid_parts  # noqa: E402
from edge.latency.orin import estimate_table  # noqa: E402
from edge.models import create_model  # noqa: E402
from edge.models.info import model_info  # noqa: E402
from edge.planner import Point, SearchConfig, pareto_front, search  # noqa: E402
from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget, wanted_target  # noqa: E402

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=64,num_heads=2"
SOURCE = {"model": TINY}
FAST = dict(data="fmnist-mini", samples=40, holdout=40, shortlist=3, refresh=3)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = create_model(TINY).eval()
    for name, p in model.named_parameters():   # timm zero-initialises biases; give every layer some
        if name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.02)
    return model


@pytest.fixture(scope="module")
def table(tiny):
    """A table that times nothing: the Orin Nano estimator's prediction of every part a plan can make."""
    return estimate_table(grid_parts(tiny, GridConfig("full", align=16, mlp_align=64)), "MAXN_SUPER", "fp16", 1)


def test_search_spaces_write_the_methods_own_steps(tiny):
    info = model_info(tiny)
    spans = method_named("block-approximation").search_space(info)
    assert spans.steps(frozenset({0, 1, 3})) == "linear:-1-1,linear:2-3"
    assert spans.steps(frozenset()) == ""
    width = method_named("wpac").search_space(info)
    state = ((0, 0), (1, 2), (0, 0), (1, 2))
    assert width.steps(state) == "wpac:qk=0.75:v=0.75:mlp=0.5:blocks=1+3"
    moves = width.moves(width.initial())
    assert len(moves) == 4 * 2 * 2 and len({m.key for m in moves}) == len(moves)   # the next level, or the last
    assert {m.key for m in width.moves(state) if m.key.endswith(":3")} == {
        f"wpac-{part}:{b}:3" for part in ("attn", "mlp") for b in range(4)}
    dw = method_named("dwconv").search_space(info)
    assert dw.steps(frozenset({2, 0})) == "dwconv:blocks=0+2"
    rm = method_named("attnrm").search_space(info)
    assert rm.steps(frozenset({1})) == "attnrm:blocks=1:init=affine"


def test_a_shared_build_cache_gives_the_same_model_as_compressing_alone(tiny):
    """Steps fitted once and reused in another plan: the same weights as the plan compressed from scratch."""
    plan = "linear:0-1,attnrm:blocks=2:init=affine,dwconv:blocks=3,wpac:qk=0.5:v=0.5:mlp=0.5:blocks=0"
    config = CompressConfig(plan=plan, data="fmnist-mini", samples=40)
    alone, manifest = compress(copy.deepcopy(tiny), SOURCE, config)
    cache = BuildCache()
    for other in ("dwconv:blocks=3", "wpac:qk=0.5:v=0.5:mlp=0.5:blocks=0,linear:0-1", plan):
        shared, shared_manifest = compress(copy.deepcopy(tiny), SOURCE, CompressConfig(plan=other, data="fmnist-mini",
                                                                                       samples=40), cache=cache)
    assert cache.hits >= 2                               # dwconv:3, wpac:0 and linear:0-1 came from the cache
    assert shared_manifest["plan"] == manifest["plan"]
    a, b = alone.state_dict(), shared.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7, msg=key)
    with pytest.raises(ValueError, match="one cache per model"):
        compress(copy.deepcopy(tiny), {"model": "another"}, config, cache=cache)


def test_pareto_front_keeps_only_plans_no_other_beats_on_both():
    points = [Point("a", 0.0, 1, 0, 10.0), Point("b", 0.2, 1, 0, 8.0), Point("c", 0.3, 1, 0, 9.0),
              Point("d", 0.1, 1, 0, 8.0), Point("e", 0.5, 1, 0, 5.0)]
    assert [p.plan for p in pareto_front(points)] == ["e", "d", "a"]


def test_search_reaches_the_budget_deterministically_and_explains_each_round(tiny, table):
    config = SearchConfig(budget=0.7, **FAST)
    first = search(tiny, SOURCE, config, table)
    again = search(tiny, SOURCE, config, table)
    assert first.chosen == again.chosen and first.rounds == again.rounds       # same inputs, same plan
    assert first.chosen.predicted_ms <= first.budget_ms == pytest.approx(0.7 * first.original.predicted_ms)
    assert first.rounds
    for before, row in zip([first.original.predicted_ms] + [r["predicted_ms"] for r in first.rounds], first.rounds):
        assert row["predicted_ms"] < before                                  # every move saves latency
        assert row["why"].startswith("least KL lost per ms saved")
        assert row["candidates"][0]["move"] == row["move"]                   # the cheapest measured move won
    assert set(first.spaces) == {"block-approximation", "attnrm", "dwconv", "wpac"}
    assert first.chosen in first.points and first.front[0].predicted_ms <= first.chosen.predicted_ms
    # what the methods refused (a width below one unit of alignment here) is recorded with their reason, not run
    assert first.refused and all(why and plan not in {p.plan for p in first.points}
                                 for plan, why in first.refused.items())
    assert any("below one alignment unit" in why for why in first.refused.values())
    # the prediction of the chosen plan is the table's prediction of the plan compressed by edge compress
    model, _ = compress(copy.deepcopy(tiny), SOURCE, CompressConfig(plan=first.chosen.plan, data="fmnist-mini",
                                                                    samples=40))
    assert predict_model(model, table).total_ms == pytest.approx(first.chosen.predicted_ms, rel=1e-9)


def test_a_budget_no_plan_reaches_names_the_fastest(tiny, table):
    with pytest.raises(EdgeError, match=r"(?s)no plan reaches .*fastest plan there is \(linear:-1-3"):
        search(tiny, SOURCE, SearchConfig(budget=0.01, **FAST), table)


@pytest.mark.parametrize("budget, budget_ms, message", [
    (1.5, None, "is not a speed-up"), (None, None, "give one latency budget"), (0.5, 3.0, "give one latency budget"),
    (0.0, None, "is not a speed-up"),
])
def test_budgets_that_are_not_budgets_are_refused(budget, budget_ms, message):
    with pytest.raises(EdgeError, match=message):
        SearchConfig(budget=budget, budget_ms=budget_ms).check()


def test_a_table_of_another_target_is_refused_naming_both(table, tmp_path):
    path = table.save(tmp_path / "orin.json")
    asked = TargetConfig(table=str(path), backend="onnxruntime")
    with pytest.raises(EdgeError, match="another target") as caught:
        plan_to_budget(create_model(TINY), SOURCE, tmp_path / "out", PlanJobConfig(SearchConfig(budget=0.5),
                                                                                   target=asked))
    text = str(caught.value)
    assert "estimate on Jetson Orin Nano" in text and "onnxruntime on Jetson" in text   # both targets named
    assert not (tmp_path / "out").exists()                                  # nothing written
    other = TargetConfig(table=str(path), device="Jetson AGX Orin")
    with pytest.raises(EdgeError, match="device"):
        plan_to_budget(create_model(TINY), SOURCE, tmp_path / "out", PlanJobConfig(SearchConfig(budget=0.5),
                                                                                   target=other))
    # fields left out are the table's: the table's own target is accepted
    assert wanted_target(TargetConfig(), LatencyTable.load(path)) == table.target


def test_plan_to_budget_writes_a_restorable_model_and_its_record(tiny, table, tmp_path):
    path = table.save(tmp_path / "orin.json")
    config = PlanJobConfig(SearchConfig(budget=0.75, **FAST), target=TargetConfig(table=str(path)), measure=2)
    record = plan_to_budget(tiny, SOURCE, tmp_path / "out", config)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["model", "pareto.png", "plan.json", "plan.md"]
    assert json.loads((out / "plan.json").read_text())["result"]["chosen"]["plan"] == record["result"]["chosen"]["plan"]
    assert record["timed"] is None                         # an estimator's table: nothing here to time it on
    model, manifest = load_artifact(out / "model")
    assert manifest["plan"] == record["result"]["chosen"]["plan"]
    assert predict_model(model, table).total_ms == pytest.approx(record["result"]["chosen"]["predicted_ms"])
    assert "Chosen plan" in (out / "plan.md").read_text()
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_a_table_from_the_device_target_with_its_own_backend_is_used(tiny, table):
    """The device runner's tables carry their backend and device: asking for them by name passes the check."""
    asked = TargetConfig(backend=table.target.backend, device=table.target.device, batch=1)
    assert wanted_target(asked, table) == table.target
    assert isinstance(table.target, Target)


def test_a_plan_that_misses_the_budget_when_timed_tightens_it_by_how_optimistic_its_prediction_was():
    from edge.planner.job import _verdict

    timed = {"plans": [{"speedup": 1.6, "predicted_speedup": 2.0, "measured_ms": 5.0, "predicted_ms": 4.0}]}
    met, factor = _verdict(SearchConfig(budget=0.5), 4.2, timed)
    assert not met and factor == pytest.approx(1.25)          # walk on to 4.2 / 1.25 ms predicted
    assert _verdict(SearchConfig(budget=0.625), 5.0, timed)[0]  # 1.6x is enough for 0.625x
    met, factor = _verdict(SearchConfig(budget_ms=4.5), 4.5, timed)
    assert not met and factor == pytest.approx(1.25)          # 5.0 ms measured against 4.5 asked
    assert _verdict(SearchConfig(budget_ms=5.0), 5.0, timed)[0]


def test_the_search_walks_on_from_where_it_stopped(tiny, table):
    from edge.planner.search import Search

    walk = Search(tiny, SOURCE, SearchConfig(budget=0.9, **FAST), table)
    first = walk.run_to(0.9 * walk.original.predicted_ms)
    rounds = len(walk.rounds)
    second = walk.run_to(0.7 * walk.original.predicted_ms)
    assert second.predicted_ms <= 0.7 * walk.original.predicted_ms < first.predicted_ms
    assert len(walk.rounds) > rounds and walk.rounds[rounds - 1]["plan"] == first.plan   # the walk went on
    whole = search(tiny, SOURCE, SearchConfig(budget=0.7, **FAST), table)
    assert whole.chosen.plan == second.plan                   # the same as walking there at once


def test_a_move_takes_its_blocks_from_the_other_methods(tiny):
    """After every block was narrowed, removing one drops its width cut (no dead end of refused plans)."""
    from edge.compress.plan import parse_plan

    info = model_info(tiny)
    width = method_named("wpac").search_space(info)
    spans = method_named("block-approximation").search_space(info)
    narrowed = ((1, 2),) * 4
    remove = next(m for m in spans.moves(spans.initial()) if m.key == "remove:2")
    assert remove.blocks == (2,)
    released = width.release(narrowed, remove.blocks)
    assert released == ((1, 2), (1, 2), (0, 0), (1, 2))
    text = ",".join([spans.steps(remove.state), width.steps(released)])
    assert text == "linear:1-2,wpac:qk=0.75:v=0.75:mlp=0.5:blocks=0+1+3"
    parse_plan(text).validate(info.num_blocks)                  # the methods accept it
    with pytest.raises(EdgeError, match="narrows block 2"):     # without the release they would not
        parse_plan(",".join([spans.steps(remove.state), width.steps(narrowed)])).validate(info.num_blocks)
    dw = method_named("dwconv").search_space(info)
    assert dw.release(frozenset({1, 2}), (2,)) == frozenset({1})
    assert spans.release(frozenset({1, 2}), (2,)) == frozenset({1})


def test_a_minimum_step_takes_only_moves_that_save_it_until_none_does(tiny, table):
    free = search(tiny, SOURCE, SearchConfig(budget=0.5, **FAST), table)
    stepped = search(tiny, SOURCE, SearchConfig(budget=0.5, min_step=0.1, **FAST), table)
    original = stepped.original.predicted_ms

    def small(candidate: dict) -> bool:   # saves something, less than 10 %
        return 0 < original - candidate["predicted_ms"] < 0.1 * original

    # round 1 measures the same moves; those saving under 10 % of the original get no cost (never taken) with it
    first_free, first_stepped = free.rounds[0]["candidates"], stepped.rounds[0]["candidates"]
    assert any(small(c) for c in first_stepped) and any(not small(c) for c in first_stepped)
    assert all(c["cost_kl_per_ms"] is None for c in first_stepped if small(c))
    assert all(c["cost_kl_per_ms"] is not None for c in first_free if small(c))
    assert stepped.rounds[0]["saved_ms"] >= 0.1 * original
    # a minimum no move meets is dropped for the rest of the walk: then it is the plain search
    beyond = search(tiny, SOURCE, SearchConfig(budget=0.5, min_step=0.3, **FAST), table)
    assert beyond.chosen == free.chosen and [r["move"] for r in beyond.rounds] == [r["move"] for r in free.rounds]


def test_a_minimum_step_out_of_range_is_refused():
    with pytest.raises(EdgeError, match="min_step"):
        SearchConfig(budget=0.5, min_step=0.9).check()


def test_the_whole_model_check_times_what_edge_export_and_edge_clean_make_in_a_fresh_process(tiny, table, tmp_path):
    """The timed graphs are in OUT/timed and are the graphs `edge export` + `edge clean` make of OUT/model."""
    from dataclasses import replace

    import numpy as np

    from edge.check.compare import ort_session
    from edge.compress.load import load_model
    from edge.export import ExportConfig, export
    from edge.graph.clean import clean_file
    from edge.graph.passes import select_passes
    from edge.latency.table import here
    from edge.models import data_config

    path = replace(table, target=here(1, 1)).save(tmp_path / "here.json")   # the estimate's figures, "timed here"
    config = PlanJobConfig(SearchConfig(budget=0.75, **FAST), target=TargetConfig(table=str(path)), measure=2,
                           correct=0, whole_iterations=4, whole_rounds=2, whole_sessions=1)
    out = tmp_path / "out"
    record = plan_to_budget(tiny, SOURCE, out, config)
    timed = record["timed"]
    assert timed["plans"][0]["plan"] == record["result"]["chosen"]["plan"]
    assert timed["graphs"]["original"] == "timed/original.onnx" and timed["plans"][0]["graph"] == "timed/plan0.onnx"
    assert sorted(p.name for p in (out / "timed").iterdir()) == sorted(
        f"{name}.onnx" for name in timed["graphs"])
    assert timed["protocol"]["process"].startswith("fresh: -m edge.profile.fresh --reference original")
    assert "timed/plan0.onnx" in timed["protocol"]["retime"] and timed["aa_control"]["of"] == "original"
    assert all(row["speedup"] > 0 and row["speedup_interval"][0] <= row["speedup_interval"][1]
               for row in timed["plans"])
    # a user's graph of the chosen plan: edge export OUT/model, then edge clean
    model = load_model(str(out / "model"))
    export(model, tmp_path / "user.onnx", source=str(out / "model"), plan=None, data_config=data_config(model),
           config=ExportConfig(batch=1))
    clean_file(tmp_path / "user.onnx", tmp_path / "user.clean.onnx", select_passes())
    mine, users = onnx_graph(out / "timed/plan0.onnx"), onnx_graph(tmp_path / "user.clean.onnx")
    assert [n.op_type for n in mine.graph.node] == [n.op_type for n in users.graph.node]
    x = np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(ort_session(str(out / "timed/plan0.onnx")).run(None, {"input": x})[0],
                               ort_session(str(tmp_path / "user.clean.onnx")).run(None, {"input": x})[0],
                               rtol=0, atol=1e-6)
    assert "fresh process" in (out / "plan.md").read_text()


def onnx_graph(path):
    import onnx

    return onnx.load(str(path))


def test_with_several_batches_each_batch_is_timed_on_its_own_graphs(tiny, tmp_path):
    """One folder of timed graphs per batch (static batch each); the row mixes the batches' measured ratios."""
    from dataclasses import replace

    import onnx

    from edge.latency.table import here

    paths = tuple(str(replace(estimate_table(grid_parts(tiny, GridConfig("full", batch, align=16, mlp_align=64)),
                                             "MAXN_SUPER", "fp16", batch), target=here(batch, 1))
                      .save(tmp_path / f"b{batch}.json")) for batch in (1, 2))
    config = PlanJobConfig(SearchConfig(budget=0.8, **FAST), target=TargetConfig(table=paths, batches=(1, 2)),
                           measure=1, correct=0, whole_iterations=2, whole_rounds=2,
                           whole_sessions=1)
    record = plan_to_budget(tiny, SOURCE, tmp_path / "out", config)
    timed = record["timed"]
    for batch in (1, 2):
        graphs = timed["batches"][str(batch)]["graphs"]
        assert graphs == {"original": f"timed/b{batch}/original.onnx", "plan0": f"timed/b{batch}/plan0.onnx"}
        shape = onnx.load(str(tmp_path / "out" / graphs["plan0"])).graph.input[0].type.tensor_type.shape
        assert shape.dim[0].dim_value == batch
    row = timed["plans"][0]
    per_batch = [timed["batches"][str(b)]["plans"][0]["speedup"] for b in (1, 2)]
    assert row["speedup"] == pytest.approx(1 / (0.5 / per_batch[0] + 0.5 / per_batch[1]))


def test_a_shared_cache_fits_attention_steps_of_every_block_in_one_pass_with_the_same_weights(tiny):
    """edge plan builds dwconv and attnrm steps block by block: with a shared cache one pass over the calibration
    images serves every block, and each block's weights are those of compressing it alone, bit for bit."""
    cache, passes = BuildCache(), {"alone": 0, "shared": 0}

    def counted(kind: str):
        model = copy.deepcopy(tiny)
        model.patch_embed.register_forward_pre_hook(lambda *_: passes.__setitem__(kind, passes[kind] + 1))
        return model

    for block in range(4):
        for plan in (f"dwconv:blocks={block}", f"attnrm:blocks={block}:init=affine"):
            config = CompressConfig(plan=plan, data="fmnist-mini", samples=40, batch_size=64)
            alone, _ = compress(counted("alone"), SOURCE, config)
            shared, _ = compress(counted("shared"), SOURCE, config, cache=cache)
            a, b = alone.state_dict(), shared.state_dict()
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), (plan, key)
    # the fits' passes (one batch each): alone, per dwconv plan the attention statistics and the kernel fit, per
    # attnrm plan the moments; shared, each of those once, whatever the block (compress's own forwards, counting
    # FLOPs, are the same in both)
    assert passes["alone"] - passes["shared"] == 4 * (2 + 1) - (2 + 1)
