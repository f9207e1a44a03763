"""Energy over a time window from timed rail samples: trapezoidal integration, idle power, energy
per call and per image (total and with the idle power taken out), and the peaks of the window.

A *call* is one inference call of the engine: at batch N it computes N images, so energy per call
is energy per batch; per image divides it by the batch. Units: milliwatts times seconds are
millijoules. A window must lie inside the sampled span; its edges fall between samples, where the
power is interpolated linearly, so a window shorter than the sampling interval still gets the
energy the trace implies; but it is not to be trusted.

How many samples make the figure trustworthy (:data:`MIN_ENERGY_SAMPLES`): tegrastats reports one
sample per interval (100 ms by default), so what happens between two samples is not seen. At each
edge of the timed window the power is interpolated across up to one interval in which the load
started or stopped: up to one interval per edge of energy misattributed between load and idle
power. With ``n`` samples in the window that is at most 2 of ``n`` intervals of the step height;
on an Orin Nano the step from idle (about 4.3-5.3 W on VDD_IN) to load is at most about the idle
power itself, so the error is at most about ``1/n`` of the total. 20 samples (2 s at 100 ms)
bound it to about 5 %; fewer mark the figures unreliable (``reliable: false`` with the reason),
and below 2 samples no integral exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from jetson.errors import JetsonError
from jetson.tegrastats import TimedSample

MIN_ENERGY_SAMPLES = 20  # tegrastats samples inside the timed window for energy figures to be trusted (above)
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN", "VIN")
"""The rail that carries the whole module's input, first present wins: VDD_IN on Orin Nano/NX (and Xavier NX),
POM_5V_IN on the Jetson Nano, as jtop takes them (rbonghi/jetson_stats, jtop/core/power.py, ``total_power``), and
VIN, the module's input on Thor (its other rails are parts of it). A module with none of them (AGX Orin:
VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, none the whole) gets the sum of its rails as the total, as jtop does:
:data:`SUM_OF_RAILS`."""
SUM_OF_RAILS = "SUM_OF_RAILS"
"""The total of a module without a total rail: every rail's power added sample by sample (``total_rails`` names
them), in ``rails`` beside the measured ones."""


@dataclass(frozen=True)
class Window:
    """A span of ``time.monotonic()`` seconds, start before end."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not self.end_s > self.start_s:
            raise JetsonError(f"time window [{self.start_s}, {self.end_s}] s is empty",
                              expected="an end after the start")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class RailEnergy:
    """One rail's figures over the timed window, per call (per batch) and per image as well."""

    rail: str
    energy_mj: float
    mean_power_mw: float
    idle_power_mw: float | None
    energy_per_call_mj: float
    energy_above_idle_per_call_mj: float | None
    energy_per_image_mj: float
    energy_above_idle_per_image_mj: float | None


@dataclass(frozen=True)
class PowerSummary:
    """What the results record of a timed window (and the idle window before it). ``reliable`` is false
    when fewer than ``min_samples`` samples fell in the timed window (``unreliable`` says so in words)."""

    calls: int
    batch: int
    timed_s: float
    idle_s: float | None
    samples_timed: int
    samples_idle: int | None
    total_rail: str | None
    rails: dict[str, RailEnergy]
    total_rails: list[str]  # the rails the total is: [total_rail], or every rail when it is SUM_OF_RAILS
    peak_ram_used_mb: int
    ram_total_mb: int
    peak_temperatures_c: dict[str, float]
    gpu_freq_mhz: list[int]
    min_samples: int = MIN_ENERGY_SAMPLES
    reliable: bool = True
    unreliable: str | None = None

    def to_json(self) -> dict:
        """A JSON-ready dict (units in the key names)."""
        return asdict(self)


def rail_power(samples: Sequence[TimedSample], rail: str) -> tuple[np.ndarray, np.ndarray]:
    """Times (s) and the rail's current power (mW) of every sample, in order."""
    missing = [i for i, s in enumerate(samples) if rail not in s.sample.rails]
    if missing:
        have = sorted(samples[missing[0]].sample.rails)
        raise JetsonError(f"power rail {rail} is missing from {len(missing)} of {len(samples)} tegrastats samples",
                          expected=f"{rail} in every sample", found=f"rails {', '.join(have) or 'none'}",
                          fix="choose a rail this module reports")
    times = np.array([s.time_s for s in samples], dtype=float)
    power = np.array([s.sample.rails[rail].current_mw for s in samples], dtype=float)
    return times, power


def energy_mj(times_s: np.ndarray, power_mw: np.ndarray, window: Window) -> float:
    """The trapezoidal integral of power over ``window``, in mJ (mW x s)."""
    t = np.asarray(times_s, dtype=float)
    p = np.asarray(power_mw, dtype=float)
    if t.size < 2 or np.any(np.diff(t) < 0):
        raise JetsonError("power samples cannot be integrated",
                          expected="two or more samples in time order", found=f"{t.size} samples")
    if window.start_s < t[0] or window.end_s > t[-1]:
        raise JetsonError(f"the window [{window.start_s:.3f}, {window.end_s:.3f}] s is not covered by the power "
                          f"samples [{t[0]:.3f}, {t[-1]:.3f}] s",
                          fix="start tegrastats before the window and stop it after a sample past its end "
                              "(TegrastatsSampler.wait_past)")
    inside = (t > window.start_s) & (t < window.end_s)
    tt = np.concatenate(([window.start_s], t[inside], [window.end_s]))
    pp = np.concatenate(([np.interp(window.start_s, t, p)], p[inside], [np.interp(window.end_s, t, p)]))
    return float(np.sum((pp[1:] + pp[:-1]) * np.diff(tt)) / 2.0)


def mean_power_mw(times_s: np.ndarray, power_mw: np.ndarray, window: Window) -> float:
    """The time-weighted mean power over ``window`` (energy over duration), in mW."""
    return energy_mj(times_s, power_mw, window) / window.duration_s


def rail_energy(samples: Sequence[TimedSample], rail: str, timed: Window, calls: int,
                idle: Window | None = None, *, batch: int = 1) -> RailEnergy:
    """One rail's energy over ``timed``, per call (``calls`` inference calls of ``batch`` images each) and
    per image, total and above the idle window's mean power."""
    times, power = rail_power(samples, rail)
    return power_energy(rail, times, power, timed, calls, idle, batch=batch)


def summed_rail_energy(samples: Sequence[TimedSample], rails: Sequence[str], timed: Window, calls: int,
                       idle: Window | None = None, *, batch: int = 1) -> RailEnergy:
    """The energy of ``rails`` together (their powers added sample by sample), as :data:`SUM_OF_RAILS`."""
    series = [rail_power(samples, rail) for rail in rails]
    power = np.sum([p for _, p in series], axis=0)
    return power_energy(SUM_OF_RAILS, series[0][0], power, timed, calls, idle, batch=batch)


def power_energy(rail: str, times: np.ndarray, power: np.ndarray, timed: Window, calls: int,
                 idle: Window | None = None, *, batch: int = 1) -> RailEnergy:
    """:func:`rail_energy`'s figures from the times (s) and power (mW) of a rail."""
    if calls < 1 or batch < 1:
        raise JetsonError(f"energy per call needs at least one call of at least one image, got {calls} calls "
                          f"of batch {batch}")
    energy = energy_mj(times, power, timed)
    idle_mw = mean_power_mw(times, power, idle) if idle is not None else None
    above = None if idle_mw is None else energy - idle_mw * timed.duration_s
    return RailEnergy(
        rail=rail, energy_mj=energy, mean_power_mw=energy / timed.duration_s, idle_power_mw=idle_mw,
        energy_per_call_mj=energy / calls,
        energy_above_idle_per_call_mj=None if above is None else above / calls,
        energy_per_image_mj=energy / (calls * batch),
        energy_above_idle_per_image_mj=None if above is None else above / (calls * batch))


def reliability(samples_timed: int, interval_ms: float | None = None) -> str | None:
    """Why energy from ``samples_timed`` samples is not to be trusted (None when it is)."""
    if samples_timed >= MIN_ENERGY_SAMPLES:
        return None
    every = f" (one every {interval_ms:g} ms: time at least {MIN_ENERGY_SAMPLES * interval_ms / 1000:g} s)" \
        if interval_ms else ""
    return (f"only {samples_timed} tegrastats samples in the timed window, fewer than {MIN_ENERGY_SAMPLES}"
            f"{every}: the energy of the window's edges is a guess of up to 1/{max(samples_timed, 1)} of the total")


def window_samples(samples: Sequence[TimedSample], window: Window) -> list[TimedSample]:
    """The samples in ``window`` and the one on each side of it, which bound what it saw."""
    times = [s.time_s for s in samples]
    first = max(0, int(np.searchsorted(times, window.start_s, side="left")) - 1)
    last = min(len(samples), int(np.searchsorted(times, window.end_s, side="right")) + 1)
    return list(samples[first:last])


def summarize(samples: Sequence[TimedSample], timed: Window, calls: int,
              idle: Window | None = None, *, batch: int = 1, interval_ms: float | None = None) -> PowerSummary:
    """Every rail's energy over ``timed`` (the rails all samples report), per call and per image, the
    window's peak RAM use, peak temperatures and GPU frequencies, and whether enough samples fell in
    the window (:data:`MIN_ENERGY_SAMPLES`; ``interval_ms``, the sampling interval, only for the words)."""
    if not samples:
        raise JetsonError("no tegrastats samples to summarize", fix="sample during the timed window")
    rails = [r for r in samples[0].sample.rails if all(r in s.sample.rails for s in samples)]
    seen = window_samples(samples, timed)
    peaks: dict[str, float] = {}
    for s in seen:
        for zone, celsius in s.sample.temperatures_c.items():
            peaks[zone] = max(celsius, peaks.get(zone, celsius))
    samples_timed = sum(timed.start_s <= s.time_s <= timed.end_s for s in samples)
    unreliable = reliability(samples_timed, interval_ms)
    energies = {r: rail_energy(samples, r, timed, calls, idle, batch=batch) for r in rails}
    total = next((r for r in TOTAL_RAILS if r in rails), None)
    total_rails = [total] if total else list(rails)
    if total is None and rails:
        total = SUM_OF_RAILS
        energies[SUM_OF_RAILS] = summed_rail_energy(samples, rails, timed, calls, idle, batch=batch)
    return PowerSummary(
        calls=calls, batch=batch, timed_s=timed.duration_s, idle_s=idle.duration_s if idle else None,
        samples_timed=samples_timed,
        samples_idle=(sum(idle.start_s <= s.time_s <= idle.end_s for s in samples) if idle else None),
        total_rail=total, rails=energies, total_rails=total_rails,
        peak_ram_used_mb=max(s.sample.ram_used_mb for s in seen),
        ram_total_mb=seen[-1].sample.ram_total_mb,
        peak_temperatures_c=peaks,
        gpu_freq_mhz=sorted({f for s in seen for f in s.sample.gpu_freq_mhz}),
        reliable=unreliable is None, unreliable=unreliable)
