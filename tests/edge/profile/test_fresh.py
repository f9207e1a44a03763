"""edge.profile.fresh: graphs timed side by side with an A/A control in a new process (no timing asserted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.errors import EdgeError
from edge.profile.fresh import command, main, time_fresh, time_fresh_settings
from edge.profile.graphs import TimingConfig
from edge.profile.sidebyside import SideBySideConfig

TINY_TIMING = TimingConfig(threads=1, warmup=1, iterations=4, rounds=2, sessions=1)


def matmul_graph(path: Path, width: int) -> Path:
    """One MatMul of a (1, width) input by a seeded (width, width) weight."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((width, width)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["logits"])], "matmul",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, width])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_two_graphs_are_timed_in_another_process_with_an_aa_control(tmp_path):
    graphs = {"original": matmul_graph(tmp_path / "big.onnx", 64), "plan0": matmul_graph(tmp_path / "small.onnx", 8)}
    timed = time_fresh(graphs, "original", TINY_TIMING)
    assert set(timed["graphs"]) == {"original", "plan0", "original (A/A)"}
    assert timed["graphs"]["original"]["speedup"] == 1.0              # the reference against itself, per round
    for name, path in graphs.items():
        row = timed["graphs"][name]
        assert row["model"] == str(path) and row["median_ms"] > 0 and row["speedup"] > 0
        assert row["iterations"] == 4 and len(row["round_medians_ms"]) == 2   # 2 rounds of 2 calls
    assert timed["aa_control"]["of"] == "original" and timed["reference"] == "original"
    assert timed["settings"]["sessions"] == 1 and timed["settings"]["iterations"] == 2
    process = timed["process"]
    assert process["fresh"] and process["command"][:2] == ["-m", "edge.profile.fresh"]
    assert "original=" + str(graphs["original"]) in process["command"]


def test_every_interleaving_setting_reaches_the_new_process_and_the_whole_summary_comes_back(tmp_path):
    """edge pipeline's profile step: its recipe's settings (turn-based iterations, spinning, tolerance) as given,
    and every graph's full statistics (percentiles, CV, verdicts), not the compact record."""
    graphs = {"original": matmul_graph(tmp_path / "big.onnx", 64), "w": matmul_graph(tmp_path / "small.onnx", 8)}
    settings = SideBySideConfig(warmup=1, rounds=4, sessions=2, turn_ms=2.0, aa_tolerance=0.5, resamples=100, seed=3)
    timed = time_fresh_settings(graphs, "original", settings, threads=1, seed=5)
    assert timed["settings"] == {**settings.__dict__}
    assert set(timed["variants"]) == {"original", "w", "original (A/A)"} and timed["reference"] == "original"
    for name in graphs:
        latency = timed["variants"][name]["latency"]
        assert len(latency["round_medians_ms"]) == 4 and latency["p10_ms"] <= latency["median_ms"] <= latency["p90_ms"]
        assert timed["variants"][name]["speedup"]["verdict"]
    counts = timed["iterations_per_round"]               # from turn_ms, not the compact protocol's fixed count
    assert set(counts) == set(timed["variants"]) and all(3 <= c <= 200 for c in counts.values())
    assert counts["original"] == counts["original (A/A)"]
    command_line = timed["process"]["command"]
    assert command_line[command_line.index("--seed") + 1] == "5"
    assert command_line[command_line.index("--threads") + 1] == "1"


def test_the_command_line_carries_the_protocol(tmp_path):
    args = command({"original": tmp_path / "a.onnx"}, "original", TINY_TIMING, batch=4)
    for flag, value in (("--threads", "1"), ("--iterations", "4"), ("--rounds", "2"), ("--sessions", "1"),
                        ("--warmup", "1"), ("--batch", "4"), ("--reference", "original")):
        assert args[args.index(flag) + 1] == value
    assert args[-1] == f"original={tmp_path / 'a.onnx'}"


def test_a_missing_graph_is_named_before_any_process_starts(tmp_path):
    good = matmul_graph(tmp_path / "a.onnx", 8)
    with pytest.raises(EdgeError, match="plan0: .*missing.onnx does not exist"):
        time_fresh({"original": good, "plan0": tmp_path / "missing.onnx"}, "original", TINY_TIMING)
    with pytest.raises(EdgeError, match="reference 'other' is not among"):
        time_fresh({"original": good}, "other", TINY_TIMING)


def test_a_graph_that_is_not_onnx_fails_naming_it(tmp_path):
    good = matmul_graph(tmp_path / "a.onnx", 8)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all \x00\xff")
    with pytest.raises(EdgeError, match="fresh process failed") as caught:
        time_fresh({"original": good, "plan0": bad}, "original", TINY_TIMING)
    assert f"graph plan0: {bad} is not a valid ONNX model" in str(caught.value)


def test_the_entry_point_refuses_a_reference_it_does_not_time(tmp_path, capsys):
    good = matmul_graph(tmp_path / "a.onnx", 8)
    assert main(["--reference", "other", f"original={good}"]) == EdgeError.exit_code
    assert "--reference other" in capsys.readouterr().err
    assert os.path.exists(good)


def test_counts_must_name_every_graph_timed_and_come_with_sets(tmp_path, capsys):
    good = matmul_graph(tmp_path / "a.onnx", 8)
    base = ["--reference", "original", "--settings", '{"rounds": 2, "sessions": 1}']
    assert main([*base, "--sets", "0:1", "--counts", '{"original": 3}', f"original={good}"]) == EdgeError.exit_code
    assert "--counts names other graphs than those timed" in capsys.readouterr().err   # the A/A twin is missing
    assert main([*base, "--counts", '{"original": 3, "original (A/A)": 3}', f"original={good}"]) == EdgeError.exit_code
    assert "--counts without --sets" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--sets", "0:1", "--counts", '{"original": 0}', f"original={good}"])
    assert "expected a JSON object of whole numbers >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("settings, message", [
    ('{"roundz": 4}', "unknown setting 'roundz'"),
    ('{"rounds": 0}', r"--settings: rounds is out of range.*expected: >= 2"),
    ('{"seed": 1.5}', r"--settings: seed has the wrong type.*expected: an integer"),
    ('{"spinning": "yes"}', r"--settings: spinning has the wrong type.*true or false"),
    ('{"iterations": "many"}', r"--settings: iterations has the wrong type.*an integer or null"),
    ('[1, 2]', "not a JSON object"),
])
def test_bad_settings_are_named_before_anything_is_timed(tmp_path, capsys, settings, message):
    graph = matmul_graph(tmp_path / "a.onnx", 8)
    assert main(["--reference", "original", "--settings", settings, f"original={graph}"]) != 0
    out = capsys.readouterr()
    assert out.out == ""
    assert re.search(message, out.err, re.S), out.err


def test_session_sets_split_between_processes_pool_into_one_summary(tmp_path):
    """edge pipeline's profile step: one session set per new process, the same count of calls in each, pooled."""
    graphs = {"original": matmul_graph(tmp_path / "big.onnx", 64), "w": matmul_graph(tmp_path / "small.onnx", 8)}
    settings = SideBySideConfig(warmup=1, rounds=6, sessions=3, turn_ms=2.0, resamples=100, seed=3)
    timed = time_fresh_settings(graphs, "original", settings, threads=1, processes=2)
    assert timed["settings"] == {**settings.__dict__}                       # iterations: None, as given
    commands = timed["process"]["commands"]
    assert timed["process"]["processes"] == 2 and len(commands) == 2
    assert [c[c.index("--sets") + 1] for c in commands] == ["0:1", "1:2"]   # sets 0 | 1, 2
    later = json.loads(commands[1][commands[1].index("--settings") + 1])
    assert later["iterations"] is None and "--counts" not in commands[0]    # as given; the first process counts
    counts = json.loads(commands[1][commands[1].index("--counts") + 1])
    assert counts == timed["iterations_per_round"]                          # ... and the second times as many
    assert timed["creation_orders"] == [["original", "w", "original (A/A)"], ["w", "original (A/A)", "original"],
                                        ["original (A/A)", "original", "w"]]
    for name in (*graphs, "original (A/A)"):
        latency = timed["variants"][name]["latency"]
        assert len(latency["round_medians_ms"]) == 6 and latency["iterations"] == 6 * counts[name]
    assert timed["contention"]["processes"] == 2 and timed["variants"]["original"]["speedup"]["speedup"] == 1.0


def test_processes_are_checked_against_the_session_sets(tmp_path, capsys):
    graph = matmul_graph(tmp_path / "a.onnx", 8)
    settings = SideBySideConfig(warmup=0, rounds=2, sessions=1, iterations=1)
    with pytest.raises(EdgeError, match="2 processes for 1 session sets"):
        time_fresh_settings({"original": graph}, "original", settings, threads=1, processes=2)
    given = json.dumps({"rounds": 4, "sessions": 2})
    assert main(["--reference", "original", "--settings", given, "--sets", "1:2", f"original={graph}"]) != 0
    out = capsys.readouterr()
    assert out.out == "" and "--sets 1:2" in out.err and "session sets among 0 to 1" in out.err
    assert main(["--reference", "original", "--sets", "0:1", f"original={graph}"]) != 0
    assert "--sets without --settings" in capsys.readouterr().err


def test_a_timing_process_imports_no_torch(tmp_path):
    """Five timing processes per pipeline run: torch's import (3 s each) is no part of timing ONNX graphs."""
    graph = matmul_graph(tmp_path / "a.onnx", 8)
    code = ("import sys; sys.argv = ['fresh', '--reference', 'a', 'a=" + str(graph) + "', '--settings', "
            "'{\"rounds\": 2, \"sessions\": 1, \"warmup\": 1, \"iterations\": 1}', '--sets', '0:1']; "
            "import edge.profile.fresh as f; code = f.main(sys.argv[1:]); "
            "assert code == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["timed"]["iterations"] == {"a": 1, "a (A/A)": 1}
