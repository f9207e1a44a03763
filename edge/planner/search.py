"""The search behind ``edge plan``: the plan across every method that keeps the most fidelity within a latency budget.

Greedy with re-evaluation, measured, never added up:

1. Every registered method that offers a :class:`~edge.compress.search.SearchSpace` takes part;
   the planner holds one state per method (the blocks it touches, the widths it keeps) and knows
   nothing else of any method. A candidate plan is the methods' steps joined; the methods' own
   ``validate`` refuses a conflicting one (a width cut of a block a span removed), which the
   record lists as refused.
2. A candidate is *measured*, not estimated: the original model is compressed by the whole plan
   (every step fitted on the calibration images, through a :class:`~edge.compress.method.BuildCache`
   so a step is fitted once for all the plans that hold it) and scored on held-out training images
   against the original: KL divergence of the class probabilities (the objective), top-1
   agreement, relative error of the pooled features. Its latency is predicted from a latency table
   measured on the target (:mod:`edge.latency`).
3. Each round takes the move with the least fidelity lost per millisecond saved,
   ``(KL after - KL now) / (ms now - ms after)``, until the prediction is within the budget. Steps
   interact (a second removed block costs more than its own), so a move is only ever taken on a
   measurement *beside the plan so far*. The first round measures every move; later rounds are lazy
   (CELF, Leskovec et al. 2007): moves are re-measured in the order of their last measured cost
   until the best fresh cost is no higher than the next stale one (a move's cost tends to grow as
   the plan grows, so a stale cost is a bound), at most ``shortlist`` of them, plus any move not
   measured yet; ``refresh`` > 0 measures every move again every that many rounds. Ties go to the
   move whose key sorts first, so the same inputs give the same plan.

Every measured plan is a point (KL, agreement, predicted ms); the Pareto front of those points
(no other point both faster and more faithful) is reported with the choice.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from edge.compress import CompressConfig
from edge.compress.compressor import apply_plan
from edge.compress.fidelity import Reference, fidelity, outputs
from edge.compress.method import BuildCache
from edge.compress.plan import parse_plan
from edge.compress.registry import methods
from edge.compress.search import Move, SearchSpace
from edge.config import MAX_BATCH, MAX_SAMPLES, MAX_SEED, option
from edge.data import calibration_set, holdout_set
from edge.errors import EdgeError
from edge.export import real_inputs
from edge.latency import LatencyTable, predict_model
from edge.models.info import model_info
from edge.models.zoo import data_config


@dataclass(frozen=True)
class SearchConfig:
    budget: float | None = option(None, above=0.0, maximum=1.0)   # share of the original's predicted latency
    budget_ms: float | None = option(None, above=0.0, maximum=1e9)  # or an absolute budget (ms)
    data: str = "fmnist"
    samples: int = option(512, minimum=10, maximum=MAX_SAMPLES)   # calibration images every step is fitted on
    holdout: int = option(512, minimum=10, maximum=MAX_SAMPLES)   # held-out training images plans are scored on
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    batch_size: int = option(64, minimum=1, maximum=MAX_BATCH)
    refresh: int = option(0, minimum=0, maximum=1000)     # every N rounds every move is measured again (0: never)
    shortlist: int = option(4, minimum=1, maximum=10000)  # at most this many moves re-measured in a lazy round

    def check(self) -> None:
        if (self.budget is None) == (self.budget_ms is None):
            raise EdgeError("give one latency budget", expected="--budget 0.5x (a share of the original's latency) "
                            "or --budget-ms X (milliseconds on the table's target)")
        if self.budget is not None and not 0.0 < self.budget <= 1.0:
            raise EdgeError(f"budget {self.budget:g}x is not a speed-up", expected="0 < budget <= 1.0x of the "
                            "original's latency (0.5x: twice as fast)",
                            fix="a budget above 1.0x asks for a slower model: no plan is needed")
        if self.budget_ms is not None and not 0.0 < self.budget_ms < math.inf:
            raise EdgeError(f"budget {self.budget_ms:g} ms", expected="a positive number of milliseconds")


@dataclass(frozen=True)
class Point:
    plan: str
    kl: float
    agreement: float
    feature_rel_error: float
    predicted_ms: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class SearchResult:
    chosen: Point
    original: Point
    budget_ms: float
    points: list[Point]
    front: list[Point]
    rounds: list[dict]
    refused: dict[str, str]
    seconds: float
    holdout: dict
    calibration: dict
    builds: int
    spaces: list[str] = field(default_factory=list)
    # what built the plans, to build the chosen one and the front again without fitting anything twice
    cache: BuildCache | None = field(default=None, repr=False)
    compress_config: CompressConfig | None = field(default=None, repr=False)
    calibration_set: object = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"chosen": self.chosen.to_json(), "original": self.original.to_json(), "budget_ms": self.budget_ms,
                "rounds": self.rounds, "front": [p.to_json() for p in self.front],
                "points": [p.to_json() for p in self.points], "refused": self.refused, "seconds": self.seconds,
                "holdout": self.holdout, "calibration": self.calibration, "builds": self.builds,
                "methods": self.spaces}


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other point beats on both predicted latency and KL, fastest first."""
    ordered = sorted(points, key=lambda p: (p.predicted_ms, p.kl, p.plan))
    front: list[Point] = []
    for point in ordered:
        if not front or point.kl < front[-1].kl:
            front.append(point)
    return front


class Planner:
    """Measures plans of one model: compress a copy, score it against the original, predict its latency."""

    def __init__(self, model: nn.Module, source: dict, config: SearchConfig, table: LatencyTable) -> None:
        self.model, self.source, self.config, self.table = model, source, config, table
        self.info = model_info(model)
        self.compress_config = CompressConfig(plan="", data=config.data, samples=config.samples, seed=config.seed,
                                              batch_size=config.batch_size)
        self.calibration = calibration_set(config.data, config.samples, config.seed)
        self.holdout = holdout_set(config.data, config.holdout, config.seed, calibration=config.samples)
        inputs = real_inputs(self.holdout, data_config(model), len(self.holdout))
        model.eval()
        logits, features = outputs(model, inputs, config.batch_size)
        if logits is None:
            raise EdgeError(f"{source.get('model')} has no classifier head", expected="a classifier: plans are scored "
                            "by the KL divergence of its class probabilities from the original's")
        self.reference = Reference(logits, features, inputs)
        self.cache = BuildCache()
        self.points: dict[str, Point] = {}
        self.refused: dict[str, str] = {}

    def measure(self, text: str) -> Point | None:
        """The point of plan ``text`` ('' for the original), or None when the methods refuse the plan."""
        if text in self.points:
            return self.points[text]
        if text in self.refused:
            return None
        candidate = self.model
        if text:
            try:   # the methods refuse what conflicts (validate) or what they cannot build (a width below one unit)
                plan = parse_plan(text).validate(self.info.num_blocks)
                candidate = copy.deepcopy(self.model)
                with torch.no_grad():
                    apply_plan(candidate, plan, self.compress_config, self.calibration, cache=self.cache)
            except EdgeError as e:
                self.refused[text] = " ".join(str(e).split())
                return None
        candidate.eval()
        score = fidelity(candidate, self.reference)
        point = Point(text, score["kl"], score["agreement"], score["feature_rel_error"],
                      predict_model(candidate, self.table).total_ms)
        self.points[text] = point
        return point


def _plan_text(spaces: list[SearchSpace], states: dict[str, object]) -> str:
    return ",".join(t for t in (space.steps(states[space.method]) for space in spaces) if t)


def _cost(now: Point, after: Point) -> float:
    saved = now.predicted_ms - after.predicted_ms
    return (after.kl - now.kl) / saved if saved > 0 else math.inf


class Search:
    """The greedy walk of one model (module docstring); :meth:`run_to` walks on to a budget, again and again
    (``edge plan`` tightens the budget when the chosen plan, timed whole, misses it)."""

    def __init__(self, model: nn.Module, source: dict, config: SearchConfig, table: LatencyTable,
                 progress: Callable[[str], None] | None = None) -> None:
        self.start = time.perf_counter()
        self.config, self.table = config, table
        self.say = progress or (lambda message: None)
        self.planner = Planner(model, source, config, table)
        self.spaces = [s for s in (m.search_space(self.planner.info) for m in methods()) if s is not None]
        self.states: dict[str, object] = {s.method: s.initial() for s in self.spaces}
        original = self.planner.measure("")
        assert original is not None
        self.original = self.now = original
        self.last_cost: dict[str, float] = {}
        self.rounds: list[dict] = []
        fastest_text = f"linear:-1-{self.planner.info.num_blocks - 1}"   # every block one map: a floor
        self.fastest = self.planner.measure(fastest_text)

    def budget_ms(self) -> float:
        c = self.config
        return c.budget_ms if c.budget_ms is not None else c.budget * self.original.predicted_ms

    def _share(self, ms: float) -> str:
        return f"{ms / self.original.predicted_ms:.3f}x"

    def run_to(self, budget_ms: float) -> Point:
        """Walk on from the plan so far until its prediction is within ``budget_ms``; the plan reached."""
        original, fastest = self.original, self.fastest
        self.say(f"budget {budget_ms:.4g} ms ({self._share(budget_ms)} of the original's predicted "
                 f"{original.predicted_ms:.4g} ms on {self.table.target.describe()})")
        if fastest is not None and fastest.predicted_ms > budget_ms:
            floor = fastest.predicted_ms
            raise EdgeError(f"no plan reaches {budget_ms:.4g} ms ({self._share(budget_ms)})",
                            expected=f"a budget above {floor:.4g} ms ({self._share(floor)}), the prediction of the "
                                     f"fastest plan there is ({fastest.plan}: every block replaced by one map)",
                            fix="raise the budget")
        while self.now.predicted_ms > budget_ms:
            if not self._round():
                break
        if self.now.predicted_ms > budget_ms:
            best = min(self.planner.points.values(), key=lambda p: (p.predicted_ms, p.kl))
            raise EdgeError(f"no plan found reaches {budget_ms:.4g} ms ({self._share(budget_ms)})",
                            expected=f"a budget above {best.predicted_ms:.4g} ms, the fastest plan found "
                                     f"({best.plan}, {self._share(best.predicted_ms)})", fix="raise the budget")
        return self.now

    def _round(self) -> bool:
        """One round: measure moves, take the cheapest; False when no move saves anything."""
        config, planner, spaces, states, last_cost = self.config, self.planner, self.spaces, self.states, self.last_cost
        index, now = len(self.rounds), self.now
        moves = [(space, move) for space in spaces for move in space.moves(states[space.method])]
        everything = index == 0 or bool(config.refresh and index % config.refresh == 0)
        rows: list = []

        def measure(space: SearchSpace, move: Move) -> None:
            after = planner.measure(_plan_text(spaces, self._after(space, move)))
            cost = _cost(now, after) if after is not None else math.inf
            last_cost[move.key] = cost
            if after is not None:
                rows.append((cost, move.key, space, move, after))

        if everything:
            for space, move in moves:
                measure(space, move)
        else:   # lazily: in the order of the last measured cost, until the best fresh cost beats every stale one
            for space, move in [m for m in moves if m[1].key not in last_cost]:
                measure(space, move)
            stale = sorted((m for m in moves if m[1].key in last_cost and last_cost[m[1].key] < math.inf),
                           key=lambda m: (last_cost[m[1].key], m[1].key))
            for done, (space, move) in enumerate(stale):
                if done >= config.shortlist or (rows and min(r[0] for r in rows) <= last_cost[move.key]):
                    break
                measure(space, move)
        usable = [r for r in rows if r[0] < math.inf]
        if not usable and not everything:   # every stale move saved nothing: measure them all before giving up
            for space, move in moves:
                measure(space, move)
            usable = [r for r in rows if r[0] < math.inf]
        if not usable:
            return False
        cost, key, space, move, after = min(usable, key=lambda r: (r[0], r[1]))
        self.states = self._after(space, move)
        self.rounds.append(_round_record(index, len(rows), rows, move, space, now, after, cost))
        self.say(f"round {index + 1}: {move.label} ({space.method}) -> {after.predicted_ms:.4g} ms predicted, "
                 f"KL {after.kl:.4g}, agreement {after.agreement:.4f} ({len(rows)} moves measured)")
        self.now = after
        return True

    def _after(self, space: SearchSpace, move: Move) -> dict[str, object]:
        """Every method's state after ``move``: its own moved, the others releasing the blocks it takes."""
        return {s.method: move.state if s is space else (s.release(self.states[s.method], move.blocks)
                                                         if move.blocks else self.states[s.method])
                for s in self.spaces}

    def result(self, budget_ms: float) -> SearchResult:
        planner = self.planner
        points = sorted(planner.points.values(), key=lambda p: (p.predicted_ms, p.plan))
        return SearchResult(
            chosen=self.now, original=self.original, budget_ms=budget_ms, points=points, front=pareto_front(points),
            rounds=list(self.rounds), refused=dict(planner.refused),
            seconds=round(time.perf_counter() - self.start, 1),
            holdout={"data": planner.holdout.name, "samples": len(planner.holdout)},
            calibration={"data": planner.calibration.name, "samples": len(planner.calibration),
                         "seed": self.config.seed},
            builds=planner.cache.builds, spaces=[s.method for s in self.spaces], cache=planner.cache,
            compress_config=planner.compress_config, calibration_set=planner.calibration)


def search(model: nn.Module, source: dict, config: SearchConfig, table: LatencyTable,
           progress: Callable[[str], None] | None = None) -> SearchResult:
    """The plan of ``model`` within the budget that keeps the most fidelity (module docstring)."""
    config.check()
    walk = Search(model, source, config, table, progress)
    budget_ms = walk.budget_ms()
    walk.run_to(budget_ms)
    return walk.result(budget_ms)


def _round_record(index: int, measured: int, rows: list, move: Move, space: SearchSpace, now: Point, after: Point,
                  cost: float) -> dict:
    ranked = sorted(rows, key=lambda r: (r[0], r[1]))
    return {"round": index + 1, "measured": measured, "method": space.method, "move": move.key, "label": move.label,
            "plan": after.plan, "kl": after.kl, "agreement": after.agreement, "predicted_ms": after.predicted_ms,
            "cost_kl_per_ms": cost, "saved_ms": now.predicted_ms - after.predicted_ms,
            "why": f"least KL lost per ms saved of {len(rows)} measured moves"
                   + (f"; next best {ranked[1][1]} ({ranked[1][0]:.4g} KL/ms)" if len(ranked) > 1 else ""),
            "candidates": [{"move": r[1], "cost_kl_per_ms": r[0] if r[0] < math.inf else None, "kl": r[4].kl,
                            "predicted_ms": r[4].predicted_ms} for r in ranked]}
