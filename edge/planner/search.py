"""The search behind ``edge plan``: the plan across every method that keeps the most fidelity within a latency budget.

Greedy with re-evaluation, measured, never added up:

1. Every registered method that offers a :class:`~edge.compress.moves.SearchSpace` takes part;
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

A floor under fidelity (``min_agreement``, default :data:`~edge.planner.plans.MIN_AGREEMENT`): a plan whose held-out top-1
agreement with the original falls below it is destroyed, not compressed. The walk takes no move whose
plan falls below the floor (it takes the cheapest move that keeps it), and a budget that only such plans
meet is refused, naming the fastest plan the walk reaches above the floor: a budget at or above that
plan's prediction is met. Every point records its margin, ``floor_margin`` = agreement - floor.

Several batches (:class:`~edge.planner.objective.LatencyMix`): a plan's latency is predicted at each
batch from that batch's table and its cost is the weighted sum of its ratios to the original's.

Shapes TensorRT runs fast (``shape_rules``; on by default for a TensorRT or Orin-estimate target, off
for ONNX Runtime): a candidate whose parts break a rule of :mod:`edge.latency.tensorrt_shapes` (a
head size fused attention does not take, a GEMM width not a multiple of 16) with a value the original
does not already break it with is *removed*, before it is scored; the record counts the removed
plans per rule, with examples. A move whose result is removed is carried on by the first move of the
same method on the same blocks (in the method's order) whose result keeps the rules: a head narrowed
from 64 to 48, which int8 fused attention does not take, goes on to 32 in the same round.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from edge.compress import CompressConfig
from edge.compress.method import BuildCache
from edge.compress.moves import Move, SearchSpace
from edge.compress.registry import methods
from edge.errors import EdgeError
from edge.latency import LatencyTable
from edge.planner.objective import LatencyMix, check_budget
from edge.planner.plans import Planner, Point, SearchConfig, pareto_front

CHAIN_DEPTH = 4   # moves a removed move may be carried on by

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
    shapes: dict = field(default_factory=dict)    # what the shape rules removed (Planner.shapes_record)
    # what built the plans, to build the chosen one and the front again without fitting anything twice
    cache: BuildCache | None = field(default=None, repr=False)
    compress_config: CompressConfig | None = field(default=None, repr=False)
    calibration_set: object = field(default=None, repr=False)
    min_agreement: float = 0.0    # the floor every point's floor_margin is measured from (SearchConfig)

    def to_json(self) -> dict:
        return {"chosen": self.chosen.to_json(), "original": self.original.to_json(), "budget_ms": self.budget_ms,
                "min_agreement": self.min_agreement,
                "rounds": self.rounds, "front": [p.to_json() for p in self.front],
                "points": [p.to_json() for p in self.points], "refused": self.refused, "seconds": self.seconds,
                "holdout": self.holdout, "calibration": self.calibration, "builds": self.builds,
                "methods": self.spaces, "shape_rules": self.shapes}


def _plan_text(spaces: list[SearchSpace], states: dict[str, object]) -> str:
    return ",".join(t for t in (space.steps(states[space.method]) for space in spaces) if t)


def _cost(now: Point, after: Point) -> float:
    saved = now.predicted_ms - after.predicted_ms
    return (after.kl - now.kl) / saved if saved > 0 else math.inf


class Search:
    """The greedy walk of one model (module docstring); :meth:`run_to` walks on to a budget, again and again
    (``edge plan`` tightens the budget when the chosen plan, timed whole, misses it)."""

    def __init__(self, model: nn.Module, source: dict, config: SearchConfig, table: LatencyTable | LatencyMix,
                 progress: Callable[[str], None] | None = None, spaces: list[SearchSpace] | None = None) -> None:
        """``spaces``: the methods' search spaces to walk (default: every registered method's)."""
        self.start = time.perf_counter()
        self.config = config
        self.say = progress or (lambda message: None)
        self.planner = Planner(model, source, config, table)
        self.mix = self.planner.mix
        if self.planner.rules:
            self.say(f"candidates keep TensorRT's fast shapes for {self.planner.rules} engines "
                     "(fused attention head sizes, GEMM widths multiples of 16)")
        self.spaces = spaces if spaces is not None else [
            s for s in (m.search_space(self.planner.info) for m in methods()) if s is not None]
        self.states: dict[str, object] = {s.method: s.initial() for s in self.spaces}
        original = self.planner.measure("")
        assert original is not None
        self.original = self.now = original
        self.last_cost: dict[str, float] = {}
        self.carried: dict[str, str] = {}   # a removed move's key -> the move that carried it on
        self.rounds: list[dict] = []
        self.min_step_ms = config.min_step * self.original.predicted_ms   # 0 once no move saves that much
        fastest_text = f"linear:-1-{self.planner.info.num_blocks - 1}"   # every block one map: a floor
        self.fastest = self.planner.measure(fastest_text)

    def budget_ms(self) -> float:
        c = self.config
        check_budget(c.budget_ms, self.mix.batches)
        return c.budget_ms if c.budget_ms is not None else c.budget * self.original.predicted_ms

    def _share(self, ms: float) -> str:
        return f"{ms / self.original.predicted_ms:.3f}x"

    def run_to(self, budget_ms: float) -> Point:
        """Walk on from the plan so far until its prediction is within ``budget_ms``; the plan reached."""
        original, fastest = self.original, self.fastest
        self.say(f"budget {budget_ms:.4g} ms ({self._share(budget_ms)} of the original's predicted "
                 f"{original.predicted_ms:.4g} ms on {self.mix.describe()})")
        if fastest is not None and fastest.predicted_ms > budget_ms and fastest.above_floor:
            floor = fastest.predicted_ms
            raise EdgeError(f"no plan reaches {budget_ms:.4g} ms ({self._share(budget_ms)})",
                            expected=f"a budget above {floor:.4g} ms ({self._share(floor)}), the prediction of the "
                                     f"fastest plan there is ({fastest.plan}: every block replaced by one map)",
                            fix="raise the budget")
        while self.now.predicted_ms > budget_ms:
            if not self._round():
                break
        if self.now.predicted_ms > budget_ms:
            refusal = self._below_floor(budget_ms)
            if refusal is not None:
                raise refusal
            best = min(self.planner.points.values(), key=lambda p: (p.predicted_ms, p.kl))
            raise EdgeError(f"no plan found reaches {budget_ms:.4g} ms ({self._share(budget_ms)})",
                            expected=f"a budget above {best.predicted_ms:.4g} ms, the fastest plan found "
                                     f"({best.plan}, {self._share(best.predicted_ms)})", fix="raise the budget")
        return self.now

    def _below_floor(self, budget_ms: float) -> EdgeError | None:
        """The refusal of a budget that only plans below the agreement floor meet (or no plan at all, the fastest
        there is below the floor), naming the fastest plan the walk reached above it; None when the floor is not
        why the walk missed the budget."""
        floor, now, fastest = self.config.min_agreement, self.now, self.fastest
        meeting = [p for p in self.planner.points.values() if p.predicted_ms <= budget_ms]
        if meeting and all(p.above_floor for p in meeting):
            return None
        if not meeting and (fastest is None or fastest.above_floor):
            return None
        holdout, classes = len(self.planner.holdout), self.planner.reference.logits.shape[-1]
        below = f"below the floor of {floor:g} (chance: {1 / classes:.2g})"
        if meeting:
            best = max(meeting, key=lambda p: (p.agreement, -p.predicted_ms))
            what = (f"budget {budget_ms:.4g} ms ({self._share(budget_ms)}) is met only by plans below the agreement "
                    f"floor: the most faithful of them, {best.plan} ({self._speedup(best)} predicted), agrees with "
                    f"the original on {best.agreement:.4f} of {holdout} held-out images, {below}")
        else:
            assert fastest is not None
            what = (f"no plan reaches {budget_ms:.4g} ms ({self._share(budget_ms)}): the fastest there is, "
                    f"{fastest.plan}, is predicted at {fastest.predicted_ms:.4g} ms ({self._speedup(fastest)}) and "
                    f"agrees with the original on {fastest.agreement:.4f} of {holdout} held-out images, {below}")
        # the budget that gets it, rounded up (the walk is deterministic: it stops there or before)
        share = math.ceil(1000 * now.predicted_ms / self.original.predicted_ms) / 1000
        ms = f"{math.ceil(1e4 * now.predicted_ms) / 1e4:.4f}".rstrip("0").rstrip(".")
        option = f"--budget {share:g}x" if self.config.budget is not None else f"--budget-ms {ms}"
        return EdgeError(what, expected=f"a budget of at least {now.predicted_ms:.4g} ms "
                         f"({self._share(now.predicted_ms)}, {option}): the fastest plan the search reaches above the "
                         f"floor is {now.plan or '(the original)'} ({self._speedup(now)} predicted, agreement "
                         f"{now.agreement:.4f}, {now.floor_margin:+.4f} above the floor)",
                         fix=f"raise the budget to {option}, or lower the floor with --min-agreement F (0: none; "
                             "a plan below it is destroyed, not compressed)")

    def _speedup(self, point: Point) -> str:
        return f"{self.original.predicted_ms / point.predicted_ms:.2f}x"

    def _round(self) -> bool:
        """One round: measure moves, take the cheapest; False when no move saves anything."""
        config, spaces, states, last_cost = self.config, self.spaces, self.states, self.last_cost
        index, now = len(self.rounds), self.now
        moves = [(space, move) for space in spaces for move in space.moves(states[space.method])]
        everything = index == 0 or bool(config.refresh and index % config.refresh == 0)
        rows: list = []

        def measure(space: SearchSpace, asked: Move) -> None:
            move, after = self._carry_on(space, asked)
            cost = _cost(now, after) if after is not None else math.inf
            small = after is not None and now.predicted_ms - after.predicted_ms < self.min_step_ms
            # re-measured when the minimum step is dropped; a plan below the floor, only when every move is
            last_cost[asked.key] = math.inf if small or (after is not None and not after.above_floor) else cost
            if after is not None:
                rows.append((math.inf if small else cost, move.key, space, move, after))

        if everything:
            for space, move in moves:
                measure(space, move)
        else:   # lazily: in the order of the last measured cost, until the best fresh cost beats every stale one
            for space, move in [m for m in moves if m[1].key not in last_cost]:
                measure(space, move)
            stale = sorted((m for m in moves if m[1].key in last_cost and last_cost[m[1].key] < math.inf),
                           key=lambda m: (last_cost[m[1].key], m[1].key))
            for done, (space, move) in enumerate(stale):
                fresh = [r[0] for r in rows if r[4].above_floor]
                if done >= config.shortlist or (fresh and min(fresh) <= last_cost[move.key]):
                    break
                measure(space, move)
        usable = [r for r in rows if r[0] < math.inf and r[4].above_floor]
        if not usable and not everything:   # every stale move saved nothing: measure them all before giving up
            for space, move in moves:
                measure(space, move)
            usable = [r for r in rows if r[0] < math.inf and r[4].above_floor]
        if not usable and self.min_step_ms > 0:   # no move saves the minimum step any more: any saving will do
            self.say(f"no move saves {self.config.min_step:.3g}x of the original any more: smaller steps from here")
            self.min_step_ms = 0.0
            last_cost.clear()
            return self._round()
        if not usable:
            return False
        cost, key, space, move, after = min(usable, key=lambda r: (r[0], r[1]))
        self.states = self._after(space, move)
        self.rounds.append(_round_record(index, len(rows), rows, move, space, now, after, cost))
        self.say(f"round {index + 1}: {move.label} ({space.method}) -> {after.predicted_ms:.4g} ms predicted, "
                 f"KL {after.kl:.4g}, agreement {after.agreement:.4f} ({len(rows)} moves measured)")
        self.now = after
        return True

    def _carry_on(self, space: SearchSpace, move: Move) -> tuple[Move, Point | None]:
        """``move`` and its point; where the shape rules removed its plan, carried on by the first move of the same
        method on the same blocks (the method's order) whose plan keeps them, as one move (at most CHAIN_DEPTH)."""
        planner = self.planner
        chained, step = move, move
        after = planner.measure(self._text(space, move))
        for _ in range(CHAIN_DEPTH):
            if after is not None or self._text(space, chained) not in planner.removed:
                break
            further = None   # the first onward plan removed too: where to carry on from if none keeps the rules
            for onward in (m for m in space.moves(step.state) if m.blocks == move.blocks):
                candidate = Move(f"{chained.key}>{onward.key}", f"{chained.label}, on to {onward.label}",
                                 onward.state, move.blocks)
                point = planner.measure(self._text(space, candidate))
                if point is not None:
                    chained, step, after = candidate, onward, point
                    break
                if further is None and self._text(space, candidate) in planner.removed:
                    further = (candidate, onward)
            if after is None:
                if further is None:
                    break
                chained, step = further
        if after is not None and chained is not move:
            self.carried[move.key] = chained.key
        return chained, after

    def _text(self, space: SearchSpace, move: Move) -> str:
        return _plan_text(self.spaces, self._after(space, move))

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
            builds=planner.cache.builds, spaces=[s.method for s in self.spaces],
            shapes=planner.shapes_record(self.carried) if planner.rules else {}, cache=planner.cache,
            compress_config=planner.compress_config, calibration_set=planner.calibration,
            min_agreement=self.config.min_agreement)


def search(model: nn.Module, source: dict, config: SearchConfig, table: LatencyTable | LatencyMix,
           progress: Callable[[str], None] | None = None, spaces: list[SearchSpace] | None = None) -> SearchResult:
    """The plan of ``model`` within the budget that keeps the most fidelity (module docstring)."""
    config.check()
    walk = Search(model, source, config, table, progress, spaces)
    budget_ms = walk.budget_ms()
    walk.run_to(budget_ms)
    return walk.result(budget_ms)


def _round_record(index: int, measured: int, rows: list, move: Move, space: SearchSpace, now: Point, after: Point,
                  cost: float) -> dict:
    ranked = sorted(rows, key=lambda r: (r[0], r[1]))
    kept = [r for r in ranked if r[4].above_floor]
    below = sum(not r[4].above_floor for r in rows)
    return {"round": index + 1, "measured": measured, "method": space.method, "move": move.key, "label": move.label,
            "plan": after.plan, "kl": after.kl, "agreement": after.agreement, "floor_margin": after.floor_margin,
            "predicted_ms": after.predicted_ms, "cost_kl_per_ms": cost,
            "saved_ms": now.predicted_ms - after.predicted_ms,
            "why": f"least KL lost per ms saved of {len(rows)} measured moves"
                   + (f" ({below} below the agreement floor left out)" if below else "")
                   + (f"; next best {kept[1][1]} ({kept[1][0]:.4g} KL/ms)" if len(kept) > 1 else ""),
            "candidates": [{"move": r[1], "cost_kl_per_ms": r[0] if r[0] < math.inf else None, "kl": r[4].kl,
                            "agreement": r[4].agreement, "floor_margin": r[4].floor_margin,
                            "predicted_ms": r[4].predicted_ms} for r in ranked]}
