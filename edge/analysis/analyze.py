"""``edge analyze``: similarity maps between every pair of blocks, written as JSON and heatmaps."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edge import __version__
from edge.analysis.collect import BlockMoments, collect_block_moments
from edge.analysis.heatmap import save_heatmap, save_redundancy_plot
from edge.analysis.similarity import block_redundancy
from edge.config import MAX_BATCH, MAX_SAMPLES, MAX_SEED, option
from edge.data.preprocess import InputSpec
from edge.fileio import write_text_atomic
from edge.models.info import model_info, original_block_indices
from edge.runtime import hardware


@dataclass(frozen=True)
class AnalysisConfig:
    """The calibration images the analysis streams (seeded, class-balanced training samples)."""

    data: str | None = None   # None: the bundled model's data set (edge.models.data_for); other models need it
    samples: int = option(500, minimum=1, maximum=MAX_SAMPLES)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    batch_size: int = option(64, minimum=1, maximum=MAX_BATCH)


def _label(blocks: tuple[int, ...]) -> str:
    return f"block {blocks[0]}" if len(blocks) == 1 else f"blocks {blocks[0]}-{blocks[-1]} (approximated)"


VIEWS = {"all": "all tokens", "cls": "[CLS] token (pooled token without one)"}


def _json_matrix(matrix) -> list:
    """Nested lists with NaN (undefined, e.g. CKA of a constant token) as null."""
    return [[None if value != value else value for value in row] for row in matrix.tolist()]


def similarity_maps(moments: BlockMoments) -> dict:
    """CKA, cosine, mean squared distance and BR for the all-token and [CLS] views (NaN -> null)."""
    out = {}
    for view in VIEWS:
        stats = moments.view(view)
        out[view] = {"cka": _json_matrix(stats.cka()), "cosine": _json_matrix(stats.cosine()),
                     "mse": _json_matrix(stats.squared_distance()),
                     "block_redundancy": block_redundancy(stats).tolist()}
    return out


def analyze(model: nn.Module, model_name: str, calibration, spec: InputSpec, out: str | Path,
            batch_size: int = AnalysisConfig.batch_size, device: torch.device | None = None) -> dict:
    """Collect statistics over ``calibration`` and write ``out/analysis.json`` plus PNG heatmaps."""
    import numpy as np

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    info = model_info(model)
    start = time.perf_counter()
    moments = collect_block_moments(model, calibration, spec, batch_size=batch_size, device=device)
    maps = similarity_maps(moments)
    result = {
        "model": model_name,
        "num_blocks": info.num_blocks,
        "representations": ["embedding"] + [_label(entry) for entry in original_block_indices(model.blocks)],
        "samples": moments.samples,
        "data": calibration.name,
        "tokens_per_sample": info.num_tokens,
        "views": VIEWS,
        "cka": maps["all"]["cka"],
        "cosine": maps["all"]["cosine"],
        "mse": maps["all"]["mse"],
        "block_redundancy": maps["all"]["block_redundancy"],
        "cls": maps["cls"],
        "seconds": round(time.perf_counter() - start, 2),
        "hardware": hardware(device),
        "edge": __version__,
    }
    pictures = {}
    tick_labels = ["emb"] + ["-".join(map(str, (e[0], e[-1]) if len(e) > 1 else e))
                             for e in original_block_indices(model.blocks)]
    short = Path(model_name).name if Path(model_name).exists() else model_name.split(",")[0]
    short = short if len(short) <= 40 else short[:37] + "..."
    for view, label in VIEWS.items():
        for key, kwargs in (("cka", {"vmin": 0.0, "vmax": 1.0, "colorbar": "linear CKA"}),
                            ("cosine", {"vmin": -1.0, "vmax": 1.0, "colorbar": "mean cosine similarity"})):
            path = out / f"{key}_{view}.png"
            save_heatmap(np.array(maps[view][key], dtype=float), f"{short}\n{key.upper() if key == 'cka' else key} "
                         f"({label}, {moments.samples} samples)", path, labels=tick_labels, **kwargs)
            pictures[f"{key}_{view}"] = path.name
    path = out / "block_redundancy.png"
    save_redundancy_plot(np.array(maps["all"]["block_redundancy"]), f"{short}: Block Redundancy (all tokens)", path)
    pictures["block_redundancy"] = path.name
    result["pictures"] = pictures
    write_text_atomic(json.dumps(result, indent=1), out / "analysis.json")
    return result
