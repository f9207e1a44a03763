"""The report's chart: accuracy against speedup, measured here and estimated for the Orin Nano (a PNG)."""

from __future__ import annotations

import io

from edge.pipeline.report.tables import images_cell


def speed_chart_png(report: dict) -> bytes:
    """Accuracy against speedup over the original: measured here (ONNX Runtime, whiskers: the 95 % interval)
    and, where the recipe asks for it, estimated for the Orin Nano: two labelled series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*report["variants"], *report["precision"]]
    first = report["variants"][0]
    fig, ax = plt.subplots(figsize=(7.6, 4.8), dpi=110, layout="constrained")
    labelled = set()
    for v in rows:
        s, y = v["speedup"], 100 * v["accuracy"]
        subset = v["samples"] != first["samples"]   # on evaluate.subset of the test images
        label = (f"measured here, accuracy on the {images_cell(v)} (method variants, FP16/INT8)" if subset
                 else f"measured here (ONNX Runtime, CPU), accuracy on the {images_cell(first)}")
        ax.errorbar([s["speedup"]], [y], xerr=[[s["speedup"] - s["low"]], [s["high"] - s["speedup"]]],
                    fmt="s" if subset else "o", color="#55a868" if subset else "#4c72b0", capsize=3, markersize=6,
                    label=None if label in labelled else label)
        labelled.add(label)
        ax.annotate(v["name"], (s["speedup"], y), textcoords="offset points", xytext=(6, 5), fontsize=7)
    orin = report["orin_estimate"]
    if orin:
        accuracy = {v["name"]: v["accuracy"] for v in rows}
        for i, r in enumerate(orin["rows"]):
            ax.plot([r["speedup"]], [100 * accuracy[r["name"]]], "D", color="#dd8452", markersize=5,
                    label=f"Orin Nano, estimated ({orin['power_mode']}, TensorRT)" if not i else None)
            ax.annotate(r["name"], (r["speedup"], 100 * accuracy[r["name"]]), textcoords="offset points",
                        xytext=(6, -9), fontsize=7, color="#a0522d")
    ax.axvline(1.0, color="#999", lw=0.8)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_xlabel(f"speedup over `{report['latency']['reference']}` (here: measured, batch "
                  f"{first['profile']['batch']}, "
                  f"whiskers: 95 % interval; Orin: estimated)")
    ax.set_ylabel("top-1 accuracy (%), test images as the legend says")
    ax.set_title("accuracy vs speed: measured here and estimated for the Orin Nano", fontsize=10)
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()
