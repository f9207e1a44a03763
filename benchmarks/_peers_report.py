"""The result of plan_peers as rows: per model its speedups and accuracies, the summary lines and the verdicts."""

from __future__ import annotations

from _peers_names import budget_text, longest, ordered
from _peers_timing import relative_speed


def budgets_of(record: dict) -> dict[str, dict]:
    """``{budget: {key: distillation}}`` (records written before several budgets held one: its epochs)."""
    distilled = record["distilled"]
    if distilled and all("before" in v for v in distilled.values()):
        s = record["settings"]
        return {f"{s['steps']} steps" if s.get("steps") else str(s["epochs"]): distilled}
    return distilled


def rows_of(record: dict) -> list[dict]:
    """One row per model and matched speed, with its final speedups and its test accuracy before distillation and
    after each budget (of the rate chosen on validation, where one was), and that choice (the tables and the
    plot)."""
    base = record["original"]["accuracy"]["accuracy"]
    final = record["final_timing"]
    budgets = budgets_of(record)
    batches = list(final)
    rows = []
    for g, group in enumerate(record["groups"]):
        edge = group["edge"]
        entries = [("edge", edge["key"], edge["label"], None)] + \
                  [(f, p["key"], p["label"], p) for f, p in group["peers"].items()]
        for family, key, label, peer in entries:
            after = {b: d[key]["after"]["accuracy"] if key in d else None for b, d in budgets.items()}  # None: not run
            rows.append({"group": g, "family": family, "key": key, "label": label,
                         "speedup": {b: final[b]["variants"][key]["speedup"] for b in batches},
                         "interval": {b: [final[b]["variants"][key]["low"], final[b]["variants"][key]["high"]]
                                      for b in batches},
                         "vs_edge": relative_speed(final, key, edge["key"]),
                         "match_error": None if peer is None else peer["error"],
                         "reachable": True if peer is None else peer["reachable"],
                         "before": next(d[key] for d in budgets.values() if key in d)["before"]["accuracy"],
                         "after": after, "drop": {b: None if a is None else base - a for b, a in after.items()},
                         "earlier": {b: bool(d.get(key, {}).get("from")) for b, d in budgets.items()},
                         "selection": {b: d[key].get("selection") if key in d else None for b, d in budgets.items()},
                         "lr": {b: (d[key].get("recipe") or {}).get("lr") if key in d else None
                                for b, d in budgets.items()},
                         "widths": None if peer is None else peer["check"]["record"].get("widths")})
    return rows


SPEED_SLACK = 0.03   # a peer this much slower than the edge model (or within the A/A deviation) counts as matched


def speed_slack(record: dict) -> float:
    """How much slower than the edge model a peer may run and still count as at its speed."""
    return max([SPEED_SLACK] + [t["aa_control"]["deviation"] for t in record["final_timing"].values()])


def verdict(rows: list[dict], slack: float = SPEED_SLACK, budget: str | None = None) -> str:
    """Plain sentences: who keeps the most accuracy after ``budget`` (default: the longest) at this speed (peers
    at least as fast as the edge model, within ``slack``), by how much edge wins or loses, and any slower peer
    that keeps more."""
    edge = next(r for r in rows if r["family"] == "edge")
    budget = budget or longest(edge["after"])
    after = lambda r: r["after"][budget]  # noqa: E731
    when = f" ({budget_text(budget)})" if len(edge["after"]) > 1 else ""
    if after(edge) is None:
        return f"Not distilled at this speed{when}: the edge model's run was not made."
    peers = [r for r in rows if r["family"] != "edge" and after(r) is not None]
    fast = [r for r in peers if r["vs_edge"] >= 1.0 - slack]
    slower = sorted((r for r in peers if r["vs_edge"] < 1.0 - slack and after(r) > after(edge)),
                    key=lambda r: -after(r))
    note = "".join(f" {r['label']} keeps {100 * after(r):.2f} % but runs at {r['vs_edge']:.2f} of the edge "
                   "model's speed (not matched)." for r in slower)
    if not fast:
        return f"No peer reached the edge model's speed (within {100 * slack:.0f} %).{note}"
    best = max(fast, key=after)
    gap = 100 * (after(edge) - after(best))
    if gap > 0:
        text = (f"Edge wins at this speed{when}: {edge['label']} keeps {100 * after(edge):.2f} %, {gap:.2f} pt more "
                f"than the best peer as fast ({best['label']}, {100 * after(best):.2f} %).")
    elif gap == 0:
        text = f"A tie at this speed{when}: {edge['label']} and {best['label']} both keep {100 * after(edge):.2f} %."
    else:
        text = (f"Edge loses at this speed{when}: {best['label']} keeps {100 * after(best):.2f} %, "
                f"{-gap:.2f} pt more than {edge['label']} ({100 * after(edge):.2f} %).")
    return text + note



def summary(rows: list[dict], batches: list[str], slack: float) -> list[str]:
    """One line per matched speed and budget: edge's accuracy against the best peer of each family as fast
    (within ``slack``)."""
    families = [f for f in dict.fromkeys(row["family"] for row in rows) if f != "edge"]
    budgets = ordered(rows[0]["after"])
    lines = ["", "## Summary", "",
             f"Per matched speed, the best model of each family at least as fast as edge's (within {100 * slack:.0f} "
             "%, final run), or where none was its fastest, with its speed relative to edge's (slower: not a match). "
             "Accuracy after distillation; the difference is edge's minus the peer's.", "",
             "| edge speedup " + " / ".join(f"b{b}" for b in batches) + " | distillation | edge | "
             + " | ".join(families) + " |",
             "|---|---|---|" + "---|" * len(families)]
    for g in sorted({row["group"] for row in rows}):
        mine = [row for row in rows if row["group"] == g]
        edge = next(row for row in mine if row["family"] == "edge")
        speeds = " / ".join(f"{edge['speedup'][b]:.2f}x" for b in batches)
        for budget in budgets:
            if edge["after"][budget] is None:
                lines.append(f"| {speeds} | "
                             f"{budget_text(budget)} | not run |" + " not run |" * len(families))
                continue
            cells = []
            for family in families:
                theirs = [row for row in mine if row["family"] == family and row["after"][budget] is not None]
                if not theirs:
                    cells.append("not run")
                    continue
                fast = [row for row in theirs if row["vs_edge"] >= 1.0 - slack]
                best = max(fast, key=lambda row: row["after"][budget]) if fast else \
                    max(theirs, key=lambda row: row["vs_edge"])
                slower = "" if fast else f" at {best['vs_edge']:.3f} of edge's speed"
                cells.append(f"{100 * best['after'][budget]:.2f} %{slower} "
                             f"({100 * (edge['after'][budget] - best['after'][budget]):+.2f} pt)")
            lines.append(f"| {speeds} | {budget_text(budget)} | {100 * edge['after'][budget]:.2f} % | "
                         + " | ".join(cells) + " |")
    return lines

