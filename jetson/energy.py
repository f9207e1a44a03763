"""Energy over a time window from timed rail samples: trapezoidal integration, idle power, energy
per inference (total and with the idle power taken out), and the peaks of the window.

Units: milliwatts times seconds are millijoules. A window must lie inside the sampled span; its
edges fall between samples, where the power is interpolated linearly, so a window shorter than the
sampling interval still gets the energy the trace implies (and ``samples`` says how thin it was).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from jetson.errors import JetsonError
from jetson.tegrastats import TimedSample

TOTAL_RAILS = ("VDD_IN", "VIN", "VIN_SYS_5V0")
"""The rail that carries the whole module's input, first present wins: VDD_IN on Orin Nano/NX,
VIN on Thor, VIN_SYS_5V0 on AGX Orin."""


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
    """One rail's figures over the timed window, per inference as well."""

    rail: str
    energy_mj: float
    mean_power_mw: float
    idle_power_mw: float | None
    energy_per_inference_mj: float
    energy_above_idle_per_inference_mj: float | None


@dataclass(frozen=True)
class PowerSummary:
    """What the results record of a timed window (and the idle window before it)."""

    inferences: int
    timed_s: float
    idle_s: float | None
    samples_timed: int
    samples_idle: int | None
    total_rail: str | None
    rails: dict[str, RailEnergy]
    peak_ram_used_mb: int
    ram_total_mb: int
    peak_temperatures_c: dict[str, float]
    gpu_freq_mhz: list[int]

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


def rail_energy(samples: Sequence[TimedSample], rail: str, timed: Window, inferences: int,
                idle: Window | None = None) -> RailEnergy:
    """One rail's energy over ``timed``, per inference, and above the idle window's mean power."""
    if inferences < 1:
        raise JetsonError(f"energy per inference needs at least one inference, got {inferences}")
    times, power = rail_power(samples, rail)
    energy = energy_mj(times, power, timed)
    idle_mw = mean_power_mw(times, power, idle) if idle is not None else None
    return RailEnergy(
        rail=rail, energy_mj=energy, mean_power_mw=energy / timed.duration_s, idle_power_mw=idle_mw,
        energy_per_inference_mj=energy / inferences,
        energy_above_idle_per_inference_mj=(None if idle_mw is None
                                            else (energy - idle_mw * timed.duration_s) / inferences))


def window_samples(samples: Sequence[TimedSample], window: Window) -> list[TimedSample]:
    """The samples in ``window`` and the one on each side of it, which bound what it saw."""
    times = [s.time_s for s in samples]
    first = max(0, int(np.searchsorted(times, window.start_s, side="left")) - 1)
    last = min(len(samples), int(np.searchsorted(times, window.end_s, side="right")) + 1)
    return list(samples[first:last])


def summarize(samples: Sequence[TimedSample], timed: Window, inferences: int,
              idle: Window | None = None) -> PowerSummary:
    """Every rail's energy over ``timed`` (the rails all samples report), and the window's peak
    RAM use, peak temperatures and GPU frequencies."""
    if not samples:
        raise JetsonError("no tegrastats samples to summarize", fix="sample during the timed window")
    rails = [r for r in samples[0].sample.rails if all(r in s.sample.rails for s in samples)]
    seen = window_samples(samples, timed)
    peaks: dict[str, float] = {}
    for s in seen:
        for zone, celsius in s.sample.temperatures_c.items():
            peaks[zone] = max(celsius, peaks.get(zone, celsius))
    return PowerSummary(
        inferences=inferences, timed_s=timed.duration_s, idle_s=idle.duration_s if idle else None,
        samples_timed=sum(timed.start_s <= s.time_s <= timed.end_s for s in samples),
        samples_idle=(sum(idle.start_s <= s.time_s <= idle.end_s for s in samples) if idle else None),
        total_rail=next((r for r in TOTAL_RAILS if r in rails), None),
        rails={r: rail_energy(samples, r, timed, inferences, idle) for r in rails},
        peak_ram_used_mb=max(s.sample.ram_used_mb for s in seen),
        ram_total_mb=seen[-1].sample.ram_total_mb,
        peak_temperatures_c=peaks,
        gpu_freq_mhz=sorted({f for s in seen for f in s.sample.gpu_freq_mhz}))
