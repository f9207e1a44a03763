"""benchmarks/subnetworks.py: the fit that explains where realisation stops (pure arithmetic on its figures)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from subnetworks import fixed_cost  # noqa: E402


def _batch(points: list[tuple[str, float, float]]) -> dict:
    return {"batch": 32, "rows": [{"variant": v, "flops": f, "latency": {"median_ms": ms}} for v, f, ms in points]}


def test_latency_linear_in_the_macs_gives_one_realisation_at_every_size():
    # 20 ms that no width cut touches, 80 ms that scales: a quarter of the MACs takes 20 + 20 ms
    batch = _batch([("original", 400.0, 100.0), ("a 25%", 100.0, 40.0), ("a 50%", 200.0, 60.0),
                    ("a 75%", 300.0, 80.0)])
    fit = fixed_cost(batch)
    assert fit["fixed_ms"] == pytest.approx(20.0, abs=1e-9) and fit["slope_ms"] == pytest.approx(80.0, abs=1e-9)
    assert fit["realisation_if_linear"] == pytest.approx(0.8, abs=1e-12)
    assert fit["fixed_share"] == pytest.approx(0.2, abs=1e-12) and fit["max_abs_residual_ms"] < 1e-9
    for row in batch["rows"][1:]:      # the benchmark's realisation of each point is that same share
        share = row["flops"] / 400.0
        assert (1 - row["latency"]["median_ms"] / 100.0) / (1 - share) == pytest.approx(0.8, abs=1e-12)


def test_points_off_the_line_show_in_the_residual():
    fit = fixed_cost(_batch([("original", 4.0, 10.0), ("b", 2.0, 5.0), ("c", 1.0, 4.0)]))
    assert fit["max_abs_residual_ms"] > 0.5 and fit["points"] == 3


def test_timing_runs_in_a_fresh_process_and_its_result_comes_back():
    from _results import in_fresh_process

    assert in_fresh_process(os.getpid) != os.getpid()
    assert in_fresh_process(sorted, [3, 1, 2], reverse=True) == [3, 2, 1]


def test_render_reads_the_results_file_and_refuses_a_missing_one_naming_it(tmp_path, capsys):
    import argparse
    import json

    from _results import read_results

    parser = argparse.ArgumentParser(prog="subnetworks.py")
    (tmp_path / "r.json").write_text(json.dumps({"rows": []}))
    assert read_results(parser, tmp_path / "r.json") == {"rows": []}
    with pytest.raises(SystemExit) as e:
        read_results(parser, tmp_path / "missing.json")
    assert e.value.code == 2
    assert f"--render: {tmp_path / 'missing.json'} does not exist; run the benchmark first" in capsys.readouterr().err
