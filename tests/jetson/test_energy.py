"""Energy from a replayed trace of real lines, against integrals worked out by hand.

The trace: the four idle JetPack 7 Orin Nano samples (VDD_IN 3582, 3462, 3462, 3462 mW) at
t = 0, 1, 2, 3 s, then the three JetPack 6 Orin Nano samples under load (6167, 5608, 5486 mW) at
t = 4, 5, 6 s, one second apart as tegrastats printed them. Two boards, so only the arithmetic is
meant; the rails are in both.
"""

import pytest

from jetson.energy import (
    MIN_ENERGY_SAMPLES,
    SUM_OF_RAILS,
    TOTAL_RAILS,
    Window,
    energy_mj,
    rail_energy,
    rail_power,
    summarize,
    window_samples,
)
from jetson.errors import JetsonError
from jetson.tegrastats import TimedSample, read_log
from tests.jetson.fakes import DATA

IDLE = Window(0.0, 3.0)
TIMED = Window(4.0, 6.0)
CALLS = 100


@pytest.fixture(scope="module")
def trace():
    lines = read_log(DATA / "jp7_orin_nano_super_trace.log") + read_log(DATA / "jp6_orin_nano_user_trace.log")
    return [TimedSample(float(t), s) for t, s in enumerate(lines)]


def test_the_trace_is_what_the_hand_figures_assume(trace):
    times, power = rail_power(trace, "VDD_IN")
    assert times.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert power.tolist() == [3582, 3462, 3462, 3462, 6167, 5608, 5486]


@pytest.mark.parametrize("window, millijoules", [
    (Window(0, 3), (3582 + 3462) / 2 + 3462 + 3462),                    # 10446
    (Window(4, 6), (6167 + 5608) / 2 + (5608 + 5486) / 2),              # 11434.5
    # edges between samples: the power there is interpolated, 3522 at 0.5 s and 2.5 s -> 3462
    (Window(0.5, 2.5), (3522 + 3462) / 2 * 0.5 + 3462 + 3462 * 0.5),   # 6939
    # across the step from idle to load: 4814.5 mW at 3.5 s, 5887.5 mW at 4.5 s
    (Window(3.5, 4.5), (4814.5 + 6167) / 2 * 0.5 + (6167 + 5887.5) / 2 * 0.5),  # 5759
    # inside one interval
    (Window(4.25, 4.75), (6027.25 + 5747.75) / 2 * 0.5),
])
def test_trapezoidal_energy_matches_the_hand_integral(trace, window, millijoules):
    times, power = rail_power(trace, "VDD_IN")
    assert energy_mj(times, power, window) == pytest.approx(millijoules, rel=1e-12)


def test_energy_per_call_total_and_above_idle(trace):
    vdd_in = rail_energy(trace, "VDD_IN", TIMED, CALLS, idle=IDLE)
    assert vdd_in.energy_mj == pytest.approx(11434.5, rel=1e-12)
    assert vdd_in.mean_power_mw == pytest.approx(11434.5 / 2, rel=1e-12)
    assert vdd_in.idle_power_mw == pytest.approx(10446 / 3, rel=1e-12)                  # 3482 mW
    assert vdd_in.energy_per_call_mj == vdd_in.energy_per_image_mj == pytest.approx(114.345, rel=1e-12)  # batch 1
    assert vdd_in.energy_above_idle_per_call_mj == pytest.approx((11434.5 - 3482 * 2) / 100, rel=1e-12)

    cv = rail_energy(trace, "VDD_CPU_GPU_CV", TIMED, CALLS, idle=IDLE)
    assert cv.energy_mj == pytest.approx((1215 + 770) / 2 + (770 + 730) / 2, rel=1e-12)  # 1742.5
    assert cv.idle_power_mw == pytest.approx(((523 + 442) / 2 + 442 + 442) / 3, rel=1e-12)  # 455.5
    assert cv.energy_above_idle_per_call_mj == pytest.approx((1742.5 - 455.5 * 2) / 100, rel=1e-12)

    no_idle = rail_energy(trace, "VDD_IN", TIMED, CALLS)
    assert no_idle.idle_power_mw is None and no_idle.energy_above_idle_per_call_mj is None
    assert no_idle.energy_above_idle_per_image_mj is None


def test_energy_per_image_divides_a_call_by_its_batch(trace):
    """A call at batch 8 computes 8 images: energy per call is per batch, per image an eighth of it."""
    batched = rail_energy(trace, "VDD_IN", TIMED, CALLS, idle=IDLE, batch=8)
    assert batched.energy_per_call_mj == pytest.approx(114.345, rel=1e-12)
    assert batched.energy_per_image_mj == pytest.approx(114.345 / 8, rel=1e-12)
    assert batched.energy_above_idle_per_image_mj == pytest.approx((11434.5 - 3482 * 2) / 800, rel=1e-12)
    summary = summarize(trace, TIMED, CALLS, idle=IDLE, batch=8)
    assert (summary.calls, summary.batch) == (100, 8)
    assert summary.rails["VDD_IN"] == batched


def test_summary_of_the_timed_window(trace):
    summary = summarize(trace, TIMED, CALLS, idle=IDLE)
    assert summary.total_rail == "VDD_IN"
    assert list(summary.rails) == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert summary.rails["VDD_SOC"].energy_mj == pytest.approx((1663 + 1663) / 2 + (1663 + 1623) / 2, rel=1e-12)
    assert (summary.samples_timed, summary.samples_idle) == (3, 4)
    assert (summary.timed_s, summary.idle_s, summary.calls, summary.batch) == (2.0, 3.0, 100, 1)
    # the window's samples and the one before it (t = 3 s, 2837 MB) bound what it saw
    assert [s.time_s for s in window_samples(trace, TIMED)] == [3, 4, 5, 6]
    assert (summary.peak_ram_used_mb, summary.ram_total_mb) == (6677, 7620)
    assert summary.peak_temperatures_c == {"cpu": 52.25, "soc2": 51.968, "soc0": 52.187, "gpu": 52.156,
                                           "tj": 52.812, "soc1": 52.812}
    assert summary.gpu_freq_mhz == [306]
    as_json = summary.to_json()
    assert as_json["rails"]["VDD_IN"]["energy_per_call_mj"] == pytest.approx(114.345, rel=1e-12)
    # 3 samples in the window: the energy is there, marked unreliable with the reason
    assert as_json["reliable"] is False and as_json["min_samples"] == MIN_ENERGY_SAMPLES == 20
    assert as_json["unreliable"].startswith("only 3 tegrastats samples in the timed window, fewer than 20")


def test_energy_is_reliable_from_the_sample_minimum_on(trace):
    """20 samples (2 s at tegrastats' 100 ms) bound the error of the window's edges to about 1/20: the minimum."""
    dense = [TimedSample(n * 0.1, trace[4 + n % 3].sample) for n in range(30)]
    enough = summarize(dense, Window(0.05, 0.05 + 0.1 * MIN_ENERGY_SAMPLES), 50, interval_ms=100)
    assert enough.samples_timed == MIN_ENERGY_SAMPLES and enough.reliable and enough.unreliable is None
    short = summarize(dense, Window(0.05, 0.05 + 0.1 * (MIN_ENERGY_SAMPLES - 1)), 50, interval_ms=100)
    assert short.samples_timed == MIN_ENERGY_SAMPLES - 1 and not short.reliable
    assert short.unreliable == ("only 19 tegrastats samples in the timed window, fewer than 20 (one every 100 ms: "
                                "time at least 2 s): the energy of the window's edges is a guess of up to 1/19 of "
                                "the total")


def test_a_window_the_samples_do_not_cover_is_refused(trace):
    times, power = rail_power(trace, "VDD_IN")
    with pytest.raises(JetsonError, match=r"the window \[5.000, 6.500\] s is not covered by the power samples "
                                          r"\[0.000, 6.000\] s"):
        energy_mj(times, power, Window(5.0, 6.5))


def test_a_rail_missing_from_a_sample_is_named(trace):
    with pytest.raises(JetsonError, match="power rail VIN is missing from 7 of 7 tegrastats samples") as e:
        rail_power(trace, "VIN")
    assert "found: rails VDD_CPU_GPU_CV, VDD_IN, VDD_SOC" in str(e.value)


def test_empty_windows_and_no_inferences_are_refused(trace):
    with pytest.raises(JetsonError, match=r"time window \[2, 2\] s is empty"):
        Window(2, 2)
    with pytest.raises(JetsonError, match="needs at least one call of at least one image, got 0 calls"):
        rail_energy(trace, "VDD_IN", TIMED, 0)


def test_a_module_without_a_total_rail_sums_its_rails_as_jtop_does():
    """AGX Orin prints VDD_GPU_SOC, VDD_CPU_CV and VIN_SYS_5V0, none of them the module's whole input: jtop
    (rbonghi/jetson_stats, jtop/core/power.py, total_power) takes VDD_IN or POM_5V_IN as the total, else sums
    every rail. Two real AGX Orin lines (as root, and without root) one second apart."""
    lines = read_log(DATA / "jp6_agx_orin_root.log") + read_log(DATA / "jp6_agx_orin_user.log")
    samples = [TimedSample(float(t), s) for t, s in enumerate(lines)]
    summary = summarize(samples, Window(0.0, 1.0), calls=10)
    assert summary.total_rail == SUM_OF_RAILS
    assert summary.total_rails == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]
    first, second = 3205 + 4405 + 4767, 4940 + 988 + 4442  # mW, the three rails added
    assert summary.rails[SUM_OF_RAILS].energy_mj == pytest.approx((first + second) / 2, rel=1e-12)
    assert summary.rails[SUM_OF_RAILS].energy_mj > summary.rails["VIN_SYS_5V0"].energy_mj  # never one rail alone
    assert summary.rails[SUM_OF_RAILS].energy_per_image_mj == pytest.approx((first + second) / 2 / 10, rel=1e-12)


def test_the_jetson_nanos_total_rail_is_pom_5v_in():
    assert TOTAL_RAILS[:2] == ("VDD_IN", "POM_5V_IN")
