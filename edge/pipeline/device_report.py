"""The device section of a pipeline report: what ``edge deploy`` measured on each device, per variant
and precision (device latency percentiles, energy per image and per call, memory) with the device record.

Pure functions of the fetched results (anything shaped as :class:`FetchedDevice`, as edge.deploy reads
them back; this module imports nothing of it): :func:`device_section` is ``report.json``'s ``device``,
and edge.pipeline.report, the report's one writer, renders it with :func:`device_markdown` and
:func:`device_html` after the pipeline's own sections.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

FORMAT = "edge-device-report"
WRONG = "wrong"  # jetson.accuracy_gate.WRONG: the engine computes other outputs than its graph
MIN_SAMPLES = 20  # jetson.energy.MIN_ENERGY_SAMPLES (a test holds them equal; this module imports no device code)
FORMAT_VERSION = 1
LATENCY_KEYS = ("iterations", "median_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "cv")
DEVICE_KEYS = ("device_model", "l4t", "hostname", "machine", "python", "container", "tensorrt", "gpu",
               "compute_capability", "sm_count", "memory_gib", "cuda_driver", "cuda_runtime", "cuda_binding",
               "power_mode", "identity")


def _energy(power: dict | None) -> dict | None:
    if not power or not power.get("total_rail"):
        return None
    total = power["rails"][power["total_rail"]]
    return {"rail": power["total_rail"], "per_image_mj": total["energy_per_image_mj"],
            "above_idle_per_image_mj": total["energy_above_idle_per_image_mj"],
            "per_call_mj": total["energy_per_call_mj"],
            "above_idle_per_call_mj": total["energy_above_idle_per_call_mj"],
            "batch": power["batch"], "calls": power["calls"],
            "mean_power_mw": total["mean_power_mw"], "idle_power_mw": total["idle_power_mw"],
            "samples": power["samples_timed"], "reliable": power["reliable"], "unreliable": power["unreliable"],
            "tegrastats_log": power.get("tegrastats_log")}


def _accuracy(accuracy: dict | None) -> dict | None:
    """The accuracy gate's verdict (jetson.accuracy_gate), its figures and why it failed."""
    if not accuracy:
        return None
    return {k: accuracy.get(k) for k in ("status", "top1_agreement", "max_abs_error", "max_rel_error", "images",
                                         "failures", "thresholds")}


def variant_row(variant_id: str, entry: dict, result: dict | None, results_dir: str) -> dict:
    """One variant's figures from its runner result (None when the runner never wrote it)."""
    result = result or {}
    power = result.get("power")
    latency = result.get("latency")
    return {
        "id": variant_id, "variant": result.get("variant"), "precision": result.get("precision"),
        "status": entry.get("status"), "partial": result.get("partial"), "error": entry.get("error"),
        "backend": result.get("backend"),
        "latency": {k: latency[k] for k in LATENCY_KEYS} if latency else None,
        "gpu_latency": {k: result["gpu_latency"][k] for k in LATENCY_KEYS} if result.get("gpu_latency") else None,
        "energy": _energy(power),
        "memory": {"peak_ram_used_mb": (power or {}).get("peak_ram_used_mb"),
                   "ram_total_mb": (power or {}).get("ram_total_mb"), "peak_rss_mb": result.get("peak_rss_mb"),
                   "device_memory": result.get("device_memory")},
        "engine": result.get("engine"),
        "accuracy": _accuracy(result.get("accuracy")),
        "result": f"{results_dir}/{entry['result']}" if entry.get("result") else None,
    }


def device_entry(record: dict, run: dict | None, results: dict[str, dict | None], folder: str) -> dict:
    """One device: edge deploy's record, the runner's run summary and results (paths under ``folder``)."""
    run = run or {}
    device = run.get("device") or {}
    return {
        "host": record["host"], "label": record["label"], "status": record["status"], "error": record["error"],
        "error_kind": record.get("error_kind"), "runner_exit_code": record.get("runner_exit_code"),
        "folder": folder, "backend": run.get("backend"), "partial": run.get("partial"),
        "bundle_sha256": record.get("bundle_sha256"),
        "device": {k: device.get(k) for k in DEVICE_KEYS} if device else None,
        "settings": run.get("settings"), "config": run.get("config"),
        "variants": [variant_row(i, e, results.get(i), f"{folder}/results")
                     for i, e in (run.get("variants") or {}).items()],
        "finished": record.get("finished"),
    }


class FetchedDevice(Protocol):
    """One device's folder of fetched results: edge deploy's record, the runner's run summary (None when
    it wrote none) and its result per variant id."""

    @property
    def folder(self) -> Path: ...
    @property
    def record(self) -> dict: ...
    @property
    def run(self) -> dict | None: ...
    @property
    def results(self) -> dict[str, dict | None]: ...


def device_section(fetched: Iterable[FetchedDevice], run_dir: Path) -> dict:
    """``report.json``'s ``device``: every device deployed to from the run ``run_dir`` (folders relative to it)."""
    devices = [device_entry(d.record, d.run, d.results, os.path.relpath(d.folder, run_dir)) for d in fetched]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "devices": devices,
            "failed": [d["label"] for d in devices if d["status"] != "ok"],
            "wrong": [f"{d['label']}: {v['id']}" for d in devices for v in d["variants"] if _wrong(v)]}


def _wrong(variant: dict) -> bool:
    """Whether the variant's engine failed the accuracy gate (its latency is then no speedup)."""
    return (variant.get("accuracy") or {}).get("status") == WRONG


COLUMNS = ("device", "variant", "precision", "backend", "status", "accuracy gate", "median ms", "p90 ms", "p99 ms",
           "CV %", "energy/image mJ", "above idle mJ", "mean power W", "peak RAM MB", "runner RSS MB")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _energy_cell(value, energy: dict) -> str:
    """An energy figure, marked with a * when too few tegrastats samples stand behind it."""
    return _fmt(value, ".3f") + ("*" if value is not None and energy.get("reliable") is False else "")


def gate_cell(accuracy: dict | None) -> str:
    """The gate's verdict and figures in a cell: ``pass (top-1 1.000, rel 2.1e-04)``; ``-`` without a gate."""
    if not accuracy:
        return "-"
    figures = ([f"top-1 {accuracy['top1_agreement']:.3f}"] if accuracy.get("top1_agreement") is not None else []) \
        + ([f"rel {accuracy['max_rel_error']:.2g}"] if accuracy.get("max_rel_error") is not None else [])
    return f"{accuracy['status']} ({', '.join(figures)})" if figures else str(accuracy["status"])


def table_rows(section: dict) -> list[tuple[str, ...]]:
    rows = []
    for device in section["devices"]:
        for v in device["variants"]:
            s, e, m = v["latency"] or {}, v["energy"] or {}, v["memory"]
            status = (WRONG if _wrong(v) else v["status"]) + (" (partial)" if v["partial"] else "")
            rows.append((device["label"], v["variant"] or v["id"], v["precision"] or "-", v["backend"] or "-", status,
                         gate_cell(v.get("accuracy")),
                         _fmt(s.get("median_ms"), ".3f"), _fmt(s.get("p90_ms"), ".3f"), _fmt(s.get("p99_ms"), ".3f"),
                         _fmt(s["cv"] * 100 if s.get("cv") is not None else None, ".1f"),
                         _energy_cell(e.get("per_image_mj"), e), _energy_cell(e.get("above_idle_per_image_mj"), e),
                         _fmt(e["mean_power_mw"] / 1000 if e.get("mean_power_mw") is not None else None, ".2f"),
                         _fmt(m["peak_ram_used_mb"], ",d"), _fmt(m["peak_rss_mb"], ".0f")))
    return rows


def device_lines(device: dict) -> list[str]:
    """The device record in words: board, L4T, TensorRT, CUDA, power mode, how it ended."""
    d = device["device"] or {}
    mode = (d.get("power_mode") or {}).get("name")
    settings = device.get("settings") or {}
    asked = (settings.get("power_mode") or {}).get("name")
    words = [f"`{device['label']}` ({device['host']}): {device['status']}"]
    if d:
        words.append(f"{d.get('device_model') or d.get('machine')}, L4T {d.get('l4t') or '-'}, TensorRT "
                     f"{d.get('tensorrt') or '-'}, CUDA {d.get('cuda_runtime') or '-'}, GPU {d.get('gpu') or '-'}"
                     f" ({d.get('sm_count') or '-'} SMs), power mode {mode or '-'}"
                     + (f" (set to {asked} for the run)" if asked else "")
                     + (", clocks locked" if settings.get("clocks_locked") else "")
                     + (", in a container (the board's device tree is masked there: its engines are its own)"
                        if d.get("container") else ""))
    if device["error"]:
        words.append("error: " + device["error"].splitlines()[0])
    return ["; ".join(words) + "."]


def device_markdown(section: dict) -> list[str]:
    """The section as Markdown lines (a heading, the devices, one table row per device and variant)."""
    lines = ["## On the devices", ""]
    lines += [f"- {line}" for device in section["devices"] for line in device_lines(device)]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows(section)]
    lines += ["", gate_words(section)]
    lines += ["", "Latency on the device's host clock; energy per image integrates the total rail "
              "(tegrastats, trapezoidal) over the timed window and divides by the images computed (calls x batch; "
              "report.json also has it per call), above idle subtracts the idle window's mean power; * marks energy "
              f"from fewer than {MIN_SAMPLES} tegrastats samples, not to be trusted. "
              "Each device's results and logs: " + ", ".join(f"`{d['folder']}/`" for d in section["devices"])
              + ".", ""]
    return lines


def gate_words(section: dict) -> str:
    """What the accuracy gate column means, and which variants it marked wrong."""
    words = ("Accuracy gate: each engine ran on the bundle's held-out images and was compared with its source "
             "graph's float32 ONNX Runtime outputs (top-1 agreement, largest error relative to the outputs' "
             "scale; thresholds per precision in jetson/accuracy_gate.py).")
    wrong = section.get("wrong") or []
    if wrong:
        words += (f" Wrong: {', '.join(wrong)}: the engine computes other outputs than its graph, so its latency "
                  "is no speedup; its failures are in report.json.")
    return words


def device_html(section: dict) -> str:
    """The section as an HTML fragment (styled by the pipeline report's CSS)."""
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f'<td class="text">{esc(c)}</td>' if i < 6 else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in table_rows(section))
    devices = "".join(f"<li>{esc(line)}</li>" for device in section["devices"] for line in device_lines(device))
    return (f'<h2>On the devices</h2><ul class="conditions">{devices}</ul>'
            f"<table><tr>{head}</tr>{body}</table><p>{esc(gate_words(section))}</p>"
            "<p>Energy per image: the total rail integrated over the timed window (tegrastats), divided by the "
            "images computed (calls x batch); above idle: less the idle window's mean power; * marks energy from "
            f"fewer than {MIN_SAMPLES} samples, not to be trusted. report.json has every figure (also per call) and "
            "the device records.</p>")
