"""How it was measured: the accuracy and latency conditions of a report, and its ranking by speedup."""

from __future__ import annotations

from edge.errors import plural
from edge.pipeline.report.tables import images_cell, speedup_cell


def calls_per_round(counts: dict[str, int], settings: dict) -> str:
    """Each variant's timed calls per round, in words: one count for all, or the range (about ``turn_ms`` each)."""
    values = set(counts.values())
    if len(values) == 1:
        return f"{plural(values.pop(), 'timed call')} per variant"
    return (f"{min(values)} to {max(values)} timed calls per variant (about {settings['turn_ms']:g} ms of each: "
            "fewer of a slow graph)")


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
        f"calls per variant; {s['rounds']} rounds of {calls_per_round(lat['iterations_per_round'], s)}, the "
        f"order shuffled each round, seeded ({lat['timed_calls_per_variant']} timed calls of `{aa['of']}`, "
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
