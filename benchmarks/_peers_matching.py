"""Speed matching: each peer's ratio or merge count searched by measuring its speed against the edge model's."""

from __future__ import annotations

import functools
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _peers_candidates import FAMILIES, tome_rs
from _peers_timing import ORIGINAL, export_graphs, relative_speed, time_models
from _peers_work import Work

from edge.compress.load import load_model
from edge.errors import EdgeError
from edge.progress import log


@dataclass
class Match:
    """The candidate whose measured relative speed (1.0 = the edge model's) is nearest 1, and every point."""

    parameter: float
    relative_speed: float
    reachable: bool                      # some measured candidates were at least as fast as the edge model
    history: dict[float, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.relative_speed - 1.0


def match_speed(measure: Callable[[list[float]], dict[float, float]], grid: list[float], *, refine: int = 0,
                integer: bool = False, tolerance: float = 0.01) -> Match:
    """Search the parameter (ratio, merge count) whose relative speed is nearest 1.0, by measuring.

    ``measure(params)`` times the candidates of ``params`` side by side with the edge model and returns
    each one's relative speed. Speed grows with the parameter: after the scan over ``grid``, ``refine``
    bisection steps measure the midpoint of the bracket whose ends lie on either side of 1.0 (integers:
    the middle integer; none left, the search stops) until one lies within ``tolerance`` of 1.0 (in log
    speed). The nearest point in log speed wins.
    """
    history = dict(measure(sorted(set(grid))))
    for _ in range(refine):
        if min(abs(math.log(s)) for s in history.values()) <= tolerance:
            break
        points = sorted(history)
        bracket = next(((a, b) for a, b in zip(points, points[1:], strict=False)
                        if history[a] <= 1.0 <= history[b]), None)
        if bracket is None:
            break
        mid = (bracket[0] + bracket[1]) // 2 if integer else round((bracket[0] + bracket[1]) / 2, 6)
        if mid in history or not bracket[0] < mid < bracket[1]:
            break
        history.update(measure([mid]))
    best = min(history, key=lambda p: abs(math.log(history[p])))
    return Match(best, history[best], max(history.values()) >= 1.0, dict(sorted(history.items())))


class MatchStage(Work):
    """Stage 1: every edge model's peers matched to its measured speed, each match saved to ``state.json``."""

    def match(self, item: dict, original_graphs: dict[int, Path], tmp: Path) -> dict:
        """The matched peers of one edge model; each family's match is saved to ``state.json`` once found."""
        done = self.state["matches"].setdefault(item["key"], {"peers": {}, "runs": []})
        if "edge" in done:
            log(f"{item['label']}: matches reused from {self.state_path}")
            return done
        edge_graphs, edge_check = export_graphs(load_model(item["path"]), item["key"], tmp, self.timing.batches,
                                                self.args.model, item["plan"])
        checks: dict[str, dict] = {}

        def measure(family: str, params: list[float]) -> dict[float, float]:
            graphs = {ORIGINAL: original_graphs, item["key"]: edge_graphs}
            names = {}
            for p in params:
                cand = self.candidate(family, p)
                model, record = cand.build()
                graphs[cand.key], checks[cand.key] = export_graphs(model, cand.key, tmp, self.timing.batches,
                                                                   self.args.model, None, data=self.args.data,
                                                                   ranks_tokens=family == "tome")
                checks[cand.key]["record"] = record
                names[p] = cand.key
            timed = {str(b): t for b, t in time_models(graphs, self.match_timing).items()}
            done["runs"].append({"family": family, "params": params, "timed": timed})
            speeds = {p: relative_speed(timed, names[p], item["key"]) for p in params}
            log(f"{item['label']} vs {family}: " + ", ".join(f"{p:g} -> {s:.3f}" for p, s in speeds.items()))
            return speeds

        for family in FAMILIES[1:]:
            if family in done["peers"]:
                continue
            if family == "tome":
                grid, refine, integer = tome_rs(load_model(self.args.model)), 0, True
            else:
                grid, refine, integer = self.args.ratios, self.args.refine, False
            found = match_speed(functools.partial(measure, family), grid, refine=refine, integer=integer)
            cand = self.candidate(family, found.parameter)
            done["peers"][family] = {"parameter": found.parameter, "relative_speed": found.relative_speed,
                                     "error": found.error, "reachable": found.reachable,
                                     "history": {str(k): v for k, v in found.history.items()},
                                     "key": cand.key, "label": cand.label, "check": checks[cand.key]}
            log(f"{item['label']}: {cand.label} matches at relative speed {found.relative_speed:.3f}")
            self.save_state()
        # the edge model's speedup over the original: the median over every matching run it was timed in
        speedups = {str(b): float(np.median([run["timed"][str(b)]["variants"][item["key"]]["speedup"]
                                             for run in done["runs"]])) for b in self.timing.batches}
        done["edge"] = {**item, "check": edge_check, "speedup": speedups}
        self.save_state()
        return done

    def reuse_matches(self, items: list[dict], path: str | Path) -> None:
        """Seed ``state.json`` with the matches of an earlier record (``--reuse-matches``) for the same plans.

        A match is an input (which ratio, which r): the final timing re-measures every model side by
        side, so a reused match changes no reported speed, only which peer is compared. Each reused
        group says where it came from."""
        old = json.loads(Path(path).read_text())
        by_plan = {g["edge"]["plan"]: g for g in old.get("groups", [])}
        for item in items:
            group = by_plan.get(item["plan"])
            done = self.state["matches"].get(item["key"])
            if group is None or (done and "edge" in done):
                continue
            speedups = group["edge"]["speedup"]
            self.state["matches"][item["key"]] = {
                "peers": group["peers"], "runs": [], "reused_from": {"file": str(path), "command": old.get("command"),
                                                                     "edge_speedup": speedups},
                "edge": {**item, "check": group["edge"].get("check"), "speedup": speedups}}
            log(f"{item['label']}: matches reused from {path}")
        self.save_state()

    def matched(self, items: list[dict]) -> list[dict]:
        """The matches of every item from ``state.json``, or an EdgeError naming the first one missing."""
        missing = [item["label"] for item in items if "edge" not in self.state["matches"].get(item["key"], {})]
        if missing:
            raise EdgeError(f"no speed match for {missing[0]} in {self.state_path}",
                            expected="the matches of `--stage match` (measured on the CPU that times the models)",
                            fix="run the same command with --stage match first (or --stage all)")
        return [self.state["matches"][item["key"]] for item in items]

    def match_all(self, items: list[dict]) -> None:
        """Every item's peers matched (those already in ``state.json`` kept), the original exported once."""
        original = load_model(self.args.model)
        with tempfile.TemporaryDirectory(prefix="edge-plan-peers-") as tmp:
            original_graphs, _ = export_graphs(original, ORIGINAL, Path(tmp), self.timing.batches,
                                               self.args.model, None)
            for item in items:
                self.match(item, original_graphs, Path(tmp))
