"""trtexec's output in the result schema of ``edge profile`` (the command itself: :mod:`edge.trt.trtexec_command`).

The parsers read what trtexec prints and exports (TensorRT 10.3 through 11): the
"=== Performance summary ===" block (lines may carry a timestamp and a ``[I]`` prefix; the
``[W]`` lines, such as the coefficient-of-variance warning, are written to stderr, so the log
passed must hold both streams), ``--exportTimes`` JSON (one object per inference, each of a whole
batch) and ``--exportProfile`` JSON (``[{"count": N}, {"name", "timeMs", "averageMs", "medianMs",
"percentage"}, ...]``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from edge.errors import EdgeError
from edge.profile.stats import latency_stats

_SUMMARY_LINE = re.compile(r"^(?:.*?\[[IWEV]\]\s*)?(?P<key>[A-Za-z0-9 ]+?):\s*(?P<value>.+)$")
_STAT = re.compile(r"(?P<name>min|max|mean|median|percentile\((?P<p>[\d.]+)%\))\s*=\s*(?P<value>[-\d.eE+]+)\s*ms")
_KEYS = {"Latency": "latency", "Enqueue Time": "enqueue", "H2D Latency": "h2d", "GPU Compute Time": "gpu_compute",
         "D2H Latency": "d2h"}


def _stat_block(text: str) -> dict:
    stats: dict[str, float] = {}
    for m in _STAT.finditer(text):
        if m.group("p"):
            p = float(m.group("p"))
            stats[f"p{p:g}_ms"] = float(m.group("value"))
        else:
            stats[{"median": "median_ms"}.get(m.group("name"), f"{m.group('name')}_ms")] = float(m.group("value"))
    return stats


def parse_summary(text: str) -> dict:
    """The "=== Performance summary ===" block of trtexec's log as numbers (ms, qps, s)."""
    start = text.find("=== Performance summary ===")
    if start < 0:
        raise EdgeError("no '=== Performance summary ===' in the trtexec output",
                        expected="the log of a trtexec run that benchmarked an engine",
                        fix="run trtexec without --skipInference and pass its full log")
    summary: dict = {"warnings": [line.split("[W]", 1)[1].strip() for line in text.splitlines() if "[W]" in line]}
    cv = re.findall(r"coefficient of variance\s*=\s*([\d.]+)\s*%", text)
    if cv:
        summary["gpu_compute_cv_warning"] = float(cv[-1]) / 100
    for line in text[start:].splitlines()[1:]:
        if "[W]" in line:
            continue
        if "===" in line:
            break
        m = _SUMMARY_LINE.match(line.strip())
        if not m:
            continue
        key, value = m.group("key").strip(), m.group("value")
        if key == "Throughput":
            summary["throughput_qps"] = float(value.split()[0])
        elif key in _KEYS:
            summary[_KEYS[key]] = _stat_block(value)
        elif key == "Total Host Walltime":
            summary["host_walltime_s"] = float(value.split()[0])
        elif key == "Total GPU Compute Time":
            summary["gpu_compute_total_s"] = float(value.split()[0])
    if "latency" not in summary:
        raise EdgeError("the trtexec performance summary has no Latency line", fix="pass trtexec's full log")
    return summary


def parse_times(data: list | str | Path, batch: int = 1) -> dict:
    """``--exportTimes`` JSON -> latency and GPU compute statistics over every inference of ``batch`` images."""
    records = _load_json(data)
    if not isinstance(records, list) or not records or "latencyMs" not in records[0]:
        raise EdgeError("not a trtexec --exportTimes file", expected="a JSON list of objects with latencyMs, "
                        "computeMs, h2dMs, d2hMs, startEnqMs, ...")
    result = {"latency": latency_stats([r["latencyMs"] for r in records], batch),
              "gpu_compute": latency_stats([r["computeMs"] for r in records], batch),
              "h2d": latency_stats([r["h2dMs"] for r in records], batch),
              "d2h": latency_stats([r["d2hMs"] for r in records], batch),
              "enqueue": latency_stats([r["endEnqMs"] - r["startEnqMs"] for r in records], batch)}
    result["seconds"] = (records[-1]["endD2hMs"] - records[0]["startEnqMs"]) / 1000.0
    return result


def parse_profile(data: list | str | Path) -> list[dict]:
    """``--exportProfile`` JSON -> the per-layer rows of ``edge profile`` (slowest first)."""
    records = _load_json(data)
    if not isinstance(records, list) or not records or "count" not in records[0]:
        raise EdgeError("not a trtexec --exportProfile file", expected='[{"count": N}, {"name", "timeMs", '
                        '"averageMs", "medianMs", "percentage"}, ...]')
    rows = [{"name": r["name"], "time_ms": float(r["timeMs"]), "average_ms": float(r["averageMs"]),
             "median_ms": float(r.get("medianMs", r["averageMs"])), "percentage": float(r["percentage"])}
            for r in records[1:]]
    return sorted(rows, key=lambda r: -r["time_ms"])


def trtexec_result(log: str | None = None, times: list | str | Path | None = None,
                   profile: list | str | Path | None = None, *, batch: int = 1, precision: str | None = None,
                   device: str | None = None) -> dict:
    """trtexec's output in the ``edge profile`` result schema (latency from exported times when given).

    The exported times give the latency statistics (images/s = batch / mean latency); trtexec's
    own throughput (which counts overlapping inferences) stays beside them as ``trtexec_throughput_qps``.
    """
    result: dict = {"backend": "tensorrt (trtexec)", "device": device, "precision": precision, "batch": batch,
                    "threads": None, "clock": "trtexec (CUDA events)"}
    if log is not None:
        summary = parse_summary(log)
        result["summary"] = summary
        stats = dict(summary["latency"])
        stats["throughput_qps"] = summary.get("throughput_qps")
        stats["throughput_images_per_s"] = (summary.get("throughput_qps") or 0.0) * batch
        result["latency"] = stats
        result["warnings"] = summary["warnings"]
        if "gpu_compute" in summary:
            result["gpu_latency"] = summary["gpu_compute"]
    if times is not None:
        parsed = parse_times(times, batch)
        if log is not None:
            parsed["latency"]["trtexec_throughput_qps"] = result["latency"]["throughput_qps"]
            parsed["latency"]["trtexec_throughput_images_per_s"] = result["latency"]["throughput_images_per_s"]
        result["latency"] = parsed["latency"]
        result["gpu_latency"] = parsed["gpu_compute"]
        result["transfers"] = {"h2d": parsed["h2d"], "d2h": parsed["d2h"], "enqueue": parsed["enqueue"]}
        result["seconds"] = parsed["seconds"]
    if profile is not None:
        result["layers"] = parse_profile(profile)
    if "latency" not in result:
        raise EdgeError("nothing to read", fix="pass trtexec's log and/or its --exportTimes file")
    return result


def _load_json(data: list | str | Path):
    if isinstance(data, list):
        return data
    try:
        return json.loads(Path(data).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EdgeError(f"cannot read trtexec JSON {data}", found=str(e)[:200]) from e
