"""plan_peers' plot: test accuracy after distillation against the final measured speedup, one panel per batch."""

from __future__ import annotations

import math
from pathlib import Path

from _peers_names import budget_text, ordered
from _peers_report import rows_of


def plot(r: dict, png: str | Path) -> None:
    """Accuracy after distillation against the final measured speedup, one panel per batch (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rows_of(r)
    batches = list(r["final_timing"])
    style = {"edge": ("tab:red", "o"), "torch-pruning uniform": ("tab:blue", "s"),
             "torch-pruning global": ("tab:cyan", "D"), "tome": ("tab:green", "^")}
    budgets = ordered(rows[0]["after"])
    # the axis spans the distilled accuracies (the comparison); training-free points below it are left off
    low = math.floor(min(100 * a for row in rows for a in row["after"].values() if a is not None) - 1.0)
    high = math.ceil(max([100 * a for row in rows for a in row["after"].values() if a is not None]
                         + [100 * r["original"]["accuracy"]["accuracy"]]) + 0.5)
    off = len({row["key"] for row in rows if 100 * row["before"] < low})
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4.8), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        for family, (color, marker) in style.items():
            mine = [row for row in rows if row["family"] == family]
            if not mine:
                continue
            x = [row["speedup"][b] for row in mine]
            for i, budget in enumerate(budgets):       # the longest budget solid, shorter ones fainter and smaller
                last = i == len(budgets) - 1
                ran = [(xi, row) for xi, row in zip(x, mine, strict=True) if row["after"][budget] is not None]
                ax.scatter([xi for xi, _ in ran], [100 * row["after"][budget] for _, row in ran], c=color,
                           marker=marker, alpha=1.0 if last else 0.45, s=36 if last else 22,
                           label=f"{family}, {budget_text(budget)}")
            ax.scatter(x, [100 * row["before"] for row in mine], facecolors="none", edgecolors=color, marker=marker,
                       alpha=0.6, label=f"{family}, before")
        ax.axhline(100 * r["original"]["accuracy"]["accuracy"], color="gray", ls="--", lw=1, label="original")
        ax.set_xlabel(f"measured speedup over the original, batch {b} (ONNX Runtime CPU)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_ylim(low, high)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)
    title = f"{r['model']}: accuracy against measured speedup"
    if off:
        title += f"\n({off} model{'s' * (off != 1)} below {low} % before distillation, off the axis: see the table)"
    fig.suptitle(title, fontsize=10 if off else 12)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)

