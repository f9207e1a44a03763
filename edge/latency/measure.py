"""Timing a grid of part graphs on ONNX Runtime here, interleaved, into a latency table.

Every part graph gets its own ONNX Runtime session (CPU, all graph optimisations, a fixed thread
count, pool threads sleeping between calls), and all are timed side by side
(:func:`edge.profile.sidebyside.interleave`): ``sessions`` sets of sessions created afresh in
rotated order, each warmed up, then rounds in which every part makes ``iterations`` timed calls in
a seeded random order, so the machine's drift hits all parts alike. A part's latency is the
median of all its timed calls (with p90/p95/p99 and the per-round medians in the table).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from torch import nn

from edge.errors import EdgeError
from edge.latency.grid import GridConfig, export_grid, grid_parts
from edge.latency.parts import Part
from edge.latency.table import LatencyTable, here
from edge.profile.contention import CpuContention
from edge.profile.graphs import CLOCK, TimingConfig, time_graphs


def time_parts(parts: list[Part], batch: int, timing: TimingConfig, *, repeat: int = 1, source: str = "",
               work: Path | None = None, progress: Callable[[str], None] | None = None) -> LatencyTable:
    """Export each part once (static ``batch``; token-stream parts as chains of ``repeat`` copies) and time
    them all on ONNX Runtime here: the table."""
    from edge import __version__
    from edge.runtime import hardware, versions

    if not any(p.kind == "overhead" for p in parts):
        raise EdgeError("the parts hold no overhead part", fix="add edge.latency.parts.overhead_part(dim, tokens)")
    progress = progress or (lambda message: None)
    with tempfile.TemporaryDirectory(prefix="edge-latency-", dir=work) as tmp:
        graphs = export_grid(parts, Path(tmp), batch, repeat, source, progress)
        progress(f"timing {len(parts)} part graphs side by side ({timing.rounds} rounds, "
                 f"{timing.per_round()} calls each per round, {timing.threads} threads)")
        with CpuContention() as contention:
            stats = time_graphs({name: g.path for name, g in graphs.items()}, timing, batch)
    medians = {graphs[name].part: s for name, s in stats.items()}
    return LatencyTable.from_medians(
        here(batch, timing.threads), medians, {g.part: g.repeat for g in graphs.values()},
        device_record={**hardware(), "contention": contention.result()},
        versions={**versions(), "edge": __version__},
        protocol={**asdict(timing), "per_round": timing.per_round(), "repeat": repeat,
                  "order": "interleaved (edge.profile.sidebyside)",
                  "provider": "CPUExecutionProvider", "optimization": "ORT_ENABLE_ALL",
                  "spinning": "within a call only (session.force_spinning_stop)"},
        source={"model": source, "parts": len(parts)}, clock=CLOCK)


def measure_table(model: nn.Module, grid: GridConfig, timing: TimingConfig, *, source: str = "",
                  progress: Callable[[str], None] | None = None) -> LatencyTable:
    """The latency table of ``model``'s grid (``grid.grid``: its own parts, or every part a plan can produce)."""
    parts = grid_parts(model, grid)
    table = time_parts(parts, grid.batch, timing, repeat=grid.resolved_repeat(model), source=source,
                       progress=progress)
    table.source.update(grid=grid.grid, align=grid.align, mlp_align=grid.mlp_align)
    return table
