"""The speed-up of edge's TensorRT plugins on each device (``edge deploy --plugin-ratio``).

edge's plugins stay off by default until a device shows an engine with them faster than without. The
measurement is a pair of variants in one bundle: ``NAME`` (the graph as exported) and ``NAME-plugins``
(the same model after ``edge clean --plugins``: its mixers as TokenDepthwiseConv nodes, jetson.plugin_build),
at the same precision. The device builds and benchmarks both like any variant; the ratio is read from
the fetched results: ``speedup = median latency without / median latency with`` the plugins (above 1: the
plugin engine is faster), with the GPU-event medians beside it where TensorRT measured them, and each
engine's accuracy-gate verdict (``accuracy``: ``pass``, ``wrong``, or None without a gate): a speed-up
of an engine whose outputs are wrong is no speed-up.
"""

from __future__ import annotations

from edge.deploy.results import FetchedDevice
from edge.errors import EdgeError
from jetson.bundle import Bundle

SUFFIX = "-plugins"  # NAME-plugins is NAME's graph with edge's plugin nodes


def plugin_pairs(bundle: Bundle) -> list[tuple[str, str, str]]:
    """``(NAME, NAME-plugins, precision)`` for every pair in the bundle whose second variant needs edge's plugins."""
    ids = {(v.name, v.precision): v for v in bundle.variants}
    return [(name.removesuffix(SUFFIX), name, precision) for (name, precision), variant in ids.items()
            if name.endswith(SUFFIX) and variant.build.needs_edge_plugins
            and (name.removesuffix(SUFFIX), precision) in ids]


def check_pairs(bundle: Bundle) -> None:
    if not plugin_pairs(bundle):
        raise EdgeError("--plugin-ratio: the bundle has no pair of variants NAME and NAME-plugins (the same model "
                        "with edge's plugin nodes) at one precision",
                        expected="both graphs in one bundle: NAME.onnx and NAME-plugins.onnx (from `edge clean "
                                 "--plugins`)",
                        fix="bundle both graphs, or deploy without --plugin-ratio")


def _median(result: dict | None, key: str) -> float | None:
    stats = (result or {}).get(key) or {}
    return stats.get("median_ms")


def _gate_status(result: dict | None) -> str | None:
    return ((result or {}).get("accuracy") or {}).get("status")


def plugin_ratios(bundle: Bundle, device: FetchedDevice) -> list[dict]:
    """One row per pair that finished on ``device``: the medians with and without the plugins and their ratio."""
    rows = []
    for name, plugin_name, precision in plugin_pairs(bundle):
        without, with_ = (device.results.get(f"{n}.{precision}") for n in (name, plugin_name))
        if not (_median(without, "latency") and _median(with_, "latency")) or (with_ or {}).get("partial"):
            continue
        row = {"variant": name, "plugin_variant": plugin_name, "precision": precision,
               "without_ms": _median(without, "latency"), "with_ms": _median(with_, "latency")}
        row["speedup"] = row["without_ms"] / row["with_ms"]
        gpu = (_median(without, "gpu_latency"), _median(with_, "gpu_latency"))
        row["gpu_speedup"] = gpu[0] / gpu[1] if all(gpu) else None
        row["accuracy"] = {"without": _gate_status(without), "with": _gate_status(with_)}
        rows.append(row)
    return rows
