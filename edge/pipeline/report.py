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
import math
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from edge import __version__
from edge.errors import EdgeError, plural
from edge.fileio import write_atomic, write_json_atomic
from edge.pipeline import device_report
from edge.pipeline.layout import (ARTIFACT, BATCHED, BUNDLE, DEPLOYED, PLAN, REPORT, VARIANT_STEPS, VARIANTS,
                                  clean_name, headline_variants)
from edge.profile.sidebyside import AA_SUFFIX

FORMAT = "edge-pipeline-report"
# 2: latency side by side (report["latency"], each variant's "speedup"); 3: the story: plan, methods, precision,
# Orin estimate, bundle, next commands
FORMAT_VERSION = 3
#: the measured effect of one epoch of `edge finetune` on a planned model (every variant here is training-free)
FINETUNE_FIGURE = ("one epoch of `edge finetune` took the 0.5x plan of docs/results/plan-budget.md from its "
                   "training-free accuracy to 89.84 % (the original: 90.00 %)")


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


def variant_kind(run) -> str:
    if run.variant.searched:
        return "planned"
    return "original" if run.variant.plan is None else "method"


def plan_methods(plan: str | None) -> list[str]:
    """The compression methods of a plan, in the plan's order (none for the original)."""
    if not plan:
        return []
    from edge.compress.plan import parse_plan
    from edge.compress.registry import method_of

    return list(dict.fromkeys(method_of(step).name for step in parse_plan(plan).steps))


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
    estimate = records["estimate"].result if "estimate" in records else None
    return {
        "name": run.variant.name,
        "kind": variant_kind(run),
        "methods": plan_methods(run.plan),
        "training_free": True,
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
        "images": evaluation.get("images"),   # "full split (10,000)" or "subset (2,000)"
        "ci95": wilson_interval(evaluation["correct"], evaluation["samples"]),
        "same_images": evaluation.get("same_images"),   # a subset variant: the reference's figures on its images
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
        "artifact": f"{PLAN}/{ARTIFACT}" if run.variant.searched else
                    (f"{VARIANTS}/{run.variant.name}/{ARTIFACT}" if compress is not None else None),
        "orin_estimate": estimate,
        "steps": {name: record.summary() for name, record in records.items()},
    }


def wilson_interval(correct: int, images: int, z: float = 1.959964) -> list[float]:
    """The 95 % (Wilson score) interval of an accuracy of ``correct`` out of ``images``."""
    if not images:
        return [0.0, 1.0]
    p = correct / images
    centre = (p + z * z / (2 * images)) / (1 + z * z / images)
    half = z * math.sqrt(p * (1 - p) / images + z * z / (4 * images * images)) / (1 + z * z / images)
    return [round(max(0.0, centre - half), 6), round(min(1.0, centre + half), 6)]


def gate_figures(quantized: dict) -> dict:
    """The accuracy gate's figures of a converted graph: ``gate`` where edge quantize gives one, else its
    ``check`` (top-1 agreement and max abs against float32 on real images)."""
    found = quantized.get("gate") or quantized["check"]
    keys = ("images", "data", "outputs", "top1_agreement", "max_abs", "mean_abs", "rel_l2", "thresholds", "passed",
            "accepted_loss", "finite")
    return {k: found[k] for k in keys if k in found}


def precision_entry(run, latency: dict, variants: dict[str, dict], estimate) -> dict:
    """One fp16 or int8 row: its accuracy, the accuracy gate, its speed here and its Orin estimate."""
    records = run.ctx.records[run.name]
    quantized, evaluation, timed = records["quantize"].result, records["evaluate"].result, latency["variants"][run.name]
    base = variants[run.base.variant.name]
    same = evaluation["same_images"]   # float32 graphs on the images this one was evaluated on: paired figures
    orin = base["orin_estimate"]
    folder = f"{VARIANTS}/{run.base.variant.name}/{run.precision}"
    return {
        "name": run.name, "variant": run.base.variant.name, "precision": run.precision, "plan": base["plan"],
        "accuracy": evaluation["accuracy"], "correct": evaluation["correct"], "samples": evaluation["samples"],
        "images": evaluation.get("images"), "ci95": wilson_interval(evaluation["correct"], evaluation["samples"]),
        "accuracy_data": evaluation["data"], "same_images": same,
        "accuracy_delta_pt_vs_fp32": round(100 * (evaluation["accuracy"] - same[run.base.variant.name]["accuracy"]), 4),
        "top1_agreement_with_fp32": same[run.base.variant.name]["top1_agreement"],
        "gate": {graph: gate_figures(q) for graph, q in quantized.items()},
        "calibration": quantized[BATCHED]["calibration"], "placement": quantized[BATCHED]["placement"],
        "graphs": {"deployed": f"{folder}/{DEPLOYED}", "batched": f"{folder}/{BATCHED}"},
        "latency": timed["latency"], "speedup": timed["speedup"],
        "orin_estimate_ms": None if orin is None else orin["ms"][run.precision],
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
        "spread": result.get("spread"),   # each ratio's spread across its timing processes: flagged above tolerance
        "method": result["method"],
        "settings": result["settings"],
        "iterations_per_round": result["iterations_per_round"],
        "timed_calls_per_variant": aa["latency"]["iterations"],
        "creation_orders": result["creation_orders"],
        "processes": result.get("process", {}).get("processes", 1),
        "onnxruntime": aa["backend"].get("onnxruntime"),
        "threads": aa["backend"].get("threads"),
        "hardware": result["hardware"],
        "contention": result["contention"],
        "clock": result["clock"],
        "seconds": round(result["seconds"], 2),
        "steps": {"profile": latency.summary()},
    }


def orin_section(recipe, variants: list[dict], precisions: list[dict]) -> dict | None:
    """Every variant's Orin Nano estimate, its speedup against the original's, and the estimator's stated error."""
    settings = recipe.estimate
    if settings is None:
        return None
    from edge.latency import orin

    fitted = [r for r in orin.report() if "error" in r]
    reference = variants[0]["orin_estimate"]["ms"]
    rows = [{"name": v["name"], "precision": settings.precision, "ms": v["orin_estimate"]["ms"][settings.precision],
             "speedup": reference[settings.precision] / v["orin_estimate"]["ms"][settings.precision]}
            for v in variants]
    rows += [{"name": p["name"], "precision": p["precision"], "ms": p["orin_estimate_ms"],
              "speedup": reference[settings.precision] / p["orin_estimate_ms"]} for p in precisions]
    return {
        "device": orin.DEVICE, "power_mode": settings.power_mode, "batch": settings.batch,
        "precision": settings.precision, "reference": variants[0]["name"], "estimated": True, "rows": rows,
        "error": {"published": [{k: r[k] for k in ("name", "mode", "precision", "published_ms", "estimate_ms", "error",
                                                     "calibrated_on")} for r in fitted],
                  "largest_abs": max(abs(r["error"]) for r in fitted),
                  "held_out": [r["error"] for r in fitted if not r["calibrated_on"]],
                  "leave_one_out_largest_abs": max(abs(r["leave_one_out"]["error"]) for r in fitted),
                  "source": "docs/results/orin-estimator.md"},
        "note": (f"estimated by edge.latency.orin (a roofline per TensorRT kernel), not measured: within "
                 f"{100 * max(abs(r['error']) for r in fitted):.1f} % of the published Orin Nano figures it was "
                 "checked "
                 f"against (ViT-B/16 and DINOv2-B/14 at 224 px, fp16); on a model this small, launch costs (an assumed "
                 f"{orin.LAUNCH_US} us per kernel) weigh most, and no published figure checks that"),
    }


def next_commands(out: Path, recipe, bundle) -> list[str]:
    """What to run next, on a Jetson: the preflight check, then the deployment of the bundle with the report."""
    if bundle is None:
        return [f"edge bundle {out} --out {out}/bundle --precision fp32,fp16,int8",
                "edge deploy --check --host user@jetson",
                f"edge deploy {out}/bundle --host user@jetson --report {out}"]
    mode = f" --power-mode {recipe.estimate.power_mode}" if recipe.estimate is not None else ""
    return [f"edge deploy --check --host user@jetson{mode}",
            f"edge deploy {out}/{BUNDLE} --host user@jetson{mode} --report {out}"]


def not_measured(report: dict) -> list[str]:
    lines = ["No Jetson was used: every Orin Nano figure is an estimate; `edge deploy` measures them on the device."]
    if report["precision"]:
        lines.append("FP16 and INT8 latencies here are ONNX Runtime on this CPU, which runs many float16 ops in "
                     "float32 and has no Tensor Cores: they say nothing of the speed TensorRT gets on the device.")
    lines.append(f"Every variant is training-free. `edge finetune MODEL --data fmnist --epochs 1 --out DIR` distils "
                 f"one from the original: {FINETUNE_FIGURE}.")
    if report["plan"] and report["plan"]["target"]["backend"] == "estimate":
        lines.append("The plan was searched on the Orin estimate, not on this CPU: its speedup here is measured, its "
                     "speedup on the device estimated.")
    return lines


def build_report(ctx, runs, analysis, latency, ort_log: dict, notice: str | None, seconds: float, *,
                 planned=None, precisions=(), bundle=None) -> dict:
    from edge.runtime import hardware, versions

    variants = [variant_entry(run, latency.result) for run in runs]
    reference = latency.result["reference"]
    baseline = next(v["accuracy"] for v in variants if v["name"] == reference)
    for v in variants:   # a subset variant against the reference on the same images (paired)
        same = (v.get("same_images") or {}).get(reference)
        v["accuracy_delta_pt"] = round(100 * (v["accuracy"] - (same["accuracy"] if same else baseline)), 4)
    front = pareto_front({v["name"]: (v["latency"]["median_ms"], v["accuracy"]) for v in variants})
    for v in variants:
        v["pareto"] = v["name"] in front
    by_name = {v["name"]: v for v in variants}
    precision_rows = [precision_entry(run, latency.result, by_name, ctx.recipe.estimate) for run in precisions]
    for row in precision_rows:   # against the reference on the same images (evaluate.subset's)
        row["accuracy_delta_pt"] = round(100 * (row["accuracy"] - row["same_images"][reference]["accuracy"]), 4)
    records = [r for per in ctx.records.values() for r in per.values()]
    records += [r for r in (planned, bundle) if r is not None]
    plan = None if planned is None else {**planned.result, "variant": ctx.recipe.planned,
                                         "steps": {"plan": planned.summary()}}
    report = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "edge": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "recipe": ctx.recipe.as_dict(),
        "data": {"requested": ctx.recipe.data, "used": ctx.data, "fallback_notice": notice},
        "evaluate": {"test_split": len(ctx.test_set), "headline": sorted(headline_variants(ctx.recipe)),
                     "subset": ctx.recipe.evaluate.subset},
        "hardware": hardware(),
        "versions": versions(),
        "threads": ctx.recipe.threads,
        "plan": plan,
        "methods": {method: [v["name"] for v in variants if v["kind"] == "method" and v["methods"] == [method]]
                    for method in dict.fromkeys(m for v in variants for m in v["methods"])},
        "analysis": None if analysis is None else {**analysis.result, "steps": {"analysis": analysis.summary()}},
        "latency": latency_summary(latency, ctx),
        "variants": variants,
        "precision": precision_rows,
        "orin_estimate": orin_section(ctx.recipe, variants, precision_rows),
        "bundle": None if bundle is None else {**bundle.result, "path": str(ctx.out / BUNDLE),
                                               "steps": {"bundle": bundle.summary()}},
        "next_commands": next_commands(ctx.out, ctx.recipe, bundle),
        "pareto_front": front,
        "onnxruntime_log": ort_log,
        "steps": {"ran": sum(r.status == "ran" for r in records), "cached": sum(r.status == "cached" for r in records)},
        "passed": all(v["verification"]["passed"] for v in variants),
        "below_gate": [p["name"] for p in precision_rows if not all(g.get("passed", True) for g in p["gate"].values())],
        "seconds": round(seconds, 2),
    }
    report["not_measured"] = not_measured(report)
    return report


# ----------------------------------------------------------------------------------------------- tables


def _fmt(value, spec: str, missing: str = "-") -> str:
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
                     accuracy_cell(v), images_cell(v), _fmt(v["accuracy_delta_pt"], "+.2f"), f"{s['median_ms']:.3f}",
                     f"{s['p10_ms']:.3f}-{s['p90_ms']:.3f}", f"{100 * s['cv']:.1f}",
                     speedup_cell(v["speedup"]), _verdict_cell(report, v),
                     f"{deployed['nodes_before_clean']} -> {deployed['nodes_after_clean']}",
                     _fmt(v["verification"]["max_abs"], ".1e"), "yes" if v["pareto"] else "",
                     _steps_cell(v["steps"])))
    return rows


def _processes(lat: dict, settings: dict) -> str:
    """How the session sets were spread over new processes, for the latency conditions' sentence."""
    processes = lat.get("processes", 1)
    if processes <= 1:
        return " in one new process"
    each = "one" if processes == settings["sessions"] else "one or more"
    return f", {each} per new process ({processes} processes, one after the other, their timings pooled)"


def latency_conditions(report: dict) -> list[str]:
    """How latency was measured, and what the A/A control says about the run (ranked, or too noisy)."""
    lat, first, hw = report["latency"], report["variants"][0], report["hardware"]
    p, s, aa = first["profile"], lat["settings"], lat["aa_control"]
    other = lat["contention"].get("other_cpu_share")
    count = len(report["variants"]) + len(report.get("precision") or ())
    lines = [
        f"Latency: {'all ' * (count > 1)}{plural(count, 'graph')} and an A/A control (`{aa['of']}` timed a second "
        f"time as its own variant) side by side in one run: {p['backend']} {lat['onnxruntime']} on the {p['device']} "
        f"({hw['cpu']}, {hw['cpu_count']} CPUs), {p['precision']}, batch {p['batch']}, "
        f"{plural(lat['threads'], 'intra-op thread')}; {s['sessions']} session sets created afresh in rotated "
        f"order{_processes(lat, s)}, each with {s['warmup']} warm-up "
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
        others = sorted((v for v in report["variants"] if v["name"] != lat["reference"]),
                        key=lambda v: -v["speedup"]["speedup"])
        lines.append("By speedup: " + ranking(others) + ".")
        noisy = [v for v in others if v["speedup"].get("noisy")]
        if noisy:
            spread = lat.get("spread") or {}
            lines.append(f"Noisy (the speedup moved more than {100 * spread.get('tolerance', 0.05):.0f} % between the "
                         f"{spread.get('count', '')} timing {spread.get('groups', 'processes')}; `=` above: not told "
                         "apart): " + ", ".join(f"`{v['name']}` {100 * v['speedup']['process_spread']:.1f} %"
                                               for v in noisy) + ".")
    return lines


def ranking(rows: list[dict]) -> str:
    """Rows by speedup, fastest first: ``a 2.445x > b 1.311x = c 1.215x``; ``=`` where two neighbours differ by less
    than the larger of their spreads across timing processes (a noisy ratio is not ranked within its spread)."""
    parts = []
    for i, v in enumerate(rows):
        s = v["speedup"]
        if i:
            before = rows[i - 1]["speedup"]
            within = before["speedup"] / s["speedup"] - 1 <= max(before.get("process_spread", 0.0),
                                                                  s.get("process_spread", 0.0))
            parts.append("=" if within else ">")
        parts.append(f"`{v['name']}` {s['speedup']:.3f}x ({s['verdict']})")
    return " ".join(parts)


def accuracy_conditions(report: dict) -> str:
    """Which test images each graph's accuracy is on: the headline's and the subset's, with the recipe keys."""
    first, rec = report["variants"][0], report["recipe"]
    images = {v.get("images") or f"{v['samples']:,}" for v in report["variants"] + report["precision"]}
    sentence = (f"Accuracy: ONNX Runtime on each variant's cleaned dynamic-batch graph, batch "
                f"{rec['evaluate']['batch_size']}, on test images of `{first['accuracy_data']}`")
    if len(images) <= 1:
        return sentence + f": {images_cell(first)} for every graph; 95 % intervals (Wilson)."
    headline = ", ".join(f"`{n}`" for n in (report.get("evaluate") or {}).get("headline", [first["name"]]))
    subset = next(v for v in report["variants"] + report["precision"] if images_cell(v) != images_cell(first))
    return (sentence + f": the headline ({headline}, float32) on the {images_cell(first)}; every other graph on the "
            f"same seeded, class-balanced {images_cell(subset)} of it, marked so wherever its accuracy appears, its "
            "delta paired with the reference's accuracy on those images (`edge pipeline --full-split`, or the recipe "
            "keys `evaluate.subset` and `precision.test_images` null: every graph on the whole split); 95 % intervals "
            "(Wilson).")


def conditions(report: dict) -> list[str]:
    hw, rec, ort_log = report["hardware"], report["recipe"], report["onnxruntime_log"]
    lines = [
        f"Model `{rec['model']}`; data `{report['data']['used']}`"
        + (f" (fallback: {report['data']['fallback_notice']})" if report["data"]["fallback_notice"] else "") + ".",
        accuracy_conditions(report),
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


#: the story's keys as a report of an earlier edge (format 2, before them) reads: ``edge deploy --report`` renders
#: such a report again with the device section
STORY_KEYS = {"plan": None, "methods": {}, "precision": [], "orin_estimate": None, "bundle": None, "next_commands": [],
              "not_measured": []}


def markdown(report: dict) -> str:
    report = {**STORY_KEYS, **report}
    lines = ["# edge pipeline report", "", f"Created {report['created']} by edge {report['edge']}."]
    for section in story(report):
        lines += _md_section(section)
    lines += ["", "## Accuracy and speed", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(report)]
    lines += ["", f"Pareto front (lower median latency, higher accuracy): {', '.join(report['pareto_front'])}. "
              "report.html plots accuracy against speedup, measured here and estimated for the Orin Nano."]
    for section in story_after(report):
        lines += _md_section(section)
    lines += ["## How it was measured", ""]
    lines += [f"- {c}" for c in conditions(report)]
    analysis = report["analysis"]
    if analysis:
        lines += ["", "## Analysis of the original model", "",
                  f"{analysis['samples']} calibration images of `{analysis['data']}`; most redundant block (highest "
                  f"Block Redundancy): {analysis['most_redundant_block']}. Heatmaps: "
                  + ", ".join(f"[{k}]({v})" for k, v in analysis["pictures"].items()) + "."]
    lines += ["", "report.html has the accuracy-vs-speed chart and the heatmaps; report.json has every figure.", ""]
    if report.get("device"):
        lines += device_report.device_markdown(report["device"])
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ story
# Each section: a title, paragraphs, and tables (head, rows); markdown and HTML render the same sections.


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def asked_section(report: dict) -> tuple[str, list[str], list]:
    rec, plan = report["recipe"], report["plan"]
    lines = [f"Model `{rec['model']}`, data `{report['data']['used']}`."]
    if plan:
        t = plan["target"]
        where = f"{t['device']}" + (f", power mode {t['power_mode']}" if t.get("power_mode") else "")
        lines.append(f"A plan at most **{plan['budget']:g}x** of the original's latency ({plan['budget_ms']:.4g} ms) "
                     f"on **{where}** ({t['backend']}, {t['precision']}, batch {t['batch']}); "
                     + ("latency estimated, not measured (edge.latency.orin)." if t["backend"] == "estimate"
                        else f"latency table {plan['table']}."))
    methods = report["methods"]
    if methods:
        lines.append("Beside it, one variant per compression method: " + "; ".join(
            f"{m}: {', '.join(f'`{n}`' for n in names)}" for m, names in methods.items()) + ".")
    if report["precision"]:
        lines.append("FP16 and INT8 of " + ", ".join(sorted({f"`{p['variant']}`" for p in report["precision"]}))
                     + ".")
    return "What was asked", lines, []


def chosen_section(report: dict) -> tuple[str, list[str], list] | None:
    plan = report["plan"]
    if not plan:
        return None
    chosen, original = plan["chosen"], plan["original"]
    lines = [f"`edge plan` chose **`{chosen['plan']}`** (the variant `{plan['variant']}`): predicted "
             f"{chosen['predicted_ms']:.4g} ms, {original['predicted_ms'] / chosen['predicted_ms']:.2f}x faster "
             "than the "
             f"original's {original['predicted_ms']:.4g} ms; held-out KL {chosen['kl']:.4g}, top-1 agreement with the "
             f"original {100 * chosen['agreement']:.2f} % on {plan['search']['holdout']} held-out training images.",
             f"Each round took the move with the least KL lost per ms saved, measured beside the plan so far "
             f"({plan['measured_plans']} plans measured, {plan['refused']} refused, {plan['seconds']:.0f} s; "
             f"{plan['search']['samples']} calibration images). Its record: {plan['files']['record']}, "
             f"{plan['files']['markdown']}, {plan['files']['plot']}."]
    rounds = [(str(r["round"]), r["method"], r["label"], f"{r['predicted_ms']:.4g}", f"{r['kl']:.4g}",
               f"{100 * r['agreement']:.2f} %", r["why"]) for r in plan["rounds"]]
    front = [(p["plan"] or "(original)", f"{p['predicted_ms']:.4g}", f"{p['kl']:.4g}", f"{100 * p['agreement']:.2f} %",
              _floor_cell(p.get("floor_margin"))) for p in plan["front"]]
    return "What was chosen and why", lines, [
        (("round", "method", "move", "predicted ms", "KL", "agreement", "why"), rounds),
        (("Pareto front: plan", "predicted ms", "KL", "agreement", "above the fidelity floor"), front)]


def _floor_cell(margin: float | None) -> str:
    """A plan's margin above edge plan's agreement floor (older reports record none)."""
    if margin is None or margin != margin:
        return "-"
    return f"{100 * margin:+.2f} pt" if margin >= 0 else f"{100 * margin:+.2f} pt: below, destroyed"


def precision_section(report: dict) -> tuple[str, list[str], list] | None:
    rows = report["precision"]
    if not rows:
        return None
    table = []
    for p in rows:
        gate = p["gate"][BATCHED]
        fp32 = p.get("same_images", {}).get(p["variant"])   # None in a report written before the paired figures
        table.append((p["name"], accuracy_cell(p), images_cell(p), _fmt(fp32 and 100 * fp32["accuracy"], ".2f"),
                      f"{p['accuracy_delta_pt_vs_fp32']:+.2f}", _pct(p.get("top1_agreement_with_fp32")),
                      _pct(gate.get("top1_agreement")), _fmt(gate.get("rel_l2"), ".2e"),
                      {True: "passed", False: "below: not bundled"}.get(gate.get("passed"), "-"),
                      speedup_cell(p["speedup"]), _fmt(p["orin_estimate_ms"], ".4f")))
    first = rows[0]
    gate = first["gate"][BATCHED]
    calibrated = next((p["calibration"] for p in rows if p["calibration"]), None)
    whole = first["samples"] == report["variants"][0]["samples"]
    images = (f"the same {first['samples']:,} test images as the float32 rows" if whole else
              f"the {images_cell(first)} of the test images (seeded, class-balanced, the method variants' too; "
              "`--full-split`: all of them)")
    lines = [f"Each graph made by `edge quantize` (the library's defaults"
             + (f"; INT8 calibrated on {calibrated['samples']} training images of `{calibrated['data']}`" if calibrated
                else "") + f") from the variant's cleaned float32 graphs. Accuracy with ONNX Runtime on {images}, "
             "beside its float32 graph's accuracy on those same images (paired: `vs float32` and the top-1 agreement "
             f"are on one set of images); the accuracy gate against float32 on {gate.get('images', '-')} test images"
             + (f" of `{gate['data']}`" if gate.get("data") else "")
             + " (of the dynamic-batch graph; the static one's in report.json). Speedup: against the float32 original "
               "here (ONNX Runtime on this CPU)."]
    if report.get("below_gate"):
        lines.append(f"Below the accuracy gate: {', '.join(report['below_gate'])}. `edge quantize` refuses such a "
                     "graph (exit 2, naming the nodes that add most error); the pipeline writes it with the loss "
                     "accepted so that its accuracy shows what the gate saw, and leaves it out of the bundle. A "
                     "training-free plan has closer logits than the original, so rounding flips more of its answers: "
                     "fine-tune it first (`edge finetune`), or ship its FP16.")
    return "Precision", lines, [(("graph", "accuracy % [95 %]", "test images", "float32 on the same images %",
                                  "vs float32 pt",
                                  "top-1 agreement with float32", "gate top-1 agreement", "gate rel L2", "gate",
                                  "speedup here [95 %]", "Orin est. ms"), table)]


def orin_rows(report: dict) -> list[tuple[str, ...]]:
    orin = report["orin_estimate"]
    measured = {v["name"]: v["speedup"] for v in report["variants"]} | {p["name"]: p["speedup"]
                                                                           for p in report["precision"]}
    return [(r["name"], r["precision"], f"{r['ms']:.4f}", f"{r['speedup']:.2f}x",
             f"{measured[r['name']]['speedup']:.2f}x") for r in orin["rows"]]


def orin_section_text(report: dict) -> tuple[str, list[str], list] | None:
    orin = report["orin_estimate"]
    if not orin:
        return None
    lines = [f"**Estimates, not measurements**: {orin['device']}, power mode {orin['power_mode']}, batch "
             f"{orin['batch']}, TensorRT {orin['precision']} for the float32 variants (FP16/INT8 rows at their own "
             f"precision). {orin['note']} ({orin['error']['source']})."]
    return "On the Orin Nano (estimated)", lines, [(("variant", "precision", "estimated ms", "estimated speedup",
                                                      "measured speedup here"), orin_rows(report))]


def bundle_section(report: dict) -> tuple[str, list[str], list] | None:
    bundle = report["bundle"]
    if not report["next_commands"]:
        return None
    lines = []
    if bundle:
        lines.append(f"`{bundle['path']}`: what `edge bundle` makes ({', '.join(bundle['variants'])}; "
                     f"{bundle['files']} files: graphs, TensorRT build configs, the accuracy gate on "
                     f"{bundle['gate_images']} images, the device runner)"
                     + (f"; left out, below the accuracy gate: {', '.join(bundle['left_out'])}"
                        if bundle.get("left_out") else "") + ".")
        if bundle.get("reused"):
            lines.append(f"The FP16/INT8 graphs shipped are the ones evaluated above ({', '.join(bundle['reused'])}), "
                         "byte for byte.")
    lines.append("Next, on a Jetson (the device builds its engines from the bundle; results join this report):")
    lines += [f"`{c}`" for c in report["next_commands"]]
    return "The bundle, and what to run next", lines, []


def not_measured_section(report: dict) -> tuple[str, list[str], list] | None:
    return ("What was not measured", report["not_measured"], []) if report["not_measured"] else None


def story(report: dict) -> list[tuple[str, list[str], list]]:
    """The report's sections top-down, before the variants table."""
    return [s for s in (asked_section(report), chosen_section(report)) if s is not None]


def story_after(report: dict) -> list[tuple[str, list[str], list]]:
    """The sections after the variants table."""
    return [s for s in (precision_section(report), orin_section_text(report), bundle_section(report),
                        not_measured_section(report)) if s is not None]


def _md_section(section) -> list[str]:
    title, lines, tables = section
    out = ["", f"## {title}", ""]
    for line in lines:
        out += [line, ""]
    for head, rows in tables:
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        out.append("")
    return out


def _html_inline(text: str) -> str:
    """Markdown's `code` and **bold** of a story line, escaped."""
    import re

    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


def _html_section(section) -> str:
    title, lines, tables = section
    parts = [f"<h2>{html.escape(title)}</h2>"] + [f"<p>{_html_inline(line)}</p>" for line in lines]
    for head, rows in tables:
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
                     + "".join("<tr>" + "".join(f'<td class="text">{html.escape(str(c))}</td>' for c in row) + "</tr>"
                               for row in rows) + "</table>")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------- HTML


def speed_chart_png(report: dict) -> bytes:
    """Accuracy against speedup over the original: measured here (ONNX Runtime, whiskers: the 95 % interval)
    and, where the recipe asks for it, estimated for the Orin Nano: two labelled series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*report["variants"], *report["precision"]]
    first = report["variants"][0]
    fig, ax = plt.subplots(figsize=(7.6, 4.8), dpi=110, layout="constrained")
    labelled = set()
    for v in rows:
        s, y = v["speedup"], 100 * v["accuracy"]
        subset = v["samples"] != first["samples"]   # on evaluate.subset of the test images
        label = (f"measured here, accuracy on the {images_cell(v)} (method variants, FP16/INT8)" if subset
                 else f"measured here (ONNX Runtime, CPU), accuracy on the {images_cell(first)}")
        ax.errorbar([s["speedup"]], [y], xerr=[[s["speedup"] - s["low"]], [s["high"] - s["speedup"]]],
                    fmt="s" if subset else "o", color="#55a868" if subset else "#4c72b0", capsize=3, markersize=6,
                    label=None if label in labelled else label)
        labelled.add(label)
        ax.annotate(v["name"], (s["speedup"], y), textcoords="offset points", xytext=(6, 5), fontsize=7)
    orin = report["orin_estimate"]
    if orin:
        accuracy = {v["name"]: v["accuracy"] for v in rows}
        for i, r in enumerate(orin["rows"]):
            ax.plot([r["speedup"]], [100 * accuracy[r["name"]]], "D", color="#dd8452", markersize=5,
                    label=f"Orin Nano, estimated ({orin['power_mode']}, TensorRT)" if not i else None)
            ax.annotate(r["name"], (r["speedup"], 100 * accuracy[r["name"]]), textcoords="offset points",
                        xytext=(6, -9), fontsize=7, color="#a0522d")
    ax.axvline(1.0, color="#999", lw=0.8)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_xlabel(f"speedup over `{report['latency']['reference']}` (here: measured, batch "
                  f"{first['profile']['batch']}, "
                  f"whiskers: 95 % interval; Orin: estimated)")
    ax.set_ylabel("top-1 accuracy (%), test images as the legend says")
    ax.set_title("accuracy vs speed: measured here and estimated for the Orin Nano", fontsize=10)
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
    report = {**STORY_KEYS, **report}
    esc = html.escape
    text_columns = {COLUMNS.index(c) for c in ("variant", "plan", "test images", "vs reference", "steps")}
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
        *[_html_section(section) for section in story(report)],
        "<h2>Accuracy and speed</h2>", f"<table><tr>{head}</tr>{''.join(body)}</table>",
        "<p>Rows in red are on the Pareto front (lower median latency, higher accuracy).</p>",
        _img(speed_chart_png(report), "accuracy vs speedup over the original: measured here (circles, 95 % "
                                      "interval) and estimated for the Orin Nano (diamonds)"),
        *[_html_section(section) for section in story_after(report)],
        "<h2>How it was measured</h2>",
        '<ul class="conditions">' + "".join(f"<li>{esc(c)}</li>" for c in conditions(report)) + "</ul>",
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
