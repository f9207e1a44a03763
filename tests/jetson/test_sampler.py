"""tegrastats sampling at 100 ms around an idle and a timed window, against the named fake that
replays real lines (VDD_IN 6167, 5608, 5486 mW, over and over); the energy figures must equal the
integral of that replayed trace over the windows."""

import os
import time

import numpy as np
import pytest

from jetson.energy import Window, summarize
from jetson.errors import JetsonError
from jetson.sampler import TegrastatsSampler, read_sampler_log

REPLAYED = {"VDD_IN": [6167, 5608, 5486], "VDD_CPU_GPU_CV": [1215, 770, 730], "VDD_SOC": [1663, 1663, 1623]}


def dense_integral(times, values, window, points=200_001):
    """The integral of the piecewise-linear trace by a fine grid: a check independent of
    jetson.energy's exact trapezoids."""
    grid = np.linspace(window.start_s, window.end_s, points)
    power = np.interp(grid, times, values)
    return float(np.sum((power[1:] + power[:-1]) * np.diff(grid)) / 2)


def test_energy_over_idle_and_timed_windows_is_the_integral_of_the_replayed_trace(fake_jetson, tmp_path):
    log = tmp_path / "tegrastats.log"
    with TegrastatsSampler(100, log_path=log) as sampler:
        idle = Window(time.monotonic(), time.monotonic() + 0.35)
        time.sleep(0.35)
        started = time.monotonic()
        time.sleep(0.45)  # the "benchmark": 9 inferences
        timed = Window(started, time.monotonic())
        assert sampler.wait_past(timed.end_s)
    samples = sampler.samples()
    assert fake_jetson.calls() == [["tegrastats", "--interval", "100"]]

    times = [s.time_s for s in samples]
    for rail, cycle in REPLAYED.items():
        replayed = [cycle[n % 3] for n in range(len(samples))]
        assert [s.sample.rails[rail].current_mw for s in samples] == replayed
    summary = summarize(samples, timed, 9, idle=idle)
    for rail, cycle in REPLAYED.items():
        values = [cycle[n % 3] for n in range(len(samples))]
        figures = summary.rails[rail]
        assert figures.energy_mj == pytest.approx(dense_integral(times, values, timed), rel=1e-6)
        assert figures.idle_power_mw == pytest.approx(dense_integral(times, values, idle) / idle.duration_s, rel=1e-6)
        assert figures.energy_per_call_mj == pytest.approx(figures.energy_mj / 9, rel=1e-12)
        assert figures.energy_above_idle_per_call_mj == pytest.approx(
            (figures.energy_mj - figures.idle_power_mw * timed.duration_s) / 9, rel=1e-12)
    assert summary.total_rail == "VDD_IN" and summary.peak_ram_used_mb == 6677
    assert read_sampler_log(log) == samples


def test_sampling_stops_on_an_exception_and_the_fake_is_gone(fake_jetson):
    with pytest.raises(RuntimeError, match="benchmark failed"):
        with TegrastatsSampler(100) as sampler:
            pid = sampler._process.pid
            raise RuntimeError("benchmark failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_missing_tegrastats_is_named(fake_jetson):
    with pytest.raises(JetsonError, match="no-such-tegrastats was not found on PATH"):
        TegrastatsSampler(program="no-such-tegrastats").start()


def test_a_tegrastats_that_exits_at_once_is_reported(fake_jetson):
    with pytest.raises(JetsonError, match="`false --interval 100` did not start sampling") as e:
        TegrastatsSampler(program="false").start()
    assert "found: exit code 1" in str(e.value)


def test_a_sampler_log_line_without_a_time_is_refused(tmp_path):
    log = tmp_path / "tegrastats.log"
    log.write_text("RAM 1/2MB\n")
    with pytest.raises(JetsonError, match="tegrastats.log line 1 is not <seconds><TAB><tegrastats line>"):
        read_sampler_log(log)
