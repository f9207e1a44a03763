"""Latency of several models side by side, and each one's speedup against a reference with an interval.

Models timed one after the other are compared across whatever the machine did in between (other
load, clock and thermal drift): on a shared VM that can make a model with fewer FLOPs look 30 %
slower. Here every model is timed in the same run, interleaved:

- ``sessions`` times, every backend is created afresh, the creation order rotated each time (the
  order ONNX Runtime sessions are created in can move one graph's latency by several per cent),
  and warmed up;
- then ``rounds / sessions`` rounds: each backend makes its timed calls in turn (``iterations``, or about
  ``turn_ms`` worth, counted from its own first warm-up: a slow INT8 graph makes fewer), in a
  fresh seeded random order each round, so drift hits all backends alike. Not rotated: a rotation
  keeps every backend's neighbours, so one backend would always run right after the same other
  one (after its own twin, for the A/A control's reference) and inherit its cache state.

A backend's speedup against the reference is the median over rounds of the per-round ratio of
medians (reference / backend: above 1 is faster), with a seeded percentile-bootstrap interval
(rounds resampled within each session set). An A/A control, the reference created twice and timed
as two backends, measures the comparison's resolution: its speedup should be 1; when it deviates by
more than ``aa_tolerance`` the run is too noisy to tell models that close apart, and
:func:`verdict` says so instead of ranking them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from edge.config import option
from edge.profile.backends import Backend
from edge.profile.contention import BUSY_SHARE, CpuContention
from edge.profile.stats import latency_stats

AA_SUFFIX = " (A/A)"  # the control's name: the reference's name plus this (no variant name has a space)
METHOD = ("median over rounds of the per-round ratio of medians (reference / variant); interval: seeded "
          "percentile bootstrap over rounds, resampled within each session set")


@dataclass(frozen=True)
class SideBySideConfig:
    warmup: int = option(10, minimum=0)        # untimed calls of each backend after each creation
    rounds: int = option(40, minimum=2)        # interleaved rounds, split evenly between the session sets
    sessions: int = option(5, minimum=1)       # session sets, created afresh in rotated order
    iterations: int | None = option(None, minimum=1)  # timed calls per backend and round; None: each its own, ~turn_ms
    turn_ms: float = option(100.0, above=0)    # iterations=None: about this long per backend and round
    aa_tolerance: float = option(0.03, above=0)  # A/A deviation above which the run is too noisy to rank
    confidence: float = option(0.95, above=0, below=1)
    resamples: int = option(2000, minimum=100)
    seed: int = option(0, minimum=0)
    # ONNX Runtime's pool threads spin-wait after each call by default. With several sessions alive, a
    # pool still spinning steals the cores from the session timed next: on 2 cores, five interleaved
    # sessions measured a CV of 43 % with spinning and 14 % without (one session alone: 9-17 %).
    # False: the threads stop spinning when a call returns (they still spin between a call's operators;
    # edge.check.compare.ort_session says why not never)
    spinning: bool = False


def _rotated(names: list[str], shift: int) -> list[str]:
    shift %= len(names)
    return names[shift:] + names[:shift]


def _iterations(config: SideBySideConfig, warmup_ms: list[float]) -> int:
    if config.iterations is not None:
        return config.iterations
    typical = float(np.median(warmup_ms)) if warmup_ms else config.turn_ms
    return max(3, min(200, round(config.turn_ms / max(typical, 1e-3))))


def _counts(config: SideBySideConfig, warm: dict[str, list[float]], twins: dict[str, str]) -> dict[str, int]:
    """Timed calls per round of each backend: ``config.iterations`` for all, or (None) about ``turn_ms`` of each
    one's own warm-up calls (3 to 200): an INT8 graph ten times slower than the reference is not timed ten times
    as long. A backend and its A/A twin (``twins``: twin -> backend) share one count, from both warm-ups."""
    pooled: dict[str, list[float]] = {}
    for name, times in warm.items():
        pooled.setdefault(twins.get(name, name), []).extend(times)
    return {name: _iterations(config, pooled[twins.get(name, name)]) for name in warm}


def interleave(factories: dict[str, Callable[[], Backend]], config: SideBySideConfig,
               sets: range | None = None, counts: dict[str, int] | None = None,
               twins: dict[str, str] | None = None) -> dict:
    """Time the backends side by side (see the module docstring). ``sets``: which of ``config.sessions`` session
    sets to run (default: all); each set's creation order and turn orders depend only on its index and the
    seed, so sets run in different processes (:mod:`edge.profile.fresh`) are the sets one process would run.

    ``counts``: timed calls per round of each backend (another process's, so that all time alike); None: from
    this run's first warm-up (:func:`_counts`; ``twins`` maps an A/A copy to its backend).

    Returns ``{"latencies": name -> every timed call (ms), "round_medians": name -> each round's
    median, "round_sets": each round's session set, "batches", "describe": name -> backend.describe(),
    "weight_bytes", "iterations": name -> timed calls per round, "creation_orders", "turn_orders": each round's
    order}``.
    """
    names = list(factories)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    round_medians: dict[str, list[float]] = {name: [] for name in names}
    round_sets: list[int] = []
    described: dict[str, dict] = {}
    weights: dict[str, int] = {}
    orders = []
    iterations = dict(counts) if counts is not None else None
    per_set = max(1, config.rounds // config.sessions)
    turn_orders: list[list[str]] = []
    for s in range(config.sessions) if sets is None else sets:
        shuffle = np.random.default_rng([config.seed, s])
        created = _rotated(names, s)
        orders.append(created)
        backends = {name: factories[name]() for name in created}
        try:
            warm: dict[str, list[float]] = {name: [] for name in backends}
            for name, backend in backends.items():
                for _ in range(config.warmup):
                    t0 = time.perf_counter()
                    backend.infer()
                    warm[name].append((time.perf_counter() - t0) * 1000.0)
            if iterations is None:
                iterations = _counts(config, warm, twins or {})
            for _ in range(per_set):
                turn_orders.append([names[i] for i in shuffle.permutation(len(names))])
                for name in turn_orders[-1]:
                    backend, start = backends[name], len(latencies[name])
                    for _ in range(iterations[name]):
                        t0 = time.perf_counter()
                        backend.infer()
                        latencies[name].append((time.perf_counter() - t0) * 1000.0)
                    round_medians[name].append(float(np.median(latencies[name][start:])))
                round_sets.append(s)
            for name, backend in backends.items():
                described.setdefault(name, backend.describe())
                weights.setdefault(name, backend.weight_bytes())
        finally:
            for backend in backends.values():
                backend.close()
    return {"latencies": latencies, "round_medians": round_medians, "round_sets": round_sets,
            "describe": described, "weight_bytes": weights, "iterations": iterations, "creation_orders": orders,
            "turn_orders": turn_orders}


def speedup_interval(reference: list[float], candidate: list[float], round_sets: list[int], *,
                     confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """Speedup of ``candidate`` over ``reference`` from paired per-round medians, with its interval."""
    ratios = np.asarray(reference, np.float64) / np.asarray(candidate, np.float64)
    sets = np.asarray(round_sets)
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(sets == s) for s in np.unique(sets)]
    picks = np.concatenate([rng.choice(g, size=(resamples, len(g))) for g in groups], axis=1)
    boot = np.median(ratios[picks], axis=1)
    alpha = (1.0 - confidence) / 2
    return {"speedup": float(np.median(ratios)), "low": float(np.quantile(boot, alpha)),
            "high": float(np.quantile(boot, 1.0 - alpha)), "rounds": int(ratios.size),
            "round_ratio_quartiles": [float(np.quantile(ratios, q)) for q in (0.25, 0.75)]}


def aa_deviation(aa: dict) -> float:
    """How far the A/A control strays from 1 (point or interval bound): the comparison's resolution."""
    return max(abs(aa["speedup"] - 1.0), abs(aa["low"] - 1.0), abs(aa["high"] - 1.0))


def verdict(speedup: dict, resolution: float, noisy: bool) -> str:
    """``faster`` / ``slower`` only when the whole interval lies beyond 1 by more than the A/A deviation."""
    if speedup["low"] > 1.0 + resolution:
        return "faster"
    if speedup["high"] < 1.0 - resolution:
        return "slower"
    return "too noisy to tell" if noisy else "no clear difference"


def spread(latencies: list[float]) -> dict:
    values = np.asarray(latencies, np.float64)
    p10, p25, p75, p90 = (float(np.percentile(values, q)) for q in (10, 25, 75, 90))
    return {"p10_ms": p10, "p25_ms": p25, "p75_ms": p75, "iqr_ms": p75 - p25, "p10_p90_ms": [p10, p90]}


def summarize(timed: dict, reference: str, config: SideBySideConfig) -> dict:
    """Per backend: latency statistics, spread, speedup against ``reference``; the A/A control; the verdicts."""
    rounds, sets = timed["round_medians"], timed["round_sets"]
    interval = {name: speedup_interval(rounds[reference], rounds[name], sets, confidence=config.confidence,
                                       resamples=config.resamples, seed=config.seed)
                for name in rounds}
    aa = interval[reference + AA_SUFFIX]
    resolution = aa_deviation(aa)
    noisy = resolution > config.aa_tolerance
    results = {}
    for name, latencies in timed["latencies"].items():
        stats = latency_stats(latencies, timed["describe"][name]["batch"])
        results[name] = {"latency": {**stats, **spread(latencies), "round_medians_ms": rounds[name]},
                         "speedup": {**interval[name], "verdict": verdict(interval[name], resolution, noisy)},
                         "backend": timed["describe"][name], "weight_bytes": timed["weight_bytes"][name]}
    return {"reference": reference, "aa_control": {**aa, "deviation": resolution, "of": reference},
            "noisy": noisy, "variants": results, "iterations_per_round": timed["iterations"],
            "creation_orders": timed["creation_orders"], "method": METHOD}


def with_aa_control(factories: dict[str, Callable[[], Backend]], reference: str) -> dict[str, Callable[[], Backend]]:
    """``factories`` and the reference's A/A copy (named ``reference + AA_SUFFIX``), timed as one more backend."""
    if reference not in factories:
        from edge.errors import InternalError

        raise InternalError(f"side_by_side: the reference {reference!r} is not among {sorted(factories)}")
    return {**factories, reference + AA_SUFFIX: factories[reference]}


def time_sets(factories: dict[str, Callable[[], Backend]], reference: str, config: SideBySideConfig,
              sets: range | None = None, counts: dict[str, int] | None = None) -> dict:
    """Session sets ``sets`` (default: all) of the interleaving with the A/A control, and the CPU contention meanwhile:
    ``{"timed": interleave's result, "contention", "seconds"}``, what :func:`finish` pools and summarizes.
    ``counts``: each backend's timed calls per round, as an earlier part timed them (None: from the warm-up)."""
    started = time.perf_counter()
    with CpuContention() as contention:
        timed = interleave(with_aa_control(factories, reference), config, sets, counts,
                           twins={reference + AA_SUFFIX: reference})
    return {"timed": timed, "contention": contention.result(), "seconds": time.perf_counter() - started}


def pooled(parts: list[dict]) -> dict:
    """The timings of several :func:`time_sets` parts (disjoint session sets, in order) as one interleaving's."""
    first = parts[0]["timed"]
    if len(parts) == 1:
        return first
    names = list(first["latencies"])
    return {"latencies": {n: [x for p in parts for x in p["timed"]["latencies"][n]] for n in names},
            "round_medians": {n: [x for p in parts for x in p["timed"]["round_medians"][n]] for n in names},
            "round_sets": [s for p in parts for s in p["timed"]["round_sets"]],
            "describe": first["describe"], "weight_bytes": first["weight_bytes"], "iterations": first["iterations"],
            "creation_orders": [o for p in parts for o in p["timed"]["creation_orders"]],
            "turn_orders": [o for p in parts for o in p["timed"]["turn_orders"]]}


def _contention(parts: list[dict]) -> dict:
    """The parts' CPU contention as one: shares weighted by each part's seconds."""
    found = [p["contention"] for p in parts]
    if len(found) == 1:
        return found[0]
    seconds = sum(c["seconds"] for c in found)

    def weighted(key: str) -> float | None:
        shares = [c.get(key) for c in found]
        return None if None in shares else round(sum(o * c["seconds"] for o, c in zip(shares, found)) / seconds, 4)

    other = weighted("other_cpu_share")
    return {**found[0], "other_cpu_share": other, "stolen_cpu_share": weighted("stolen_cpu_share"),
            "seconds": round(seconds, 3),
            "own_cpu_share": round(sum(c["own_cpu_share"] * c["seconds"] for c in found) / seconds, 4),
            "busy": None if other is None else other > BUSY_SHARE, "processes": len(found)}


#: A ratio whose timing processes (or, all in one process, session sets) disagree by more than this share of its
#: median is flagged noisy: the report does not rank it against the others
NOISY_SPREAD = 0.05


def group_speedups(parts: list[dict], reference: str) -> tuple[str, dict[str, list[float]]]:
    """Each timing process's own speedup of every backend against ``reference`` (the median over its rounds of
    the round's paired ratio); with one process, each session set's. ``(what the groups are, name -> speedups)``."""
    if len(parts) > 1:
        kind, groups = "processes", [p["timed"]["round_medians"] for p in parts]
    else:
        timed = parts[0]["timed"]
        sets = np.asarray(timed["round_sets"])
        kind = "session sets"
        groups = [{n: np.asarray(v)[sets == s] for n, v in timed["round_medians"].items()} for s in np.unique(sets)]
    return kind, {name: [float(np.median(np.asarray(g[reference]) / np.asarray(g[name]))) for g in groups]
                  for name in groups[0]}


def with_spread(summary: dict, parts: list[dict], reference: str) -> dict:
    """``summary`` with every speedup's spread across its timing processes (``process_spread``: (max - min) /
    median of their speedups) and the flag ``noisy`` above :data:`NOISY_SPREAD`."""
    kind, speedups = group_speedups(parts, reference)
    for name, result in summary["variants"].items():
        values = speedups[name]
        spread = (max(values) - min(values)) / float(np.median(values)) if len(values) > 1 else 0.0
        result["speedup"].update(by_group=[round(v, 4) for v in values], process_spread=round(spread, 4),
                                 noisy=bool(spread > NOISY_SPREAD))
    return {**summary, "spread": {"groups": kind, "count": len(next(iter(speedups.values()))),
                                  "tolerance": NOISY_SPREAD}}


def finish(parts: list[dict], reference: str, config: SideBySideConfig) -> dict:
    """:func:`summarize` of the pooled parts with each ratio's spread across the parts (:func:`with_spread`), the
    settings, seconds, contention, clock, hardware and version."""
    from edge import __version__
    from edge.runtime import hardware

    return {**with_spread(summarize(pooled(parts), reference, config), parts, reference), "settings": asdict(config),
            "seconds": sum(p["seconds"] for p in parts), "contention": _contention(parts),
            "clock": "time.perf_counter (host, synchronous calls)", "hardware": hardware(), "edge": __version__}


def side_by_side(factories: dict[str, Callable[[], Backend]], reference: str,
                 config: SideBySideConfig | None = None) -> dict:
    """Time ``factories``' backends side by side with an A/A control of ``reference``, in this process; see
    :func:`summarize`."""
    config = config or SideBySideConfig()
    return finish([time_sets(factories, reference, config)], reference, config)
