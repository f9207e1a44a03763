"""The report's story: the sections before the variants table (what was asked, what was chosen and why) and after it
(precision, the Orin estimate, the bundle, what was not measured).

Each section: a title, paragraphs, and tables (head, rows); Markdown and HTML render the same sections.
"""

from __future__ import annotations

from edge.pipeline.layout import BATCHED
from edge.pipeline.report.tables import accuracy_cell, format_cell, images_cell, speedup_cell


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
        table.append((p["name"], accuracy_cell(p), images_cell(p), format_cell(fp32 and 100 * fp32["accuracy"], ".2f"),
                      f"{p['accuracy_delta_pt_vs_fp32']:+.2f}", _pct(p.get("top1_agreement_with_fp32")),
                      _pct(gate.get("top1_agreement")), format_cell(gate.get("rel_l2"), ".2e"),
                      {True: "passed", False: "below: not bundled"}.get(gate.get("passed"), "-"),
                      speedup_cell(p["speedup"]), format_cell(p["orin_estimate_ms"], ".4f")))
    first = rows[0]
    gate = first["gate"][BATCHED]
    calibrated = next((p["calibration"] for p in rows if p["calibration"]), None)
    whole = first["samples"] == report["variants"][0]["samples"]
    images = (f"the same {first['samples']:,} test images as the float32 rows" if whole else
              f"the {images_cell(first)} of the test images (seeded, class-balanced, the method variants' too; "
              "`--full-split`: all of them)")
    lines = ["Each graph made by `edge quantize` (the library's defaults"
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
