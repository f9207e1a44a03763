"""The runner's results: where each file goes, what each holds, and every JSON file written whole.

Results (``--out``, by default ``BUNDLE/results``)::

    results/run.json              the run summary (format edge-jetson-run, version 1)
    results/NAME.PRECISION.json   one per variant and precision (format edge-jetson-result, version 1)
    results/logs/run.log          what the runner printed, with times (jetson.run_log)
    results/logs/NAME.PRECISION.tegrastats.log   the tegrastats samples (``<monotonic s>\\t<line>``)
    results/logs/NAME.PRECISION.trt.log          TensorRT's own messages, INFO and above (jetson.trt_log)
    results/logs/NAME.PRECISION.trtexec.log      trtexec's whole output, with its argv (--builder trtexec)

A variant's result has the keys of ``edge profile``'s result (``backend``, ``device``,
``precision``, ``batch``, ``threads``, ``model``, ``latency``: the jetson.stats schema on the host
clock, ``warmup``, ``seconds``, ``weight_bytes``, ``peak_rss_mb``, ``clock``) and: ``variant``,
``bundle_sha256``, ``config`` and ``config_key`` (what was asked: backend, protocol, power
settings), ``partial`` (true when the benchmark stopped early: then ``error`` says why and
``latency`` covers what was measured, or is null), ``power`` (jetson.energy's PowerSummary:
energy per call (per batch) and per image, total and above idle, per rail, whether enough tegrastats
samples stand behind it (``reliable``), peak RAM and temperatures, plus
``tegrastats_log`` and the ``timed_window_s`` and ``idle_window_s`` on the log's monotonic clock, so
the figures can be checked against the samples; null without tegrastats), and per backend:
TensorRT adds ``gpu_latency`` (CUDA events), ``device_memory``, ``layers``, ``cuda_graph``,
``cuda_binding`` and ``engine`` (cache key, path, whether it was cached, ``edge_plugins``: edge's plugin
library the engine was built with, its sha256, plugin cache key and origin (jetson.plugin_build: compiled
here from the bundle's sources, nvcc's output in ``logs/plugins.nvcc.log``, or prebuilt and its stamp
checked), null when the graph needs none, build facts: ``builder`` is
``python``, TensorRT's Python API, built in a child process with its memory limits in ``knobs`` and
its peak memory in ``build_memory``: jetson.build_process, or ``trtexec``, with its argv and version); ONNX Runtime adds
``onnxruntime`` and ``providers``. ``logs`` names the variant's log files (relative to the results).
``accuracy``: the accuracy gate's verdict (jetson.accuracy_gate: ``status`` pass | wrong, the figures, the
failures), null when the bundle carries no gate; a wrong variant still exits 0: its verdict is the news.

``run.json`` holds ``bundle_sha256``, ``backend``, ``config``, ``device`` (jetson.device's record
with the power mode read from ``nvpmodel -q``), ``settings`` (the power mode set and the clocks
locked, if asked), ``variants`` (per id: ``status`` done | cached | failed | interrupted, ``result``
file, ``error``, ``accuracy`` pass | wrong | null), ``partial``, ``exit_code``, ``started`` and ``finished``.

Re-running continues: a variant whose result file holds the same bundle sha256 and config key and
is not partial is not recomputed (``status: cached``); ``--force`` recomputes everything.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jetson.bundle import Bundle, Variant

RUN_FORMAT, RESULT_FORMAT, FORMAT_VERSION = "edge-jetson-run", "edge-jetson-result", 1
RUN_SUMMARY = "run.json"
LOG_KINDS = ("trt", "trtexec", "tegrastats")  # a variant's own log files, by kind


def write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON, written to a temporary file and renamed (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(value, f, indent=1)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def now() -> str:
    """This moment in UTC, to the second, as ISO 8601 (the results' ``started`` and ``finished``)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Measurement:
    """What a benchmark measured so far: kept by the caller, so an interrupted one still reports."""

    latencies_ms: list[float] = field(default_factory=list)
    warmup_calls: int = 0
    warmup_seconds: float = 0.0
    seconds: float = 0.0
    power: dict | None = None


class ResultsFolder:
    """The results folder of a run: the path of each file in it, and whether a variant is done already."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def summary_path(self) -> Path:
        return self.root / RUN_SUMMARY

    def result_path(self, variant: Variant) -> Path:
        return self.root / f"{variant.id}.json"

    def log_path(self, variant: Variant, kind: str) -> Path:
        """``logs/ID.KIND.log``: ``trt`` (TensorRT's messages), ``trtexec`` (its output), ``tegrastats``."""
        return self.root / "logs" / f"{variant.id}.{kind}.log"

    def run_log_path(self) -> Path:
        """``logs/run.log``: what the runner printed (jetson.run_log)."""
        return self.root / "logs" / "run.log"

    def nvcc_log_path(self) -> Path:
        """``logs/plugins.nvcc.log``: nvcc's output for edge's plugin library (jetson.plugin_build)."""
        return self.root / "logs" / "plugins.nvcc.log"

    def logs(self, variant: Variant) -> dict:
        """The variant's log files that exist, by kind, relative to the results folder."""
        return {kind: str(path.relative_to(self.root)) for kind in LOG_KINDS
                if (path := self.log_path(variant, kind)).is_file()}

    def done_before(self, variant: Variant, bundle_sha256: str, config_key: str) -> bool:
        """Whether the variant's result file is a whole result of this bundle and config."""
        path = self.result_path(variant)
        if not path.is_file():
            return False
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return (result.get("bundle_sha256") == bundle_sha256 and result.get("config_key") == config_key
                and result.get("partial") is False)


def new_summary(bundle: Bundle, backend: str) -> dict:
    """``run.json`` as a run starts: partial, with no device, settings, config or variant yet."""
    return {"format": RUN_FORMAT, "format_version": FORMAT_VERSION, "bundle": str(bundle.root),
            "bundle_sha256": bundle.sha256, "bundle_created_by": bundle.created_by,
            "backend": backend, "started": now(), "finished": None, "device": None,
            "settings": None, "config": None, "config_key": None, "variants": {}, "partial": True,
            "exit_code": None}


def variant_result(variant: Variant, info: dict, measured: Measurement, *, extra: dict, weight_bytes: int | None,
                   engine: dict | None, partial: bool, bundle_sha256: str, config: dict, config_key: str,
                   logs: dict) -> dict:
    """The variant's result in ``edge profile``'s schema plus the device runner's fields: ``info`` is the backend's
    description, ``extra`` its report (its CUDA events, memory, layers), ``engine`` the engine's facts."""
    from jetson.stats import latency_stats  # numpy: imported once the run needs it (`jetson check` reports it)

    batch = int(info.get("batch") or 1)
    latencies = measured.latencies_ms
    return {
        "format": RESULT_FORMAT, "format_version": FORMAT_VERSION,
        "variant": variant.name, "id": variant.id, **info, "precision": variant.precision,
        "latency": latency_stats(latencies, batch) if latencies else None,
        "warmup": {"iterations": measured.warmup_calls, "seconds": measured.warmup_seconds},
        "seconds": measured.seconds,
        "weight_bytes": weight_bytes,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "clock": "time.perf_counter (device host clock, synchronous calls)",
        **extra,
        "engine": engine,
        "power": measured.power,
        "partial": partial,
        "bundle_sha256": bundle_sha256, "config": config, "config_key": config_key,
        "graph": variant.graph, "graph_sha256": variant.graph_sha256,
        "logs": logs,
        "finished": now(),
    }
