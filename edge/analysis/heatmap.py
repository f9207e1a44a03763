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
    fig, ax = plt.subplots(figsize=(6.2, 5.2), dpi=110)
    image = ax.imshow(matrix, cmap="viridis", vmin=vmin, vmax=vmax, origin="upper")
    ax.set_xticks(range(n), labels, fontsize=8, rotation=45 if max(map(len, labels)) > 3 else 0)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_xlabel("block output (emb = embedding, block -1)")
    ax.set_ylabel("block output")
    ax.set_title(title, fontsize=10)
    if n <= 16:
        for i in range(n):
            for j in range(n):
                value = matrix[i, j]
                bright = (value - (vmin if vmin is not None else matrix.min())) / \
                    max((vmax if vmax is not None else matrix.max()) - (vmin if vmin is not None else matrix.min()),
                        1e-12)
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=5.5,
                        color="black" if bright > 0.6 else "white")
    fig.colorbar(image, ax=ax, label=colorbar, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def save_redundancy_plot(values: np.ndarray, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 3.2), dpi=110)
    ax.bar(range(len(values)), values, color="#4c72b0")
    ax.set_xticks(range(len(values)))
    ax.set_xlabel("block b (BR compares its output with block b-1's; block 0 with the embedding)")
    ax.set_ylabel("BR(b) = -mean ||h_b - h_(b-1)||^2")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
