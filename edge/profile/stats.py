"""Latency statistics (one implementation, :mod:`jetson.stats`, shared with the device runner) and their
trtexec-style summary."""

from __future__ import annotations

from jetson.stats import PERCENTILES, latency_stats

__all__ = ["PERCENTILES", "latency_stats", "trtexec_summary"]


def trtexec_summary(result: dict) -> str:
    """A trtexec-style performance summary (printed on stderr)."""
    s = result["latency"]
    return "\n".join([
        "=== Performance summary ===",
        f"Backend: {result['backend']} | device: {result['device']} | precision: {result['precision']} | "
        f"batch: {result['batch']} | threads: {result.get('threads')}",
        f"Throughput: {s['throughput_qps']:.2f} qps ({s['throughput_images_per_s']:.1f} images/s)",
        f"Latency: min = {s['min_ms']:.4f} ms, max = {s['max_ms']:.4f} ms, mean = {s['mean_ms']:.4f} ms, "
        f"median = {s['median_ms']:.4f} ms, percentile(90%) = {s['p90_ms']:.4f} ms, "
        f"percentile(95%) = {s['p95_ms']:.4f} ms, percentile(99%) = {s['p99_ms']:.4f} ms",
        f"Spread: std = {s['std_ms']:.4f} ms, CV = {100 * s['cv']:.2f} %",
        f"Warm-up: {result['warmup']['iterations']} iterations ({result['warmup']['seconds']:.2f} s); "
        f"measured: {s['iterations']} iterations ({result['seconds']:.2f} s)",
        f"Weights: {result['weight_bytes'] / 1e6:.2f} MB | peak RSS: {result['peak_rss_mb']:.0f} MB",
        *_contention_line(result.get("contention")),
    ])


def _contention_line(contention: dict | None) -> list[str]:
    if not contention or contention.get("other_cpu_share") is None:
        return []
    share = contention["other_cpu_share"]
    verdict = "busy: other work competed, not a clean figure" if contention["busy"] else "quiet"
    return [f"Other processes: {100 * share:.1f} % of {contention['cpus']} CPUs while timing ({verdict})"]
