"""benchmarks/profile_repeatability.py and evaluation_floor.py: the recorded command, the MatMul rate."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from evaluation_floor import matmul_rate  # noqa: E402
from profile_repeatability import recorded_command  # noqa: E402


def test_the_recorded_command_is_split_into_options_settings_and_graphs(tmp_path):
    graph = tmp_path / "g.onnx"
    graph.write_bytes(b"")
    settings = {"rounds": 4, "sessions": 2}
    command = ["-m", "edge.profile.fresh", "--reference", "original", "--threads", "2", "--seed", "0", "--settings",
               json.dumps(settings), "--sets", "0:1", f"original={graph}", f"other={graph}"]
    (tmp_path / "profile.done.json").write_text(json.dumps({"result": {"process": {"command": command}}}))
    options, found, graphs = recorded_command(tmp_path)
    assert options == command[:8] and found == settings and graphs == {"original": graph, "other": graph}
    graph.unlink()
    with pytest.raises(SystemExit, match=f"the graph {graph} the profile step timed is gone"):
        recorded_command(tmp_path)


def test_a_folder_without_a_profile_step_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f"--run {tmp_path}: no profile.done.json there"):
        recorded_command(tmp_path)


def test_matmul_rate_is_positive_and_finite():
    rate = matmul_rate(64, 16, 32, threads=1, calls=3)
    assert math.isfinite(rate) and rate > 0     # GFLOP/s of a real MatMul call
