"""Latency statistics in the shape trtexec reports them (plus spread: std and coefficient of variation).

The one implementation of the latency schema: ``edge profile`` (edge.profile.stats) and the device
runner both call :func:`latency_stats`, so host and device results read the same.
"""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def latency_stats(latencies_ms: list[float] | np.ndarray, batch: int) -> dict:
    """min/mean/median/p90/p95/p99/max, std, CV and throughput of per-inference latencies (ms)."""
    values = np.asarray(latencies_ms, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no latencies measured")
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    stats = {
        "iterations": int(values.size),
        "min_ms": float(values.min()),
        "mean_ms": mean,
        "median_ms": float(np.percentile(values, 50)),
        **{f"p{p}_ms": float(np.percentile(values, p)) for p in PERCENTILES[1:]},
        "max_ms": float(values.max()),
        "std_ms": std,
        "cv": std / mean if mean > 0 else 0.0,
        "throughput_qps": 1000.0 / mean if mean > 0 else 0.0,
    }
    stats["throughput_images_per_s"] = stats["throughput_qps"] * batch
    return stats
