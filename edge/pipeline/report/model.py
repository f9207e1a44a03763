"""report.json: every figure of a run, built from the records of its steps (:func:`build_report`).

The renderers above it (edge.pipeline.report.markdown, .html_page) read only that dict, so a report can be
rendered again without running anything; :data:`STORY_KEYS` is how they read a report of an earlier edge.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

from edge import __version__
from edge.pipeline.layout import ARTIFACT, BATCHED, BUNDLE, DEPLOYED, PLAN, VARIANTS, clean_name, headline_variants
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


#: the story's keys as a report of an earlier edge (format 2, before them) reads: ``edge deploy --report`` renders
#: such a report again with the device section
STORY_KEYS = {"plan": None, "methods": {}, "precision": [], "orin_estimate": None, "bundle": None, "next_commands": [],
              "not_measured": []}
