"""A latency table: each part's latency measured on one target, saved as JSON with what it was measured on.

The target (:class:`Target`) is what a latency depends on besides the part: backend, device,
precision, batch, and for CPU backends the thread count. A table answers only for its own target:
:meth:`LatencyTable.check` refuses a table measured elsewhere, naming both.

Format (``edge-latency-table``, version 1)::

    {"format": "edge-latency-table", "format_version": 1,
     "target": {"backend": "onnxruntime", "device": "Intel(R) Xeon(R) Processor", "precision": "fp32",
                "batch": 1, "threads": 2, "power_mode": null},
     "device_record": {...how the device describes itself...}, "versions": {...}, "protocol": {...},
     "source": {"model": "fmnist-deit-tiny", "grid": "full"}, "created": "...", "clock": "...",
     "overhead_ms": 0.012,          # the identity graph's median: one call's fixed cost
     "parts": [{"key": "attention:dim=192,...", "part": {...}, "repeat": 12, "median_ms": 2.51,
                "net_ms": 0.208, "latency": {...min/median/p90/p95/p99/max/std/cv of the graph...}}, ...]}

``net_ms`` is what one copy of the part adds to a model's call: the median of its graph (``repeat``
chained copies, edge.latency.grid) less the overhead, divided by ``repeat``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from edge.errors import EdgeError
from edge.fileio import write_json_atomic
from edge.latency.parts import Part

FORMAT, FORMAT_VERSION = "edge-latency-table", 1


@dataclass(frozen=True)
class Target:
    """Where latencies are asked for: a table answers only for the same target.

    ``device`` names the machine (a CPU model, a Jetson board); ``power_mode`` the Jetson's nvpmodel
    mode by name (None off a Jetson); ``threads`` the intra-op threads of a CPU backend (None on a GPU).
    """

    backend: str
    device: str
    precision: str
    batch: int
    threads: int | None = None
    power_mode: str | None = None

    def describe(self) -> str:
        threads = f", {self.threads} threads" if self.threads is not None else ""
        mode = f", power mode {self.power_mode}" if self.power_mode else ""
        return f"{self.backend} on {self.device}{mode}, {self.precision}, batch {self.batch}{threads}"

    def differences(self, other: Target) -> list[str]:
        return [name for name in ("backend", "device", "power_mode", "precision", "batch", "threads")
                if getattr(self, name) != getattr(other, name)]

    @classmethod
    def from_json(cls, record: dict) -> Target:
        return cls(backend=str(record["backend"]), device=str(record["device"]), precision=str(record["precision"]),
                   batch=int(record["batch"]), threads=record.get("threads"), power_mode=record.get("power_mode"))


def here(batch: int, threads: int, precision: str = "fp32") -> Target:
    """ONNX Runtime on this machine's CPU."""
    from edge.runtime import cpu_name

    return Target("onnxruntime", cpu_name(), precision, batch, threads)


@dataclass(frozen=True)
class Entry:
    part: Part
    median_ms: float          # the part graph's median (``repeat`` chained copies)
    net_ms: float             # one copy's share, the overhead taken off
    latency: dict = field(default_factory=dict)
    repeat: int = 1

    def to_json(self) -> dict:
        return {"key": self.part.key, "part": self.part.to_json(), "repeat": self.repeat, "median_ms": self.median_ms,
                "net_ms": self.net_ms, "latency": self.latency}


@dataclass
class LatencyTable:
    target: Target
    overhead_ms: float
    entries: dict[str, Entry]
    device_record: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    protocol: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    clock: str = ""
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @classmethod
    def from_medians(cls, target: Target, medians: dict[Part, dict], repeats: dict[Part, int] | None = None,
                     **facts) -> LatencyTable:
        """A table from each part graph's latency statistics (``median_ms`` and the rest) and the number of
        copies it chains (``repeats``, default 1); the overhead part is required."""
        overhead = [p for p in medians if p.kind == "overhead"]
        if not overhead:
            raise EdgeError("no overhead part was timed", expected="the identity graph among the parts",
                            fix="time a grid from edge.latency.grid (it always holds the overhead)")
        base = float(medians[overhead[0]]["median_ms"])
        repeats = repeats or {}
        entries = {}
        for p, s in medians.items():
            count = int(repeats.get(p, 1))
            entries[p.key] = Entry(p, float(s["median_ms"]), (float(s["median_ms"]) - base) / count, dict(s), count)
        return cls(target, base, entries, **facts)

    def __contains__(self, part: Part) -> bool:
        return part.key in self.entries

    def entry(self, part: Part) -> Entry:
        try:
            return self.entries[part.key]
        except KeyError:
            raise EdgeError(f"part {part.key} is not in the latency table ({self.describe()})",
                            expected="a table whose grid holds every part of the model",
                            fix="measure a table with --grid model on this model, or --grid full on its "
                                "uncompressed original") from None

    def describe(self) -> str:
        return f"{self.target.describe()}, {len(self.entries)} parts"

    def check(self, wanted: Target, where: str = "the latency table") -> None:
        """Refuse this table unless it was measured on ``wanted``, naming both."""
        differ = self.target.differences(wanted)
        if differ:
            raise EdgeError(f"{where} was measured on another target ({', '.join(differ)} differ)",
                            expected=wanted.describe(), found=self.target.describe(),
                            fix="measure a table on the target asked for (edge profile MODEL --latency-table, "
                                "or edge deploy --latency-table on the device), or ask for the table's target")

    def to_json(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "target": asdict(self.target),
                "device_record": self.device_record, "versions": self.versions, "protocol": self.protocol,
                "source": self.source, "created": self.created, "clock": self.clock,
                "overhead_ms": self.overhead_ms, "parts": [e.to_json() for e in self.entries.values()]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        write_json_atomic(self.to_json(), path)
        return path

    @classmethod
    def from_json(cls, record: dict, where: str = "latency table") -> LatencyTable:
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise EdgeError(f"{where} is not a latency table", expected=f'"format": "{FORMAT}"',
                            found=str(record.get("format") if isinstance(record, dict) else type(record).__name__),
                            fix="write one with `edge profile MODEL --latency-table OUT.json`")
        if record.get("format_version") != FORMAT_VERSION:
            raise EdgeError(f"{where} has format version {record.get('format_version')}",
                            expected=f"version {FORMAT_VERSION}", fix="measure the table again with this edge")
        try:
            entries = {}
            for item in record["parts"]:
                part = Part.from_json(item["part"])
                entries[part.key] = Entry(part, float(item["median_ms"]), float(item["net_ms"]),
                                          dict(item.get("latency") or {}), int(item.get("repeat", 1)))
            return cls(Target.from_json(record["target"]), float(record["overhead_ms"]), entries,
                       record.get("device_record") or {}, record.get("versions") or {}, record.get("protocol") or {},
                       record.get("source") or {}, str(record.get("clock", "")), str(record.get("created", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise EdgeError(f"{where} is incomplete", found=f"{type(e).__name__}: {e}",
                            fix="measure the table again") from e

    @classmethod
    def load(cls, path: str | Path) -> LatencyTable:
        path = Path(path)
        try:
            record = json.loads(path.read_text())
        except OSError as e:
            raise EdgeError(f"cannot read the latency table {path}", found=str(e)) from e
        except ValueError as e:
            raise EdgeError(f"{path} is not JSON", found=str(e), fix="pass a table written by edge") from e
        return cls.from_json(record, str(path))
