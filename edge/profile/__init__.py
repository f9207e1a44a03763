"""``edge profile``: latency of a model on a backend, with warm-up, iterations and percentiles."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

from edge import __version__
from edge.config import MAX_STEPS, option
from edge.profile.backends import Backend, OrtBackend, TorchBackend
from edge.profile.contention import CpuContention
from edge.profile.stats import latency_stats, trtexec_summary

__all__ = ["Backend", "CpuContention", "OrtBackend", "ProfileConfig", "TorchBackend", "latency_stats", "profile",
           "trtexec_summary"]


@dataclass
class ProfileConfig:
    warmup: int = option(20, minimum=0, maximum=MAX_STEPS)       # iterations before timing
    iterations: int = option(200, minimum=1, maximum=MAX_STEPS)  # timed iterations (at least this many)
    duration: float | None = option(None, above=0, maximum=86400)  # or: keep timing for at least this many seconds


def profile(backend: Backend, config: ProfileConfig | None = None) -> dict:
    """Warm up, then time ``backend.infer()`` one call at a time with a monotonic clock."""
    from edge.runtime import hardware

    config = config or ProfileConfig()
    start = time.perf_counter()
    for _ in range(config.warmup):
        backend.infer()
    warmup_seconds = time.perf_counter() - start
    latencies = []
    started = time.perf_counter()
    with CpuContention() as contention:
        while len(latencies) < config.iterations or (config.duration and
                                                     time.perf_counter() - started < config.duration):
            t0 = time.perf_counter()
            backend.infer()
            latencies.append((time.perf_counter() - t0) * 1000.0)
    seconds = time.perf_counter() - started
    info = backend.describe()
    return {
        **info,
        "latency": latency_stats(latencies, info["batch"]),
        "warmup": {"iterations": config.warmup, "seconds": warmup_seconds},
        "seconds": seconds,
        "weight_bytes": backend.weight_bytes(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "clock": "time.perf_counter (host, synchronous calls)",
        "contention": contention.result(),  # other processes' share of the CPUs while timing
        "hardware": hardware(),
        "edge": __version__,
    }
