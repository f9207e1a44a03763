"""benchmarks/plan_peers.py: the Torch-Pruning adapter, speed matching, the learning rate chosen on validation images,
the report writer and bad input."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch import nn

from edge.compress.load import load_model
from edge.errors import EdgeError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import plan_peers as pp  # noqa: E402
from _results import write_results  # noqa: E402


def torch_pruning_or_skip():
    try:
        return pp.import_torch_pruning()
    except EdgeError as e:
        pytest.skip(f"Torch-Pruning {pp.TORCH_PRUNING} is not installed ({pp.SETUP} installs it): {e.what}")


@pytest.fixture(scope="module")
def tp():
    """Torch-Pruning, imported once (the import is the slow part), or the test skipped with the reason."""
    return torch_pruning_or_skip()


def seeded_batches(n: int = 2, size: int = 8):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n)]


# ---------------------------------------------------------------- the Torch-Pruning adapter

@pytest.mark.parametrize("global_pruning", [False, True])
def test_pruned_widths_are_multiples_of_8_and_the_metadata_is_true(tp, global_pruning):
    model, record = pp.prune(load_model("fmnist-deit-tiny"), pp.PruneConfig(0.25, global_pruning),
                             seeded_batches())
    w = record["widths"]
    assert w["embed"] % 8 == 0 and record["params"] < 0.9 * 5_353_738   # global may keep the embedding
    for block, attn in zip(w["blocks"], (b.attn for b in model.blocks), strict=True):
        assert block["mlp"] % 8 == 0 and (block["heads"] * block["head_dim"]) % 8 == 0
        assert block["heads"] == 3                                   # head dims pruned, never whole heads
        assert attn.attn_dim == attn.num_heads * attn.head_dim == attn.proj.in_features
        assert attn.qkv.out_features == 3 * attn.attn_dim
        assert math.isclose(attn.scale, attn.head_dim ** -0.5, rel_tol=1e-12)
    assert model.embed_dim == model.num_features == w["embed"] == model.norm.normalized_shape[0]
    assert model.head.out_features == 10                            # the ignored head keeps its classes
    if not global_pruning:                                          # uniform: every block alike
        assert len({(b["head_dim"], b["mlp"]) for b in w["blocks"]}) == 1
        assert (w["embed"], w["blocks"][0]["head_dim"], w["blocks"][0]["mlp"]) == (144, 48, 576)


def test_a_pruned_model_exports_and_verifies(tp, tmp_path):
    model, _ = pp.prune(load_model("fmnist-deit-tiny"), pp.PruneConfig(0.25, False), seeded_batches())
    paths, checks = pp.export_graphs(model, "tp", tmp_path, (1,), "fmnist-deit-tiny", None)
    assert paths[1].is_file()
    assert all(v["passed"] and v["max_abs"] < 1e-4 for v in checks[1]["verification"]), checks


def test_missing_torch_pruning_names_the_set_up_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_pruning", None)       # as if not installed anywhere
    with pytest.raises(EdgeError) as e:
        pp.import_torch_pruning(tmp_path / "no-site")
    assert pp.SETUP in str(e.value) and "no-site" in str(e.value)


# ---------------------------------------------------------------- speed matching

class FakeTiming:
    """Relative speeds of a fake, monotone speed curve, with every call recorded (no model is timed)."""

    def __init__(self, speed) -> None:
        self.speed = speed
        self.calls: list[list[float]] = []

    def __call__(self, params: list[float]) -> dict[float, float]:
        self.calls.append(list(params))
        return {p: self.speed(p) for p in params}


def test_the_scan_then_bisection_converges_on_the_matching_ratio():
    fake = FakeTiming(lambda p: 0.7 + p)                            # matched at 0.3
    found = pp.match_speed(fake, [0.1, 0.2, 0.4, 0.5], refine=3)
    assert fake.calls[0] == [0.1, 0.2, 0.4, 0.5]                    # one side-by-side scan first
    assert fake.calls[1:] == [[0.3]]                                # then the bracket's midpoint: exact, stop
    assert found.parameter == pytest.approx(0.3) and abs(found.error) < 1e-9 and found.reachable


def test_bisection_narrows_the_bracket_each_step():
    fake = FakeTiming(lambda p: 0.8 + p)                            # matched at 0.2
    found = pp.match_speed(fake, [0.1, 0.3], refine=2)
    assert fake.calls[1:] == [[0.2]]
    fake = FakeTiming(lambda p: 0.75 + p)                           # matched at 0.25
    found = pp.match_speed(fake, [0.1, 0.3], refine=2)
    assert fake.calls[1:] == [[0.2], [0.25]]
    assert found.parameter == pytest.approx(0.25) and abs(found.error) < 1e-9


def test_an_unreachable_speed_keeps_the_fastest_candidate_and_says_so():
    fake = FakeTiming(lambda p: 0.5 + p)                            # never reaches 1.0 on the grid
    found = pp.match_speed(fake, [0.1, 0.2, 0.3], refine=3)
    assert len(fake.calls) == 1                                     # no bracket: no bisection
    assert found.parameter == 0.3 and not found.reachable and found.error == pytest.approx(-0.2)


def test_tome_matching_picks_an_r():
    rs = pp.tome_rs(load_model("fmnist-deit-tiny"))
    assert rs == [1, 2, 3]                                          # 50 tokens, 12 blocks: r = 4 runs out
    fake = FakeTiming({1: 0.85, 2: 0.97, 3: 1.12}.__getitem__)
    found = pp.match_speed(fake, rs, refine=2, integer=True)
    assert found.parameter == 2 and found.error == pytest.approx(-0.03)
    assert len(fake.calls) == 1                                     # 2 and 3 are neighbours: nothing between


def test_relative_speed_is_the_geometric_mean_over_batches():
    timed = {1: {"variants": {"a": {"speedup": 1.5}, "e": {"speedup": 1.5}}},
             32: {"variants": {"a": {"speedup": 2.0}, "e": {"speedup": 1.0}}}}
    assert pp.relative_speed(timed, "a", "e") == pytest.approx(math.sqrt(2.0))


# ---------------------------------------------------------------- the report

def canned_record() -> dict:
    timing = {"variants": {}, "aa_control": {"speedup": 1.01, "low": 0.98, "high": 1.03, "deviation": 0.03},
              "noisy": False, "contention": {"other_cpu_share": 0.1}, "seconds": 12.0, "iterations_per_round": 20}
    final = {}
    speeds = {"original": 1.0, "edge-a": 1.42, "tp-u": 1.43, "tp-g": 1.40, "tome-3": 1.2}
    for b in ("1", "32"):
        final[b] = json.loads(json.dumps(timing))
        for key, s in speeds.items():
            final[b]["variants"][key] = {"median_ms": 1 / s, "p90_ms": 1.1 / s, "speedup": s, "low": s - 0.02,
                                         "high": s + 0.02, "verdict": "faster"}
    widths = {"embed": 144, "blocks": [{"heads": 3, "head_dim": 48, "mlp": 576}] * 12}

    def peer(key, label, error, reachable=True, w=None):
        return {"parameter": 0.25, "relative_speed": 1 + error, "error": error, "reachable": reachable,
                "history": {}, "key": key, "label": label, "check": {"record": {"widths": w} if w else {"r": 3}}}

    def distilled(before, after):
        return {"before": {"accuracy": before}, "after": {"accuracy": after}, "teacher_sha256": "t"}

    return {
        "model": "fmnist-deit-tiny", "command": "python benchmarks/plan_peers.py --edge a", "seconds": 600.0,
        "original": {"accuracy": {"accuracy": 0.9, "samples": 10000, "data": "fmnist-test", "loss": 0.3}},
        "groups": [{"edge": {"key": "edge-a", "label": "edge `linear:6-9`", "plan": "linear:6-9"},
                    "peers": {"torch-pruning uniform": peer("tp-u", "Torch-Pruning uniform 25.0 %", 0.01, w=widths),
                              "torch-pruning global": peer("tp-g", "Torch-Pruning global 25.0 %", -0.02, w=widths),
                              "tome": peer("tome-3", "ToMe r=3", -0.15, reachable=False)}}],
        "distilled": {"edge-a": distilled(0.7, 0.8867), "tp-u": distilled(0.5, 0.8936),
                      "tp-g": distilled(0.4, 0.88), "tome-3": distilled(0.85, 0.87)},
        "final_timing": final,
        "settings": {"data": "fmnist", "epochs": 1, "steps": None, "seed": 0, "threads": 2, "taylor_batches": 10,
                     "rounds": 20, "sessions": 4, "iterations": 20, "warmup": 10},
        "versions": {"onnxruntime": "1.x", "torch_pruning": "1.6.1"},
        "hardware": {"cpu": "test CPU", "cpu_count": 2}, "load_average": {"before": [1, 1, 1], "after": [2, 2, 2]},
    }


def test_the_writer_tables_every_model_and_says_plainly_who_wins(tmp_path):
    record = canned_record()
    write_results(record, tmp_path / "r.json", tmp_path / "r.md", pp.markdown)
    assert json.loads((tmp_path / "r.json").read_text())["groups"][0]["edge"]["key"] == "edge-a"
    text = (tmp_path / "r.md").read_text()
    assert "| Torch-Pruning uniform 25.0 % | torch-pruning uniform: embed 144, attn 144, MLP 576 | 1.43x" in text
    assert "| 1.007 | +1.0 % | 50.00 % | **89.36 %** | 0.64 pt |" in text   # speed vs edge 1.43/1.42 in both
    assert "**88.67 %** | 1.33 pt |" in text                        # edge: after distillation, drop vs 90 %
    assert ("Edge loses at this speed: Torch-Pruning uniform 25.0 % keeps 89.36 %, 0.69 pt more than "
            "edge `linear:6-9` (88.67 %).") in text
    assert "ToMe r=3 is the fastest of its family that was measured and is still slower" in text
    assert "ToMe r=3 keeps" not in text                             # less accurate than edge: not named

    assert "| -15.0 % (never as fast) |" in text


def test_the_summary_compares_edge_with_each_family_and_names_a_slower_peer_as_slower():
    record = canned_record()
    lines = pp.summary(pp.rows_of(record), list(record["final_timing"]), pp.speed_slack(record))
    assert lines[-1] == ("| 1.42x / 1.42x | 1 epoch | 88.67 % | 89.36 % (-0.69 pt) | 88.00 % (+0.67 pt) | "
                         "87.00 % at 0.845 of edge's speed (+1.67 pt) |")     # edge loses to uniform: a minus


def test_the_verdict_when_edge_wins():
    record = canned_record()
    record["distilled"]["edge-a"]["after"]["accuracy"] = 0.9
    rows = pp.rows_of(record)
    assert pp.verdict(rows).startswith("Edge wins at this speed: edge `linear:6-9` keeps 90.00 %, 0.64 pt more")


def test_a_slower_peer_that_keeps_more_is_named_but_does_not_win():
    record = canned_record()
    record["distilled"]["tome-3"]["after"]["accuracy"] = 0.95          # ToMe runs at 1.2 / 1.42 of edge's speed
    text = pp.verdict(pp.rows_of(record), pp.speed_slack(record))
    assert text.startswith("Edge loses at this speed: Torch-Pruning uniform 25.0 % keeps 89.36 %")
    assert "ToMe r=3 keeps 95.00 % but runs at 0.85 of the edge model's speed (not matched)." in text
    for key in ("tp-u", "tp-g"):                                        # no peer as fast: said so
        record["distilled"][key]["after"]["accuracy"] = 0.5
        for b in record["final_timing"].values():
            b["variants"][key]["speedup"] = 1.0
    assert pp.verdict(pp.rows_of(record), 0.03).startswith("No peer reached the edge model's speed (within 3 %).")


def two_budgets() -> dict:
    """The canned record with a 3-epoch budget beside the 1-epoch one: uniform pruning catches up and passes."""
    record = canned_record()
    one = record["distilled"]
    three = json.loads(json.dumps(one))
    for key, after in {"edge-a": 0.8950, "tp-u": 0.8990, "tp-g": 0.8900, "tome-3": 0.8800}.items():
        three[key]["after"]["accuracy"] = after
    one["edge-a"]["after"]["accuracy"] = 0.8990                      # after 1 epoch edge wins, after 3 it loses
    record["distilled"] = {"1": one, "3": three}
    record["settings"]["epochs"] = [1, 3]
    return record


def test_each_budget_has_its_summary_line_table_column_and_verdict(tmp_path):
    record = two_budgets()
    lines = pp.summary(pp.rows_of(record), list(record["final_timing"]), pp.speed_slack(record))
    assert lines[-2].startswith("| 1.42x / 1.42x | 1 epoch | 89.90 % | 89.36 % (+0.54 pt) |")
    assert lines[-1].startswith("| 1.42x / 1.42x | 3 epochs | 89.50 % | 89.90 % (-0.40 pt) |")
    text = pp.markdown(record)
    assert "| accuracy before | after 1 epoch | after 3 epochs | drop vs original (3 epochs) |" in text
    assert "| 50.00 % | **89.36 %** | **89.90 %** | 0.10 pt |" in text           # uniform: before, 1 and 3 epochs
    assert "Edge wins at this speed (1 epoch): edge `linear:6-9` keeps 89.90 %, 0.54 pt more" in text
    assert ("Edge loses at this speed (3 epochs): Torch-Pruning uniform 25.0 % keeps 89.90 %, 0.40 pt more than "
            "edge `linear:6-9` (89.50 %).") in text
    assert "budget (1 epoch and 3 epochs, each budget a run of its own from the same start)" in text
    pp.plot(record, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_not_made_before_the_deadline_says_not_run_everywhere(tmp_path):
    record = two_budgets()
    del record["distilled"]["1"]["tp-g"], record["distilled"]["1"]["edge-a"]
    record["distillation"] = {"skipped": [{"budget": "1", "key": "tp-g"}, {"budget": "1", "key": "edge-a"}]}
    rows = pp.rows_of(record)
    assert next(r for r in rows if r["key"] == "tp-g")["after"] == {"1": None, "3": 0.89}
    lines = pp.summary(rows, list(record["final_timing"]), pp.speed_slack(record))
    assert lines[-2] == "| 1.42x / 1.42x | 1 epoch | not run | not run | not run | not run |"
    text = pp.markdown(record)
    assert "Not run: 2 distillations (1 epoch) did not start before the distillation run's deadline" in text
    assert "| 40.00 % | not run | **89.00 %** | 1.00 pt |" in text
    assert "Not distilled at this speed (1 epoch): the edge model's run was not made." in text
    pp.plot(record, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_is_written(tmp_path):
    pp.plot(canned_record(), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_writes_the_table_and_plot_again_from_the_results_file(tmp_path, capsys):
    out = {"--json-out": tmp_path / "r.json", "--md-out": tmp_path / "r.md", "--png-out": tmp_path / "r.png"}
    argv = ["--render", *(str(x) for pair in out.items() for x in pair)]
    with pytest.raises(SystemExit) as e:                                 # nothing measured yet: said so
        pp.main(argv)
    assert e.value.code == 2
    assert f"{out['--json-out']} does not exist" in capsys.readouterr().err
    assert not out["--md-out"].exists() and not out["--png-out"].exists()
    out["--json-out"].write_text(json.dumps(canned_record()))
    pp.main(argv)
    assert "Edge loses at this speed: Torch-Pruning uniform 25.0 % keeps 89.36 %" in out["--md-out"].read_text()
    assert out["--png-out"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("kind", ["missing", "file", "folder"])
def test_a_non_artifact_given_to_edge_is_refused_naming_it(tmp_path, capsys, kind):
    path = tmp_path / "not-an-artifact"
    if kind == "file":
        path.write_text("x")
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(SystemExit) as e:
        pp.main(["--edge", str(path), "--work", str(tmp_path / "work"), "--json-out", str(tmp_path / "r.json"),
                 "--md-out", str(tmp_path / "r.md"), "--png-out", str(tmp_path / "r.png")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--edge {path}" in err and "edge compress" in err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "work").exists()


def test_an_already_fine_tuned_artifact_is_refused(tmp_path):
    folder = tmp_path / "tuned"
    folder.mkdir()
    (folder / "edge-model.json").write_text(json.dumps({
        "format": "edge-compressed-model", "format_version": 2, "source": {"model": "fmnist-deit-tiny"},
        "plan": "linear:6-9", "steps": [], "finetune": [{"steps": 10}]}))
    with pytest.raises(EdgeError, match="already fine-tuned"):
        pp.edge_artifact(folder, "fmnist-deit-tiny")
    with pytest.raises(EdgeError, match="compressed from fmnist-deit-tiny, not from other"):
        pp.edge_artifact(folder, "other")


# ---------------------------------------------------------------- the stages across machines

def bench(tmp_path, *extra) -> pp.Benchmark:
    args = pp.parser().parse_args(["--plans", "linear:6-9", "--work", str(tmp_path / "work"), *extra])
    return pp.Benchmark(args)


def matched_group(path: str) -> dict:
    return {"edge": {"key": "edge-a", "label": "edge `linear:6-9`", "plan": "linear:6-9", "path": path},
            "peers": {"tome": {"key": "tome-3", "parameter": 3, "label": "ToMe r=3"}}}


def test_a_stage_without_matches_names_the_stage_to_run_first(tmp_path):
    b = bench(tmp_path, "--stage", "distil")
    with pytest.raises(EdgeError, match="no speed match for edge `linear:6-9`") as e:
        b.matched([{"key": "edge-a", "label": "edge `linear:6-9`"}])
    assert "--stage match" in e.value.fix


def test_an_edge_job_distils_this_machines_copy_not_the_path_the_matches_recorded(tmp_path):
    b = bench(tmp_path)
    b.items = [{"key": "edge-a", "plan": "linear:6-9", "path": str(tmp_path / "here")}]
    jobs = b.jobs([matched_group("/elsewhere/edge/linear-6-9")])
    edge = [j for j in jobs if j["family"] == "edge"]
    assert [j["budget"] for j in edge] == ["3", "1"]                   # the longest budget first
    assert all(j["item"]["path"] == str(tmp_path / "here") for j in edge)


def test_the_time_stage_refuses_missing_or_other_shaped_distillations(tmp_path):
    b = bench(tmp_path, "--stage", "time", "--distilled", str(tmp_path / "d.json"))
    b.items = [{"key": "edge-a", "plan": "linear:6-9", "path": "fmnist-deit-tiny"}]   # a model spec loads too
    groups = [matched_group("fmnist-deit-tiny")]
    with pytest.raises(EdgeError, match="no distillation records at"):
        b.read_distilled(groups)
    summary = {"before": {"accuracy": 0.9}, "after": {"accuracy": 0.9}, "teacher_sha256": "t"}
    record = {"budgets": {"3": {"edge-a": {**summary, "params": 5_353_738}, "tome-3": summary}, "1": {}},
              "skipped": [{"budget": "1", "key": "edge-a"}]}
    (tmp_path / "d.json").write_text(json.dumps(record))
    with pytest.raises(EdgeError, match="hold no 1 epoch distillation of tome-3"):  # not skipped: missing
        b.read_distilled(groups)
    record["skipped"].append({"budget": "1", "key": "tome-3"})
    (tmp_path / "d.json").write_text(json.dumps(record))
    assert b.read_distilled(groups)["budgets"]["3"]["edge-a"]["params"] == 5_353_738
    record["budgets"]["3"]["edge-a"]["params"] = 1_000
    (tmp_path / "d.json").write_text(json.dumps(record))
    with pytest.raises(EdgeError, match="edge-a was distilled with other shapes than the model timed here"):
        b.read_distilled(groups)


def test_an_earlier_results_file_fills_the_budgets_a_record_lacks_and_says_where_they_came_from(tmp_path):
    b = bench(tmp_path, "--stage", "time", "--distilled", str(tmp_path / "d.json"), str(tmp_path / "old.json"))
    b.items = [{"key": "edge-a", "plan": "linear:6-9", "path": "fmnist-deit-tiny"}]
    groups = [matched_group("fmnist-deit-tiny")]
    summary = {"before": {"accuracy": 0.9}, "after": {"accuracy": 0.9}, "teacher_sha256": "t"}
    (tmp_path / "d.json").write_text(json.dumps({
        "budgets": {"3": {"edge-a": {**summary, "params": 5_353_738}, "tome-3": summary}, "1": {}},
        "skipped": [{"budget": "1", "key": "edge-a"}, {"budget": "1", "key": "tome-3"}], "command": "gpu run"}))
    old = canned_record()                          # its edge model lay elsewhere (another key): found by its plan
    old["groups"][0]["edge"]["key"] = "edge-elsewhere"
    old["distilled"]["edge-elsewhere"] = old["distilled"].pop("edge-a")
    (tmp_path / "old.json").write_text(json.dumps(old))
    record = b.read_distilled(groups)
    one = record["budgets"]["1"]
    assert one["edge-a"]["after"]["accuracy"] == 0.8867 and one["edge-a"]["from"]["command"] == old["command"]
    assert one["edge-a"]["hardware"] == {"cpu": "test CPU", "cpu_count": 2}
    assert "from" not in record["budgets"]["3"]["edge-a"] and record["skipped"] == []
    old["groups"][0]["edge"]["plan"] = "linear:5-9"                    # another plan: not this command's model
    (tmp_path / "old.json").write_text(json.dumps(old))
    again = bench(tmp_path, "--stage", "time", "--distilled", str(tmp_path / "d.json"), str(tmp_path / "old.json"))
    again.items = b.items
    assert again.read_distilled(groups)["skipped"] == [{"budget": "1", "key": "edge-a"}]   # not run, as recorded


def test_the_time_stage_refuses_a_rate_chosen_among_other_rates(tmp_path):
    b = bench(tmp_path, "--stage", "time", "--distilled", str(tmp_path / "d.json"), "--lrs", "1e-4", "3e-4")
    b.items = [{"key": "edge-a", "plan": "linear:6-9", "path": "fmnist-deit-tiny"}]
    summary = {"before": {"accuracy": 0.9}, "after": {"accuracy": 0.9}, "teacher_sha256": "t",
               "selection": {"lrs": [1e-4, 1e-3], "chosen_lr": 1e-3}}
    (tmp_path / "d.json").write_text(json.dumps({"budgets": {"1": {"edge-a": summary, "tome-3": summary}, "3": {}},
                                                 "skipped": [{"budget": "3", "key": "edge-a"},
                                                             {"budget": "3", "key": "tome-3"}]}))
    with pytest.raises(EdgeError, match="chose its learning rate among other rates than this command's"):
        b.read_distilled([matched_group("fmnist-deit-tiny")])


# ---------------------------------------------------------------- the learning rate, chosen on validation images

VALIDATION = {"edge-a": {1e-4: 0.80, 3e-4: 0.85, 1e-3: 0.85},           # a tie: the lower rate wins
              "tome-3": {1e-4: 0.70, 3e-4: 0.72, 1e-3: 0.75}}


class Tiny(nn.Module):
    """A linear classifier of 28 x 28 gray images: what a distilled model is scored as here (no training)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def record_reads(monkeypatch, events: list) -> None:
    """Every ``edge.data.load_dataset`` call, wherever it was imported from, appends ``("read", spec, split)``."""
    import edge.data

    original = edge.data.load_dataset

    def recording(spec, split="test"):
        events.append(("read", str(spec), split))
        return original(spec, split)

    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("load_dataset") is original:
            monkeypatch.setattr(module, "load_dataset", recording)


def selecting_bench(tmp_path, monkeypatch, events: list, configs: list, *extra) -> pp.Benchmark:
    """Two models (edge, ToMe), three rates, one budget, on fmnist-mini; distillation and models faked: each run
    returns its canned validation score, every distilled model loaded is a :class:`Tiny`."""
    b = bench(tmp_path, "--data", "fmnist-mini", "--epochs", "1", "--lrs", "1e-4", "3e-4", "1e-3",
              "--val-samples", "100", "--stage", "distil", *extra)
    b.items = [{"key": "edge-a", "plan": "linear:6-9", "path": "fmnist-deit-tiny"}]

    def train(job, out, config):
        events.append(("distil", job["key"], config.lr))
        configs.append((job["key"], config))
        score = {"data": config.eval_data, "samples": 100, "accuracy": VALIDATION[job["key"]][config.lr], "loss": 1.0}
        return {"eval_before": {**score, "accuracy": 0.5}, "eval": score, "steps": 8, "epochs": 1.0,
                "teacher": {"sha256": "t"}, "recipe": asdict(config), "wall_time_s": 1.0, "hardware": {}}, {"params": 1}

    def distilled_model(job, out):
        events.append(("load", job["key"], Path(out).name))
        return Tiny()

    monkeypatch.setattr(b, "train", train)
    monkeypatch.setattr(b, "distilled_model", distilled_model)
    monkeypatch.setattr(b, "final_model", lambda *_: Tiny())
    record_reads(monkeypatch, events)
    return b


def test_the_rate_is_chosen_on_validation_and_only_the_chosen_model_reads_the_test_split(tmp_path, monkeypatch):
    events, configs = [], []
    b = selecting_bench(tmp_path, monkeypatch, events, configs)
    record = b.distil_all([matched_group("fmnist-deit-tiny")])
    distils = [i for i, e in enumerate(events) if e[0] == "distil"]
    assert len(distils) == 6 and ("read", "fmnist-mini", "train") in events[:distils[0]]   # the split, first
    assert not any(e[0] == "read" and e[2] == "test" for e in events[:distils[-1]])       # nothing tested meanwhile
    assert events[distils[-1] + 1:] == [("read", "fmnist-mini", "test"), ("load", "edge-a", "lr-0.0003"),
                                        ("read", "fmnist-mini", "test"), ("load", "tome-3", "lr-0.001")]
    one = record["budgets"]["1"]
    assert one["edge-a"]["selection"]["chosen_lr"] == 3e-4                # 0.85 twice: the lower rate
    assert one["tome-3"]["selection"]["chosen_lr"] == 1e-3
    assert {k: v["accuracy"] for k, v in one["edge-a"]["selection"]["validation"].items()} == \
        {"0.0001": 0.80, "0.0003": 0.85, "0.001": 0.85}
    for summary in one.values():                                           # the test figures, of the chosen run
        assert summary["after"]["data"] == summary["before"]["data"] == "fmnist-mini:test"
        assert summary["after"]["samples"] == 2000 and 0 <= summary["after"]["accuracy"] <= 1
        assert summary["out"].endswith(f"lr-{summary['selection']['chosen_lr']:g}")
    assert json.loads(b.distilled_path.read_text())["budgets"] == json.loads(json.dumps(record["budgets"]))
    split = b.split().data                                  # same data, seed, budget for every model and rate
    assert {(c.data, c.eval_data, c.seed, c.epochs, c.steps, c.batch_size) for _, c in configs} == \
        {(split, split, 0, 1, None, 128)}
    assert sorted(c.lr for key, c in configs if key == "tome-3") == [1e-4, 3e-4, 1e-3]


def test_a_model_with_a_rate_not_run_is_skipped_whole_and_never_tested(tmp_path, monkeypatch):
    events, configs = [], []
    b = selecting_bench(tmp_path, monkeypatch, events, configs, "--deadline", "-1")   # passed before any run
    record = b.distil_all([matched_group("fmnist-deit-tiny")])
    assert record["budgets"]["1"] == {} and not configs
    assert record["skipped"] == [{"budget": "1", "key": "edge-a"}, {"budget": "1", "key": "tome-3"}]
    assert not any(e[0] == "read" and e[2] == "test" for e in events)


def image_rows(data) -> list[bytes]:
    return [row.tobytes() for row in data.images.flatten(1).numpy()]


def test_the_validation_images_are_held_out_of_the_images_the_distillation_trains_on(tmp_path):
    from edge.compress.finetune import held_out_set
    from edge.data import calibration_set, holdout_set, load_dataset
    from edge.train.batches import training_set

    b = bench(tmp_path, "--data", "fmnist-mini", "--val-samples", "100")
    split = b.split()
    config = b.recipe("1", 3e-4, split.data)
    trained = training_set(config.data, config.train_samples, config.seed)      # what edge's fine-tune trains on
    validation = held_out_set(config)                                           # and scores each rate on
    source = image_rows(load_dataset("fmnist-mini", "train"))
    assert len(set(source)) == len(source) == 1000                              # no two alike: rows name images
    assert len(validation) == 100 and len(trained) == 900
    assert not set(image_rows(validation)) & set(image_rows(trained))
    assert sorted(image_rows(validation) + image_rows(trained)) == sorted(source)
    assert torch.bincount(validation.labels, minlength=10).tolist() == [10] * 10   # class-balanced
    assert image_rows(validation) == image_rows(holdout_set("fmnist-mini", 100, 0, calibration=640))
    assert not set(image_rows(calibration_set("fmnist-mini", 640, 0))) & set(image_rows(validation))
    assert split.record["train_images"] == 900 and b.split().folder == split.folder


def test_the_rates_and_the_validation_images_are_checked_before_any_work(tmp_path, capsys):
    argv = ["--plans", "linear:6-9", "--work", str(tmp_path / "work"), "--val-samples", "0"]
    with pytest.raises(SystemExit) as e:
        pp.main(argv)
    assert e.value.code == 2 and "--val-samples 0 holds no validation images out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        pp.main([*argv[:4], "--lrs", "1e-4", "1e-4"])
    assert e.value.code == 2 and "distinct learning rates above 0" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def with_selection(record: dict) -> dict:
    """The canned record as the selection writes it: rates 1e-4 and 3e-4 tried, 3e-4 chosen for every model."""
    for d in record["distilled"].values():
        d["selection"] = {"lrs": [1e-4, 3e-4], "chosen_lr": 3e-4,
                          "rule": "the highest validation accuracy; ties: the lower rate",
                          "validation": {"0.0001": {"accuracy": 0.81}, "0.0003": {"accuracy": 0.84}},
                          "split": {"train_images": 55000, "validation_images": 5000, "calibration_excluded": 640}}
    return record


def test_the_tables_show_the_rate_chosen_and_every_rates_validation_accuracy(tmp_path):
    text = pp.markdown(with_selection(canned_record()))
    assert "on the 55,000 training images of `fmnist` left beside 5,000 validation images" in text
    assert "rate was chosen among 1e-4, 3e-4 on those validation images" in text
    assert "| 50.00 % | **89.36 %** at lr 3e-4 | 0.64 pt |" in text                # the test accuracy of the chosen
    assert "| model | distillation | lr 1e-4 | lr 3e-4 | chosen | test accuracy |" in text
    assert "| edge `linear:6-9` | 1 epoch | 81.00 % | **84.00 %** | 3e-4 | 88.67 % |" in text
    assert ("Edge loses at this speed: Torch-Pruning uniform 25.0 % keeps 89.36 %, 0.69 pt more than "
            "edge `linear:6-9` (88.67 %).") in text                              # the verdict reads the test figures
    mixed = with_selection(canned_record())
    mixed["distilled"]["tome-3"] = {**canned_record()["distilled"]["tome-3"], "recipe": {"lr": 1e-4}}
    text = pp.markdown(mixed)                                              # an earlier record of one rate, marked
    assert "| 85.00 % | **87.00 %** at fixed lr 1e-4 | 3.00 pt |" in text
    assert "Runs marked `fixed lr` come from a record of one rate, not chosen." in text

