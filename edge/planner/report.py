"""``edge plan``'s record for a reader: ``plan.md`` and the Pareto plot ``pareto.png``."""

from __future__ import annotations

from pathlib import Path


def _speed(original_ms: float, ms: float) -> str:
    return f"{original_ms / ms:.2f}x" if ms > 0 else "-"


def markdown(record: dict) -> str:
    result = record["result"]
    chosen, original = result["chosen"], result["original"]
    base = original["predicted_ms"]
    target = record["target"]
    lines = [
        f"# edge plan: {record['model'].get('model')} within {record['budget_ms']:.4g} ms",
        "",
        f"Target: {target['backend']} on {target['device']}, {target['precision']}, {_batch_text(record)}"
        + (f", {target['threads']} threads" if target.get("threads") else "")
        + (f", power mode {target['power_mode']}" if target.get("power_mode") else "")
        + f"; latency table `{record['table']}`" + (" and one per other batch." if len(record.get("batches") or []) > 1
                                                     else "."),
        f"Budget: {record['budget_ms']:.4g} ms"
        + (f" ({record['budget']:g}x of the original's predicted {base:.4g} ms)" if record.get("budget") else "")
        + ".",
        "",
        f"**Chosen plan**: `{chosen['plan']}`",
        "",
        f"- predicted {chosen['predicted_ms']:.4g} ms ({_speed(base, chosen['predicted_ms'])} of the original's "
        f"{base:.4g} ms)",
        f"- held-out fidelity to the original ({result['holdout']['samples']} training images not used for "
        f"fitting): KL {chosen['kl']:.4g}, top-1 agreement {chosen['agreement']:.4f}"
        + _margin_text(chosen, result),
        f"- {len(result['rounds'])} rounds, {len(result['points'])} plans measured, {result['builds']} steps fitted, "
        f"{result['seconds']:.0f} s; methods: {', '.join(result['methods'])}",
        "",
    ]
    lines += _batches(record) + _shape_rules(result.get("shape_rules") or {})
    timed = record.get("timed")
    if timed:
        lines += [
            "## Measured whole (ONNX Runtime here, side by side in a fresh process)",
            "",
            f"Original {timed['original_ms']:.4g} ms (median); A/A copy / original {timed['aa_ratio']:.3f}. "
            "The graphs timed are in `timed/`, made by `edge export` then `edge clean`"
            + (f"; to time them again: `{timed['protocol']['retime']}`." if "retime" in timed.get("protocol", {})
               else "."),
            "",
            "| plan | predicted ms | measured ms | speedup measured | speedup predicted | prediction error | KL |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in timed["plans"]:
            lines.append(f"| `{row['plan']}` | {row['predicted_ms']:.4g} | {row['measured_ms']:.4g} | "
                         f"{row['speedup']:.3f}x | {row['predicted_speedup']:.3f}x | "
                         f"{100 * row['prediction_error']:+.1f} % | {row['kl']:.4g} |")
        lines.append("")
    if len(record.get("corrections") or []) > 1:
        lines += ["## Budget corrected by whole-model timing", "",
                  "The chosen plan, timed whole beside the original, missed the budget; the search walked on to a "
                  "tighter predicted budget (by how optimistic the prediction was).", "",
                  "| searched budget ms | plan | predicted | measured | A/A | met |", "|---|---|---|---|---|---|"]
        for c in record["corrections"]:
            lines.append(f"| {c['budget_ms']:.4g} | `{c['plan']}` | {c['predicted_speedup']:.3f}x | "
                         f"{c['measured_speedup']:.3f}x | {c['aa_ratio']:.3f} | {'yes' if c['met'] else 'no'} |")
        lines.append("")
    tuned = record.get("finetune")
    if tuned:
        lines += [
            "## Distilled",
            "",
            f"{tuned['epochs']} epoch(s), {tuned['steps']} steps: accuracy on {tuned['original']['data']} "
            f"({tuned['original']['images']} images) {tuned['before']['accuracy']:.4f} before, "
            f"**{tuned['after']['accuracy']:.4f}** after; the original {tuned['original']['accuracy']:.4f} "
            f"(drop {tuned['drop_pt']:.2f} pt).",
            "",
        ]
    lines += ["## Rounds", "", "| round | move | method | predicted ms | KL | agreement | above floor | why |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["rounds"]:
        lines.append(f"| {r['round']} | {r['label']} | {r['method']} | {r['predicted_ms']:.4g} | {r['kl']:.4g} | "
                     f"{r['agreement']:.4f} | {_margin(r)} | {r['why']} |")
    lines += ["", "## Pareto front of the measured plans", "",
              "| plan | predicted ms | speedup | KL | agreement | above floor |", "|---|---|---|---|---|---|"]
    for p in result["front"]:
        lines.append(f"| `{p['plan'] or '(original)'}` | {p['predicted_ms']:.4g} | {_speed(base, p['predicted_ms'])} | "
                     f"{p['kl']:.4g} | {p['agreement']:.4f} | {_margin(p)} |")
    lines += ["", f"Hardware: {record['hardware'].get('cpu', '')}; versions: "
              + ", ".join(f"{k} {v}" for k, v in sorted(record["versions"].items())), ""]
    return "\n".join(lines)


def _margin(point: dict) -> str:
    """How far ``point``'s agreement is above the fidelity floor ('-' in a record from before the floor)."""
    margin = point.get("floor_margin")
    return "-" if margin is None else f"{margin:+.4f}"


def _margin_text(chosen: dict, result: dict) -> str:
    if chosen.get("floor_margin") is None:
        return ""
    return (f", {chosen['floor_margin']:+.4f} above the fidelity floor ({result['min_agreement']:g} agreement, "
            "`--min-agreement`)")


def _batch_text(record: dict) -> str:
    batches = [str(b["batch"]) for b in record.get("batches") or []]
    return f"batches {', '.join(batches)}" if len(batches) > 1 else f"batch {record['target']['batch']}"


def _batches(record: dict) -> list[str]:
    """Several batches: each one's weight, table, and the chosen plan's predicted speed-up there."""
    batches = record.get("batches") or []
    if len(batches) < 2:
        return []
    result = record["result"]
    chosen, original = result["chosen"].get("batch_ms", {}), result["original"].get("batch_ms", {})
    lines = ["## Batches", "", "The cost of a plan is the weighted sum of its latency ratios to the original's at "
             "each batch (shown in ms: the original's weighted mean latency times that share).", "",
             "| batch | weight | table | original ms | chosen ms | chosen speed-up |", "|---|---|---|---|---|---|"]
    for b in batches:
        key = str(b["batch"])
        lines.append(f"| {key} | {b['weight']:.3g} | `{b['table']}` | {original.get(key, 0):.4g} | "
                     f"{chosen.get(key, 0):.4g} | {_speed(original.get(key, 0), chosen.get(key, 0))} |")
    return lines + [""]


def _shape_rules(shapes: dict) -> list[str]:
    """What TensorRT's fast-shape rules removed (edge.latency.tensorrt_shapes)."""
    if not shapes:
        return []
    lines = ["## TensorRT's fast shapes", "",
             f"Candidates keep the shapes TensorRT runs fastest in {shapes['precision']} engines; "
             f"{shapes['removed']} candidate plans were removed before scoring.", ""]
    if shapes["rules"]:
        lines += ["| rule | plans removed | example (value, what) |", "|---|---|---|"]
        for rule, row in sorted(shapes["rules"].items()):
            first = row["examples"][0]
            lines.append(f"| {rule} | {row['removed']} | `{first['plan']}`: {first['what']} |")
        lines.append("")
    if shapes["carried_on"]:
        lines += ["Moves carried on past a removed plan: " + ", ".join(
            f"`{k}` -> `{v}`" for k, v in sorted(shapes["carried_on"].items())) + ".", ""]
    if shapes["original_breaks"]:
        lines += ["The original already breaks (not held against any plan): " + "; ".join(
            v["what"] for v in shapes["original_breaks"]) + ".", ""]
    return lines


def plot(record: dict, out: Path) -> None:
    """KL against latency: every measured plan, the front, the chosen plan, the timed plans as measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = record["result"]
    floor = 1e-6   # KL is 0 for the original: shown at the floor of the log axis
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    points = result["points"]
    ax.scatter([p["predicted_ms"] for p in points], [max(p["kl"], floor) for p in points], s=8, c="0.75",
               label=f"measured plans ({len(points)}), predicted latency")
    front = result["front"]
    ax.plot([p["predicted_ms"] for p in front], [max(p["kl"], floor) for p in front], "-o", c="tab:blue", ms=3,
            label="Pareto front")
    timed = record.get("timed")
    if timed:
        ax.scatter([r["measured_ms"] for r in timed["plans"]], [max(r["kl"], floor) for r in timed["plans"]],
                   marker="s", facecolors="none", edgecolors="tab:green", label="timed whole (measured latency)")
        ax.axvline(timed["original_ms"], c="tab:green", ls=":", lw=1, label="original, measured")
    chosen = result["chosen"]
    ax.scatter([chosen["predicted_ms"]], [max(chosen["kl"], floor)], marker="*", s=160, c="tab:red", zorder=5,
               label="chosen")
    ax.axvline(record["budget_ms"], c="tab:red", ls="--", lw=1, label="budget")
    ax.set_yscale("log")
    batches = [str(b["batch"]) for b in record.get("batches") or []]
    ax.set_xlabel(f"latency, ms ({record['target']['backend']}, batch {record['target']['batch']})" if len(batches) < 2
                  else f"cost, ms ({record['target']['backend']}, weighted mix of batches {', '.join(batches)})")
    ax.set_ylabel("KL to the original (held-out)")
    ax.set_title(f"edge plan: {record['model'].get('model')}")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
