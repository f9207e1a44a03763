"""The pipeline's reports: ``report.json`` (everything), ``report.md`` (the table) and a self-contained
``report.html`` (inline CSS; the accuracy-vs-latency chart and the analysis heatmaps as PNG data URIs).

This module is the reports' one writer: ``edge pipeline`` writes them (:func:`write_reports`) and
``edge deploy --report`` hands it the fetched device results (:func:`add_device_results`), which it
renders after the pipeline's own sections (edge.pipeline.device_report).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from edge import __version__
from edge.errors import EdgeError, plural
from edge.fileio import write_atomic, write_json_atomic
from edge.pipeline import device_report
from edge.pipeline.layout import ARTIFACT, DEPLOYED, REPORT, VARIANT_STEPS, VARIANTS, clean_name
from edge.profile.sidebyside import AA_SUFFIX

FORMAT = "edge-pipeline-report"
FORMAT_VERSION = 2  # 2: latency side by side (report["latency"], each variant's "speedup")


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Names whose (latency, accuracy) no other point beats: lower-or-equal latency and higher-or-equal
    accuracy, strictly better in one. Ordered by latency."""
    front = []
    for name, (lat, acc) in points.items():
        dominated = any(o_lat <= lat and o_acc >= acc and (o_lat < lat or o_acc > acc)
                        for other, (o_lat, o_acc) in points.items() if other != name)
        if not dominated:
            front.append(name)
    return sorted(front, key=lambda n: points[n])


def _verification(export: dict, clean: dict, verify: dict) -> dict:
    comparisons = [c for g in export.values() for c in g.get("verification", [])]
    comparisons += [c for g in clean.values() for c in g["verification"]]
    comparisons += [c for g in verify.values() for c in g["comparisons"]]
    return {
        "export_vs_torch": {g: r.get("verification", []) for g, r in export.items()},
        "clean_vs_export": {g: r["verification"] for g, r in clean.items()},
        "clean_vs_torch": {g: {"comparisons": r["comparisons"], "top1_agreement": r["top1_agreement"],
                               "passed": r["passed"]} for g, r in verify.items()},
        "max_abs": max((c["max_abs"] for c in comparisons), default=None),
        "rel_l2": max((c["rel_l2"] for c in comparisons), default=None),
        "passed": all(c["passed"] for c in comparisons),
    }


def variant_entry(run, latency: dict) -> dict:
    records = run.ctx.records[run.variant.name]
    count, export, clean = records["count"].result, records["export"].result, records["clean"].result
    evaluation, timed = records["evaluate"].result, latency["variants"][run.variant.name]
    compress = records["compress"].result if "compress" in records else None
    graphs = {}
    for graph, exported in export.items():
        cleaned = clean[graph]["report"]
        graphs[graph] = {"file": f"{VARIANTS}/{run.variant.name}/{graph}",
                         "clean_file": f"{VARIANTS}/{run.variant.name}/{clean_name(graph)}",
                         "batch": exported["batch"], "bytes": exported["bytes"], "nodes_exported": exported["nodes"],
                         "nodes_before_clean": cleaned["nodes_before"], "nodes_after_clean": cleaned["nodes_after"],
                         "clean_rounds": cleaned["rounds"], "clean_passes": cleaned["passes"]}
    backend = timed["backend"]
    return {
        "name": run.variant.name,
        "plan": run.plan,
        "requested_plan": run.variant.plan,
        "params": count["params"],
        "flops": count["flops"],
        "flops_analytic": count["flops_analytic"],
        "accuracy": evaluation["accuracy"],
        "correct": evaluation["correct"],
        "samples": evaluation["samples"],
        "loss": evaluation["loss"],
        "per_class_accuracy": evaluation["per_class_accuracy"],
        "accuracy_data": evaluation["data"],
        "accuracy_graph": evaluation["graph"],
        "graphs": graphs,
        "verification": _verification(export, clean, records["verify"].result),
        "latency": timed["latency"],   # this variant's calls in the side-by-side run (report["latency"])
        "speedup": timed["speedup"],   # against report["latency"]["reference"], with its interval and verdict
        "profile": {**{k: backend.get(k) for k in ("backend", "device", "precision", "batch", "threads",
                                                   "onnxruntime")},
                    "weight_bytes": timed["weight_bytes"],
                    "model": f"{VARIANTS}/{run.variant.name}/{latency['graph']}"},
        "compression": None if compress is None else {k: compress[k] for k in ("calibration", "fit", "planner",
                                                                                "seconds")},
        "artifact": f"{VARIANTS}/{run.variant.name}/{ARTIFACT}" if compress is not None else None,
        "steps": {name: record.summary() for name, record in records.items()},
    }


def latency_summary(latency, ctx) -> dict:
    """The side-by-side run as a whole: settings, the A/A control, whether it was too noisy to rank."""
    result = latency.result
    aa = result["variants"][result["reference"] + AA_SUFFIX]
    return {
        "reference": result["reference"],
        "aa_control": {**result["aa_control"], "median_ms": aa["latency"]["median_ms"]},
        "noisy": result["noisy"],
        "method": result["method"],
        "settings": result["settings"],
        "iterations_per_round": result["iterations_per_round"],
        "timed_calls_per_variant": aa["latency"]["iterations"],
        "creation_orders": result["creation_orders"],
        "onnxruntime": aa["backend"].get("onnxruntime"),
        "threads": aa["backend"].get("threads"),
        "hardware": result["hardware"],
        "contention": result["contention"],
        "clock": result["clock"],
        "seconds": round(result["seconds"], 2),
        "steps": {"profile": latency.summary()},
    }


def build_report(ctx, runs, analysis, latency, ort_log: dict, notice: str | None, seconds: float) -> dict:
    from edge.runtime import hardware, versions

    variants = [variant_entry(run, latency.result) for run in runs]
    baseline = next((v["accuracy"] for v in variants if v["requested_plan"] is None), None)
    for v in variants:
        v["accuracy_delta_pt"] = None if baseline is None else round(100 * (v["accuracy"] - baseline), 4)
    front = pareto_front({v["name"]: (v["latency"]["median_ms"], v["accuracy"]) for v in variants})
    for v in variants:
        v["pareto"] = v["name"] in front
    records = [r for per in ctx.records.values() for r in per.values()]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "edge": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "recipe": ctx.recipe.as_dict(),
        "data": {"requested": ctx.recipe.data, "used": ctx.data, "fallback_notice": notice},
        "hardware": hardware(),
        "versions": versions(),
        "threads": ctx.recipe.threads,
        "analysis": None if analysis is None else {**analysis.result, "steps": {"analysis": analysis.summary()}},
        "latency": latency_summary(latency, ctx),
        "variants": variants,
        "pareto_front": front,
        "onnxruntime_log": ort_log,
        "steps": {"ran": sum(r.status == "ran" for r in records), "cached": sum(r.status == "cached" for r in records)},
        "passed": all(v["verification"]["passed"] for v in variants),
        "seconds": round(seconds, 2),
    }


# ----------------------------------------------------------------------------------------------- tables


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _steps_cell(steps: dict) -> str:
    ran = [n for n, s in steps.items() if s["status"] == "ran"]
    return "all cached" if not ran else ("all ran" if len(ran) == len(steps) else f"ran: {', '.join(ran)}")


COLUMNS = ("variant", "plan", "params", "MFLOPs", "accuracy %", "delta pt", "median ms", "p10-p90 ms", "CV %",
           "speedup [95 % interval]", "vs reference", "nodes (clean)", "max abs err", "Pareto", "steps")


def speedup_cell(speedup: dict) -> str:
    return f"{speedup['speedup']:.3f}x [{speedup['low']:.3f}, {speedup['high']:.3f}]"


def _verdict_cell(report: dict, v: dict) -> str:
    return "reference" if v["name"] == report["latency"]["reference"] else v["speedup"]["verdict"]


def table_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for v in report["variants"]:
        s = v["latency"]
        deployed = v["graphs"][DEPLOYED]
        rows.append((v["name"], v["plan"] or "(original)", f"{v['params']:,}", f"{v['flops'] / 1e6:.1f}",
                     f"{100 * v['accuracy']:.2f}", _fmt(v["accuracy_delta_pt"], "+.2f"), f"{s['median_ms']:.3f}",
                     f"{s['p10_ms']:.3f}-{s['p90_ms']:.3f}", f"{100 * s['cv']:.1f}",
                     speedup_cell(v["speedup"]), _verdict_cell(report, v),
                     f"{deployed['nodes_before_clean']} -> {deployed['nodes_after_clean']}",
                     _fmt(v["verification"]["max_abs"], ".1e"), "yes" if v["pareto"] else "",
                     _steps_cell(v["steps"])))
    return rows


def latency_conditions(report: dict) -> list[str]:
    """How latency was measured, and what the A/A control says about the run (ranked, or too noisy)."""
    lat, first, hw = report["latency"], report["variants"][0], report["hardware"]
    p, s, aa = first["profile"], lat["settings"], lat["aa_control"]
    other = lat["contention"].get("other_cpu_share")
    count = len(report["variants"])
    lines = [
        f"Latency: {'all ' * (count > 1)}{plural(count, 'variant')} and an A/A control (`{aa['of']}` timed a second "
        f"time as its own variant) side by side in one run: {p['backend']} {lat['onnxruntime']} on the {p['device']} "
        f"({hw['cpu']}, {hw['cpu_count']} CPUs), {p['precision']}, batch {p['batch']}, "
        f"{plural(lat['threads'], 'intra-op thread')}; {s['sessions']} session sets created afresh in rotated "
        f"order, each with {s['warmup']} warm-up "
        f"calls per variant; {s['rounds']} rounds of {lat['iterations_per_round']} timed calls per variant, the "
        f"order shuffled each round, seeded ({lat['timed_calls_per_variant']} timed calls per variant, "
        f"{lat['seconds']:.0f} s); {lat['clock']}. Median and spread over a variant's timed calls."
        + (f" Other processes used {100 * other:.1f} % of the CPUs while timing"
           + (" (busy: not a clean figure)." if lat["contention"]["busy"] else ".") if other is not None else ""),
        f"Speedup against `{lat['reference']}` (above 1: faster): {lat['method']} ({s['resamples']} resamples, "
        f"seed {s['seed']}, {100 * s['confidence']:.0f} % interval). A variant is called faster or slower only when "
        "its whole interval lies beyond 1 by more than the A/A control's deviation.",
    ]
    control = (f"A/A control: `{aa['of']}` against itself {speedup_cell(aa)}, a deviation of "
               f"{100 * aa['deviation']:.1f} %")
    if lat["noisy"]:
        lines.append(f"**Too noisy to rank variants close to each other.** {control}, more than the "
                     f"{100 * s['aa_tolerance']:.0f} % bound: speedups within {100 * aa['deviation']:.1f} % of 1 are "
                     "not told apart (`too noisy to tell`); time again on a quieter machine "
                     "(`edge pipeline --out OUT --redo profile`).")
    else:
        lines.append(f"{control}, within the {100 * s['aa_tolerance']:.0f} % bound.")
        ranked = sorted((v for v in report["variants"] if v["name"] != lat["reference"]),
                        key=lambda v: -v["speedup"]["speedup"])
        lines.append("By speedup: " + ", ".join(f"`{v['name']}` {v['speedup']['speedup']:.3f}x "
                                                f"({v['speedup']['verdict']})" for v in ranked) + ".")
    return lines


def conditions(report: dict) -> list[str]:
    first = report["variants"][0]
    hw, rec, ort_log = report["hardware"], report["recipe"], report["onnxruntime_log"]
    lines = [
        f"Model `{rec['model']}`; data `{report['data']['used']}`"
        + (f" (fallback: {report['data']['fallback_notice']})" if report["data"]["fallback_notice"] else "") + ".",
        f"Accuracy: ONNX Runtime on each variant's cleaned dynamic-batch graph, {first['samples']:,} images of "
        f"`{first['accuracy_data']}`, batch {rec['evaluate']['batch_size']}.",
        *latency_conditions(report),
        f"Hardware: {hw['cpu']} ({hw['cpu_count']} CPUs), Python {hw['python']}, torch {hw['torch']}, "
        f"edge {report['edge']}.",
        f"Compression: {rec['calibration']['samples'] or 'per plan 500 (1,024 with wpac)'} class-balanced training "
        f"images, seed {rec['seed']}.",
        f"Steps this run: {report['steps']['ran']} ran, {report['steps']['cached']} cached; "
        f"{report['seconds']:.1f} s in all. Verification "
        + ("passed for every graph." if report["passed"] else "FAILED for at least one graph (see report.json)."),
    ]
    if ort_log["lines"]:
        lines.append(f"ONNX Runtime's notes this run (warnings about its own optimisations, not errors): "
                     f"{ort_log['lines']}, in {ort_log['file']}.")
    return lines


def markdown(report: dict) -> str:
    lines = ["# edge pipeline report", "", f"Created {report['created']} by edge {report['edge']}.", ""]
    lines += [f"- {c}" for c in conditions(report)]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(report)]
    lines += ["", f"Pareto front (lower median latency, higher accuracy): {', '.join(report['pareto_front'])}."]
    analysis = report["analysis"]
    if analysis:
        lines += ["", "## Analysis of the original model", "",
                  f"{analysis['samples']} calibration images of `{analysis['data']}`; most redundant block (highest "
                  f"Block Redundancy): {analysis['most_redundant_block']}. Heatmaps: "
                  + ", ".join(f"[{k}]({v})" for k, v in analysis["pictures"].items()) + "."]
    lines += ["", "report.html has the accuracy-vs-latency chart and the heatmaps; report.json has every figure.", ""]
    if report.get("device"):
        lines += device_report.device_markdown(report["device"])
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- HTML


def pareto_chart_png(report: dict) -> bytes:
    """Accuracy against median latency (whiskers: p10 to p90), the Pareto front joined by a step line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = report["variants"]
    fig, ax = plt.subplots(figsize=(7.2, 4.6), dpi=110, layout="constrained")
    for v in variants:
        s = v["latency"]
        x, y = s["median_ms"], 100 * v["accuracy"]
        color = "#c44e52" if v["pareto"] else "#4c72b0"
        ax.errorbar([x], [y], xerr=[[x - s["p10_ms"]], [s["p90_ms"] - x]], fmt="o", color=color, capsize=3,
                    markersize=7 if v["pareto"] else 5)
        ax.annotate(v["name"], (x, y), textcoords="offset points", xytext=(6, 5), fontsize=8)
    front = [v for v in variants if v["pareto"]]
    front.sort(key=lambda v: v["latency"]["median_ms"])
    if len(front) > 1:
        ax.step([v["latency"]["median_ms"] for v in front], [100 * v["accuracy"] for v in front], where="post",
                color="#c44e52", alpha=0.6, label="Pareto front")
        ax.legend(loc="lower right", fontsize=8)
    first = variants[0]
    ax.set_xlabel(f"median latency (ms), {first['profile']['backend']} {first['profile']['device']}, batch "
                  f"{first['profile']['batch']}, {first['profile']['threads']} threads (whiskers: p10 to p90)")
    ax.set_ylabel(f"top-1 accuracy (%), {first['samples']:,} test images")
    ax.set_title("accuracy vs latency (red: Pareto front)", fontsize=10)
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.text { text-align: left; font-family: monospace; }
tr.pareto td { background: #fdeeee; }
ul.conditions li { margin: 0.2em 0; font-size: 0.9em; }
figure { display: inline-block; margin: 0.5em; } figure img { max-width: 560px; border: 1px solid #ddd; }
figcaption { font-size: 0.8em; color: #555; }
"""


def _shared_step(summary: dict) -> str:
    return f"{summary['status']} ({summary['work_seconds']:.1f} s)"


def _img(png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def html_report(report: dict, out: Path) -> str:
    esc = html.escape
    text_columns = {0, 1, 10, 14}
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = []
    for v, row in zip(report["variants"], table_rows(report)):
        cells = "".join(f'<td class="text">{esc(c)}</td>' if i in text_columns else f"<td>{esc(c)}</td>"
                        for i, c in enumerate(row))
        body.append(f'<tr class="pareto">{cells}</tr>' if v["pareto"] else f"<tr>{cells}</tr>")
    steps_head = "".join(f"<th>{esc(s)}</th>" for s in VARIANT_STEPS)
    steps_rows = []
    for v in report["variants"]:
        cells = "".join("<td>-</td>" if s not in v["steps"] else
                        f"<td>{esc(v['steps'][s]['status'])} ({v['steps'][s]['work_seconds']:.1f} s)</td>"
                        for s in VARIANT_STEPS)
        steps_rows.append(f'<tr><td class="text">{esc(v["name"])}</td>{cells}</tr>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>edge pipeline report: {esc(report['recipe']['model'])}</title>", f"<style>{CSS}</style></head><body>",
        "<h1>edge pipeline report</h1>",
        f"<p>Created {esc(report['created'])} by edge {esc(report['edge'])}.</p>",
        '<ul class="conditions">' + "".join(f"<li>{esc(c)}</li>" for c in conditions(report)) + "</ul>",
        "<h2>Variants</h2>", f"<table><tr>{head}</tr>{''.join(body)}</table>",
        "<p>Rows in red are on the Pareto front (lower median latency, higher accuracy).</p>",
        _img(pareto_chart_png(report), "accuracy vs median latency; whiskers from p10 to p90"),
    ]
    analysis = report["analysis"]
    if analysis:
        parts.append("<h2>Analysis of the original model</h2>")
        parts.append(f"<p>{analysis['samples']} calibration images of {esc(analysis['data'])}; most redundant block "
                     f"(highest Block Redundancy): {analysis['most_redundant_block']}.</p>")
        for name, path in analysis["pictures"].items():
            parts.append(_img((out / path).read_bytes(), name.replace("_", " ")))
    parts += ["<h2>Steps this run</h2>", f'<table><tr><th>variant</th>{steps_head}</tr>{"".join(steps_rows)}</table>',
              "<p>profile (all variants side by side): "
              f"{esc(_shared_step(report['latency']['steps']['profile']))}.</p>",
              "<p>ran: done in this run; cached: its inputs (content hashes) did not change, so it was not redone. "
              "Seconds: the wall time of the work when it ran.</p>"]
    if report.get("device"):
        parts.append(device_report.device_html(report["device"]))
    parts += ["</body></html>", ""]
    return "\n".join(parts)


def write_reports(out: Path, report: dict) -> None:
    """report.json, report.md and report.html, each written atomically."""
    write_atomic(html_report(report, out).encode(), out / "report.html")
    write_atomic(markdown(report).encode(), out / "report.md")
    write_json_atomic(report, out / REPORT)


def add_device_results(run_dir: str | Path, fetched: Iterable[device_report.FetchedDevice]) -> Path:
    """The run's report with its device section (``device``) set to the ``fetched`` devices, written
    again (json, md, html); the report's path. ``edge pipeline`` run again writes it without one."""
    run_dir = Path(run_dir)
    path = run_dir / REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EdgeError(f"{path} cannot be read as JSON", found=f"{type(e).__name__}: {e}",
                        fix="run `edge pipeline` into the folder again") from e
    report["device"] = device_report.device_section(fetched, run_dir)
    write_reports(run_dir, report)
    return path
