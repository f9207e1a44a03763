"""ONNX Runtime graphs timed side by side on this machine: the protocol every host timing of edge shares.

A latency table's part graphs (:mod:`edge.latency.measure`), the planner's whole-model check and the main
job's profile (:mod:`edge.profile.fresh`, in a new process) all time with :class:`TimingConfig`: each graph
gets its own ONNX Runtime session (CPU, all graph optimisations, a fixed thread count, pool threads that
stop spinning when a call returns), timed interleaved (:func:`edge.profile.sidebyside.interleave`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge.config import MAX_STEPS, MAX_THREADS, option
from edge.profile.backends import OrtBackend
from edge.profile.sidebyside import SideBySideConfig, interleave
from edge.profile.stats import latency_stats

CLOCK = "time.perf_counter (host, synchronous calls)"


@dataclass(frozen=True)
class TimingConfig:
    threads: int = option(2, minimum=1, maximum=MAX_THREADS)    # ONNX Runtime intra-op threads
    warmup: int = option(10, minimum=0, maximum=MAX_STEPS)      # untimed calls per session set
    iterations: int = option(200, minimum=1, maximum=MAX_STEPS)  # timed calls per part, all rounds together
    rounds: int = option(10, minimum=1, maximum=MAX_STEPS)      # interleaved rounds
    sessions: int = option(2, minimum=1, maximum=1000)          # session sets created afresh (rotated order)
    seed: int = 0

    def per_round(self) -> int:
        return max(1, -(-self.iterations // self.rounds))


def side_by_side_config(timing: TimingConfig) -> SideBySideConfig:
    """The interleaving :func:`time_graphs` and :mod:`edge.profile.fresh` run for ``timing``."""
    return SideBySideConfig(warmup=timing.warmup, rounds=max(timing.rounds, timing.sessions, 2),
                            sessions=timing.sessions, iterations=timing.per_round(), seed=timing.seed)


def ort_factories(paths: dict[str, Path], timing: TimingConfig, batch: int | None = None) -> dict[str, Callable]:
    """name -> a fresh ONNX Runtime session of its graph (``timing.threads`` intra-op threads, pool threads
    that stop spinning when a call returns)."""
    return {name: functools.partial(OrtBackend, path, batch=batch, threads=timing.threads, spinning=False)
            for name, path in paths.items()}


def time_graphs(paths: dict[str, Path], timing: TimingConfig, batch: int | None = None) -> dict[str, dict]:
    """name -> latency statistics (ms; median, percentiles, ``round_medians_ms``) of graphs timed side by side."""
    timed = interleave(ort_factories(paths, timing, batch), side_by_side_config(timing))
    return {name: {**latency_stats(latencies, timed["describe"][name]["batch"]),
                   "round_medians_ms": timed["round_medians"][name]}
            for name, latencies in timed["latencies"].items()}
