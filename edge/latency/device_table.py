"""A latency table measured on a device: the grid as a bundle, deployed and run by the device runner.

    grid parts -> one ONNX graph each (fp32; fp16 converted here) -> edge bundle (variants
    NNN-KIND, one precision) -> edge deploy (copy over SSH, ``python3 -m jetson run`` there:
    TensorRT engines built and cached on the device, or ONNX Runtime with ``--backend ort``)
    -> results fetched -> OUT/LABEL/latency-table.json per device

The runner times the parts one after another (its own protocol: warm-up, iterations, the host
clock around synchronous calls; energy sampling off), not interleaved. Each device's table carries
the runner's device record (board, L4T, TensorRT, GPU identity) and its power mode by name; its
target's device is the board's model (the host name where there is no device tree).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import onnx
from torch import nn

from edge.bundle import BundleConfig, make_bundle
from edge.config import MAX_THREADS, option
from edge.deploy import DeployConfig, Host, deploy
from edge.errors import EdgeError
from edge.fileio import write_atomic
from edge.latency.grid import GRID_FILE, GridConfig, export_grid, grid_parts, read_grid
from edge.latency.parts import Part
from edge.latency.table import LatencyTable, Target
from jetson.bundle import Protocol

TABLE_FILE = "latency-table.json"
PRECISIONS = ("fp32", "fp16")
BACKEND_NAMES = {"tensorrt": "tensorrt", "ort": "onnxruntime"}


@dataclass(frozen=True)
class DeviceTableConfig:
    grid: GridConfig = field(default_factory=GridConfig)
    precision: str | None = None      # None: fp16 on TensorRT, fp32 on ONNX Runtime
    threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)   # ONNX Runtime on the device
    protocol: Protocol = field(default_factory=lambda: Protocol(warmup=20, iterations=200, duration_s=None,
                                                                energy_duration_s=None, idle_s=0.0))

    def resolved_precision(self, backend: str) -> str:
        precision = self.precision or ("fp16" if backend == "tensorrt" else "fp32")
        if precision not in PRECISIONS:
            raise EdgeError(f"--precision {precision}", expected=f"one of {', '.join(PRECISIONS)} for a latency table",
                            fix="int8 tables need calibrated Q/DQ part graphs, which edge does not make yet")
        return precision


def _to_fp16(paths: list[Path]) -> None:
    """Each part graph converted to fp16 in place, as edge.precision.fp16 converts a model (float32 islands kept)."""
    from edge.onnx_metadata import set_precision_metadata
    from edge.precision.fp16 import Fp16Config, convert_to_fp16

    for path in paths:
        converted, _ = convert_to_fp16(onnx.load(str(path)), Fp16Config())
        set_precision_metadata(converted, "float16")
        write_atomic(converted.SerializeToString(), path)


def grid_bundle(parts: list[Part], out: Path, batch: int, repeat: int, precision: str, protocol: Protocol, *,
                source: str = "", progress: Callable[[str], None] | None = None) -> dict:
    """The bundle of the grid's part graphs at ``out`` (its manifest), and beside it ``OUT.grid.json``: the
    variant names (``NNN-KIND``) and their parts."""
    with tempfile.TemporaryDirectory(prefix="edge-grid-") as tmp:
        folder = Path(tmp) / "graphs"
        graphs = export_grid(parts, folder, batch, repeat, source, progress)
        paths = [g.path for g in graphs.values()]
        if precision == "fp16":
            _to_fp16(paths)
        config = BundleConfig(precisions=(precision,), protocol=protocol)
        manifest = make_bundle(list(paths), out, config, force=True, progress=progress)
        (out.parent / f"{out.name}.grid.json").write_bytes((folder / GRID_FILE).read_bytes())
    return manifest


def table_from_results(results: Path, grid: dict[str, tuple[Part, int]], precision: str, batch: int, *,
                       source: dict | None = None) -> LatencyTable:
    """The table from the runner's results folder (``run.json`` and one result per variant)."""
    try:
        run = json.loads((results / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise EdgeError(f"{results}/run.json cannot be read", found=str(e), fix="deploy again") from e
    device = run.get("device") or {}
    medians: dict[Part, dict] = {}
    missing = []
    threads = None
    for name, (part, _) in grid.items():
        entry = (run.get("variants") or {}).get(f"{name}.{precision}") or {}
        try:
            result = json.loads((results / entry.get("result", "")).read_text()) if entry.get("result") else None
        except (OSError, ValueError):
            result = None
        if not result or result.get("partial") or not result.get("latency"):
            missing.append(name)
            continue
        medians[part] = result["latency"]
        threads = result.get("threads", threads)
    if missing:
        raise EdgeError(f"the device did not time {len(missing)} of {len(grid)} parts (first: {missing[0]})",
                        expected="a result for every part graph", found=f"see {results}/logs/run.log",
                        fix="deploy again: the runner continues where it stopped")
    backend = BACKEND_NAMES.get(str(run.get("backend")), str(run.get("backend")))
    # the mode the runner set for the run (--power-mode), else the one the device was in
    mode = ((run.get("settings") or {}).get("power_mode") or device.get("power_mode") or {}).get("name")
    name = device.get("device_model") or device.get("hostname") or "unknown device"
    target = Target(backend, str(name), precision, batch, threads if backend == "onnxruntime" else None, mode)
    return LatencyTable.from_medians(target, medians, {part: count for part, count in grid.values()},
                                     device_record=device, versions={
        "tensorrt": device.get("tensorrt"), "bundle_sha256": run.get("bundle_sha256"),
        "edge_bundle": run.get("bundle_created_by")}, protocol=run.get("config") or {}, source=source or {},
        clock="device runner: time.perf_counter around synchronous calls (jetson.runner)")


def deploy_table(model: nn.Module, hosts: list[Host], deploy_config: DeployConfig, config: DeviceTableConfig, *,
                 out: Path, source: str = "", progress: Callable[[str], None] | None = None) -> dict:
    """Time ``model``'s grid on each host; ``{"tables": label -> path, "deploy": edge.deploy's record}``."""
    backend = deploy_config.runner.backend
    precision = config.resolved_precision(backend)
    parts = grid_parts(model, config.grid)
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / "latency-grid-bundle"
    grid_bundle(parts, bundle, config.grid.batch, config.grid.resolved_repeat(model), precision, config.protocol,
                source=source, progress=progress)
    extra = ["--energy", "off", *(["--threads", str(config.threads)] if config.threads else [])]
    runner = replace(deploy_config.runner, extra=(*deploy_config.runner.extra, *extra))
    record = deploy(bundle, hosts, replace(deploy_config, runner=runner), out=out / "devices", progress=progress)
    grid = read_grid(out / f"{bundle.name}.grid.json")
    tables: dict[str, str] = {}
    errors: dict[str, str] = {}
    for device in record["devices"]:
        label = device["label"]
        if device["status"] != "ok":
            errors[label] = device["error"] or device["status"]
            continue
        try:
            table = table_from_results(out / "devices" / label / "results", grid, precision, config.grid.batch,
                                       source={"model": source, "grid": config.grid.grid, "host": device["host"],
                                               "repeat": config.grid.resolved_repeat(model)})
        except EdgeError as e:
            errors[label] = str(e)
            continue
        tables[label] = str(table.save(out / "devices" / label / TABLE_FILE))
        if progress is not None:
            progress(f"{device['host']}: {TABLE_FILE} ({table.describe()})")
    return {"tables": tables, "failed": errors, "deploy": record, "precision": precision,
            "grid": asdict(config.grid), "parts": len(parts)}
