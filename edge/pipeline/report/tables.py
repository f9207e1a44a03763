"""The variants table of report.md and report.html, and the cells the other sections share."""

from __future__ import annotations

from edge.pipeline.layout import DEPLOYED


def format_cell(value, spec: str, missing: str = "-") -> str:
    """``value`` formatted with ``spec``, or ``missing`` when there is none."""
    return missing if value is None else format(value, spec)


def _steps_cell(steps: dict) -> str:
    ran = [n for n, s in steps.items() if s["status"] == "ran"]
    return "all cached" if not ran else ("all ran" if len(ran) == len(steps) else f"ran: {', '.join(ran)}")


COLUMNS = ("variant", "plan", "params", "MFLOPs", "accuracy % [95 %]", "test images", "delta pt", "median ms",
           "p10-p90 ms", "CV %",
           "speedup [95 % interval]", "vs reference", "nodes (clean)", "max abs err", "Pareto", "steps")


def speedup_cell(speedup: dict) -> str:
    return f"{speedup['speedup']:.3f}x [{speedup['low']:.3f}, {speedup['high']:.3f}]"


def _verdict_cell(report: dict, v: dict) -> str:
    if v["name"] == report["latency"]["reference"]:
        return "reference"
    return v["speedup"]["verdict"] + (f"; noisy: {100 * v['speedup']['process_spread']:.1f} % across timing "
                                      f"{report['latency'].get('spread', {}).get('groups', 'processes')}"
                                      if v["speedup"].get("noisy") else "")


def accuracy_cell(v: dict) -> str:
    """``89.84 [89.25, 90.41]``: the accuracy and its 95 % interval, in percent (a report without it: the figure)."""
    ci = v.get("ci95")
    return f"{100 * v['accuracy']:.2f}" + (f" [{100 * ci[0]:.2f}, {100 * ci[1]:.2f}]" if ci else "")


def images_cell(v: dict) -> str:
    return v.get("images") or f"{v['samples']:,}"


def table_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for v in report["variants"]:
        s = v["latency"]
        deployed = v["graphs"][DEPLOYED]
        rows.append((v["name"], v["plan"] or "(original)", f"{v['params']:,}", f"{v['flops'] / 1e6:.1f}",
                     accuracy_cell(v), images_cell(v), format_cell(v["accuracy_delta_pt"], "+.2f"),
                     f"{s['median_ms']:.3f}",
                     f"{s['p10_ms']:.3f}-{s['p90_ms']:.3f}", f"{100 * s['cv']:.1f}",
                     speedup_cell(v["speedup"]), _verdict_cell(report, v),
                     f"{deployed['nodes_before_clean']} -> {deployed['nodes_after_clean']}",
                     format_cell(v["verification"]["max_abs"], ".1e"), "yes" if v["pareto"] else "",
                     _steps_cell(v["steps"])))
    return rows
