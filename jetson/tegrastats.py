"""Parse tegrastats lines into samples: RAM, swap, CPU cores, EMC, GPU, temperatures, power rails.

Learned from real lines (tests/jetson/data/SOURCES.md names each one's origin):
- a line may start with the tool's own clock, ``MM-DD-YYYY HH:MM:SS`` (one-second resolution: the
  sampler stamps each line with a precise arrival time for energy);
- JetPack 6 without root prints no EMC_FREQ and no GPU frequency (``GR3D_FREQ 33%``); as root it
  prints ``EMC_FREQ 43%@2133 GR3D_FREQ 63%@[621]`` (one frequency per GPC);
- JetPack 7.2 prints rails as current/average/peak (``VDD_IN 3462mW/3522mW/3582mW``) and
  temperatures as current/peak (``cpu@45.375C/45.812C``), and leaves SWAP out where there is none;
- Thor (JetPack 7) prints GPC frequencies without a load (``GR3D_FREQ @[314,314,314]``) and the
  rails VDD_GPU, VDD_CPU_SOC_MSS, VIN_SYS_5V0 and VIN.
Any other field (``NVENC off``, ``APE 200``, ``NVENC0_FREQ @314``) is kept verbatim in ``other``; a
line that is not tegrastats output raises a JetsonError naming the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from jetson.errors import JetsonError

_CLOCK = re.compile(r"(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\s+")
_USED_TOTAL = re.compile(r"(\d+)/(\d+)MB")
_MEGABYTES = re.compile(r"(\d+)MB\)")
_CORE = re.compile(r"(\d+)%(?:@(\d+))?")
_LOAD_FREQ = re.compile(r"(?:(\d+)%)?(?:@\[?(\d+(?:,\d+)*)\]?)?")
_TEMPERATURE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C(?:/(-?\d+(?:\.\d+)?)C)?")
_RAIL = re.compile(r"(-?\d+)mW(?:/(-?\d+)mW)?(?:/(-?\d+)mW)?")
_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class CpuCore:
    """One core of ``CPU [...]``: load in percent and frequency in MHz, both None when it is off."""

    online: bool
    load_percent: int | None
    freq_mhz: int | None


@dataclass(frozen=True)
class Rail:
    """One power rail in milliwatts: current, and the running average (and peak, JetPack 7.2) that
    tegrastats keeps since it started."""

    current_mw: int
    average_mw: int | None
    peak_mw: int | None


@dataclass(frozen=True)
class Sample:
    """One tegrastats line. Fields a line lacks (swap without swap, EMC and GPU frequency without
    root) are None or empty; fields this parser does not know are in ``other``, verbatim."""

    clock: datetime | None
    ram_used_mb: int
    ram_total_mb: int
    ram_largest_free_block: str | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    swap_cached_mb: int | None = None
    cpus: tuple[CpuCore, ...] = ()
    emc_load_percent: int | None = None
    emc_freq_mhz: int | None = None
    gpu_load_percent: int | None = None
    gpu_freq_mhz: tuple[int, ...] = ()
    temperatures_c: dict[str, float] = field(default_factory=dict)
    temperature_peaks_c: dict[str, float] = field(default_factory=dict)
    rails: dict[str, Rail] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TimedSample:
    """A sample and the time it arrived (``time.monotonic()`` seconds), the clock energy uses."""

    time_s: float
    sample: Sample


class _Unreadable(ValueError):
    """What is wrong with a line; parse_line turns it into a JetsonError that names the line."""


def parse_line(line: str, *, where: str = "tegrastats output") -> Sample:
    """The sample on one tegrastats line; ``where`` names the line in the error (a file and line
    number)."""
    text = line.strip()
    clock = _CLOCK.match(text)
    fields: dict = {"clock": datetime.strptime(clock.group(1), "%m-%d-%Y %H:%M:%S") if clock else None,
                    "temperatures_c": {}, "temperature_peaks_c": {}, "rails": {}, "other": {}}
    tokens = text[clock.end() if clock else 0:].split()
    try:
        i = 0
        while i < len(tokens):
            i = _read_field(tokens, i, fields)
        if "ram_used_mb" not in fields:
            raise _Unreadable("no RAM field")
    except _Unreadable as e:
        raise JetsonError(f"{where}: not a tegrastats line ({e})",
                          expected="a tegrastats line: [MM-DD-YYYY HH:MM:SS] RAM used/totalMB ... "
                                   "NAME currentmW/averagemW ...",
                          found=text[:400] or "an empty line",
                          fix="pass the output of `tegrastats` (JetPack 6 or 7) unchanged") from None
    return Sample(**fields)


def parse_lines(lines: Iterable[str], *, source: str = "tegrastats output") -> list[Sample]:
    """The samples on non-blank lines; errors name ``source`` and the line number."""
    return [parse_line(line, where=f"{source} line {n}")
            for n, line in enumerate(lines, start=1) if line.strip()]


def read_log(path: Path) -> list[Sample]:
    """The samples in a file of tegrastats lines (``tegrastats --logfile`` writes one)."""
    return parse_lines(Path(path).read_text().splitlines(), source=str(path))


def _read_field(tokens: list[str], i: int, fields: dict) -> int:
    """Read the field that starts at ``tokens[i]`` into ``fields``; the index after it."""
    name = tokens[i]
    value = tokens[i + 1] if i + 1 < len(tokens) else ""
    reader = _READERS.get(name)
    if reader is not None:
        if not value:
            raise _Unreadable(f"{name} has no value")
        return reader(tokens, i + 1, fields)
    temperature = _TEMPERATURE.fullmatch(name)
    if temperature:
        zone, current, peak = temperature.groups()
        fields["temperatures_c"][zone] = float(current)
        if peak is not None:
            fields["temperature_peaks_c"][zone] = float(peak)
        return i + 1
    if not _NAME.fullmatch(name):
        raise _Unreadable(f"{name!r} where a field name was expected")
    rail = _RAIL.fullmatch(value)
    if rail:
        current, average, peak = rail.groups()
        fields["rails"][name] = Rail(int(current), _int(average), _int(peak))
        return i + 2
    end = i + 1
    while end < len(tokens) and not (_NAME.fullmatch(tokens[end]) or _TEMPERATURE.fullmatch(tokens[end])):
        end += 1
    fields["other"][name] = " ".join(tokens[i + 1:end])
    return end


def _read_ram(tokens: list[str], i: int, fields: dict) -> int:
    fields["ram_used_mb"], fields["ram_total_mb"] = _used_total("RAM", tokens[i])
    if i + 2 < len(tokens) and tokens[i + 1] == "(lfb":
        if not tokens[i + 2].endswith(")"):
            raise _Unreadable(f"RAM (lfb {tokens[i + 2]!r} is not closed")
        fields["ram_largest_free_block"] = tokens[i + 2][:-1]
        return i + 3
    return i + 1


def _read_swap(tokens: list[str], i: int, fields: dict) -> int:
    fields["swap_used_mb"], fields["swap_total_mb"] = _used_total("SWAP", tokens[i])
    if i + 2 < len(tokens) and tokens[i + 1] == "(cached":
        cached = _MEGABYTES.fullmatch(tokens[i + 2])
        if not cached:
            raise _Unreadable(f"SWAP (cached {tokens[i + 2]!r} is not NMB)")
        fields["swap_cached_mb"] = int(cached.group(1))
        return i + 3
    return i + 1


def _read_cpu(tokens: list[str], i: int, fields: dict) -> int:
    value = tokens[i]
    if not (value.startswith("[") and value.endswith("]")):
        raise _Unreadable(f"CPU {value!r} is not [load%@MHz,...]")
    cores = []
    for entry in value[1:-1].split(","):
        if entry == "off":
            cores.append(CpuCore(online=False, load_percent=None, freq_mhz=None))
            continue
        core = _CORE.fullmatch(entry)
        if not core:
            raise _Unreadable(f"CPU core {entry!r} is neither load%@MHz nor off")
        cores.append(CpuCore(online=True, load_percent=int(core.group(1)), freq_mhz=_int(core.group(2))))
    fields["cpus"] = tuple(cores)
    return i + 1


def _read_emc(tokens: list[str], i: int, fields: dict) -> int:
    load, freqs = _load_freq("EMC_FREQ", tokens[i])
    if len(freqs) > 1:
        raise _Unreadable(f"EMC_FREQ {tokens[i]!r} has more than one frequency")
    fields["emc_load_percent"], fields["emc_freq_mhz"] = load, (freqs[0] if freqs else None)
    return i + 1


def _read_gpu(tokens: list[str], i: int, fields: dict) -> int:
    fields["gpu_load_percent"], fields["gpu_freq_mhz"] = _load_freq(tokens[i - 1], tokens[i])
    return i + 1


_READERS = {"RAM": _read_ram, "SWAP": _read_swap, "CPU": _read_cpu, "EMC_FREQ": _read_emc,
            "GR3D_FREQ": _read_gpu, "GPC_FREQ": _read_gpu}


def _used_total(name: str, value: str) -> tuple[int, int]:
    match = _USED_TOTAL.fullmatch(value)
    if not match:
        raise _Unreadable(f"{name} {value!r} is not used/totalMB")
    return int(match.group(1)), int(match.group(2))


def _load_freq(name: str, value: str) -> tuple[int | None, tuple[int, ...]]:
    """``63%@[621]``, ``0%@2133``, ``33%`` (no root) or ``@[314,314,314]`` (Thor): load, MHz."""
    match = _LOAD_FREQ.fullmatch(value)
    if not match or not any(match.groups()):
        raise _Unreadable(f"{name} {value!r} is not load%@MHz")
    load, freqs = match.groups()
    return _int(load), tuple(int(f) for f in freqs.split(",")) if freqs else ()


def _int(text: str | None) -> int | None:
    return None if text is None else int(text)
