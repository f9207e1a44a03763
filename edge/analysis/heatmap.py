"""Pictures of the analysis: block-by-block heatmaps and the Block Redundancy profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _labels(n: int) -> list[str]:
    return ["emb"] + [str(i) for i in range(n - 1)]


def save_heatmap(matrix: np.ndarray, title: str, path: Path, *, vmin: float | None = None,
                 vmax: float | None = None, colorbar: str = "", labels: list[str] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = matrix.shape[0]
    labels = labels or _labels(n)
    fig, ax = plt.subplots(figsize=(6.4, 5.4), dpi=110, layout="constrained")
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis", vmin=vmin, vmax=vmax, origin="upper")
    ax.set_xticks(range(n), labels, fontsize=8, rotation=45 if max(map(len, labels)) > 3 else 0)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("block output (emb = embedding, block -1)")
    ax.set_ylabel("block output")
    ax.set_title(title, fontsize=10)
    if n <= 16:
        low = vmin if vmin is not None else np.nanmin(matrix)
        high = vmax if vmax is not None else np.nanmax(matrix)
        for i in range(n):
            for j in range(n):
                value = matrix[i, j]
                if np.isnan(value):  # undefined (a constant representation): left blank, marked
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=5, color="gray")
                    continue
                bright = (value - low) / max(high - low, 1e-12)
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=5.5,
                        color="black" if bright > 0.6 else "white")
    fig.colorbar(image, ax=ax, label=colorbar, fraction=0.046, pad=0.04)
    fig.savefig(path)
    plt.close(fig)
    return path


def save_redundancy_plot(values: np.ndarray, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 3.4), dpi=110, layout="constrained")
    ax.bar(range(len(values)), values, color="#4c72b0")
    ax.set_xticks(range(len(values)))
    ax.set_xlabel("block b (BR compares its output with block b-1's; block 0 with the embedding)")
    ax.set_ylabel("BR(b) = -mean ||h_b - h_(b-1)||^2")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path)
    plt.close(fig)
    return path
