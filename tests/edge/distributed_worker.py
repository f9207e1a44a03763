"""Run by tests/edge/test_distributed.py under ``torchrun``: every calibration statistic edge collects
(block moments, attention maps, entropies and NOSE, attention-removal moments, kernel fits, WPAC's
token-weighted covariances and Taylor sums).

``python -m torch.distributed.run --nproc_per_node N -m tests.edge.distributed_worker WEIGHTS OUT``
collects them with N processes (each streams its share; the sums are reduced) and the main process
saves them to OUT with ``torch.save``; run without torchrun it collects them in one process.
:func:`statistics` is what the test compares, the same function in both cases.
"""

from __future__ import annotations

import sys

import torch

from edge import distributed
from edge.analysis.attention import collect_attention_stats
from edge.analysis.collect import collect_block_moments
from edge.analysis.entropy import collect_entropy, transfer_entropy
from edge.analysis.nose import nose_search
from edge.compress.methods.attnrm.build import collect_attention_moments
from edge.compress.methods.dwconv.build import fit_kernels
from edge.compress.methods.wpac.statistics import collect_statistics
from edge.data import InputSpec, calibration_set
from edge.models import create_model, data_config
from edge.models.info import model_info

# 4 blocks so that NOSE has a choice to make over two steps; 37 samples and batches of 8 leave the
# two processes unequal shares (19 and 18) and a partial last batch in each
TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
SAMPLES, BATCH = 37, 8


def _pair(moments) -> dict:
    return {"count": moments.count, "sample_count": moments.sample_count, "sums": moments.sums,
            "grams": moments.grams, "cosine_sums": moments.cosine_sums}


def _weighted(moments) -> dict:
    return {"rows": moments.rows, "weight": moments.weight, "first": moments.first, "second": moments.second}


def _welford(w) -> dict:
    return {"count": w.count, "mean": w.mean, "m2": w.m2}


def statistics(weights: str) -> dict:
    """Every statistic, as nested dicts of tensors and numbers."""
    model = create_model(TINY, weights=weights).eval()
    spec = InputSpec.from_data_config(data_config(model))
    images = calibration_set("fmnist-mini", SAMPLES, seed=0)
    out: dict = {}
    blocks = collect_block_moments(model, images, spec, batch_size=BATCH)
    out["block_moments"] = {"samples": blocks.samples, **{view: _pair(getattr(blocks, view))
                                                            for view in ("prefix", "patch", "pooled")}}
    attention = collect_attention_stats(model, images, spec, batch_size=BATCH)
    out["attention"] = {"samples": attention.samples, **{str(b): _welford(w)
                                                         for b, w in zip(attention.blocks, attention.maps)}}
    entropy = collect_entropy(model, images, spec, batch_size=BATCH)
    out["entropy"] = {"samples": entropy.samples, "target": _welford(entropy.target),
                      **{f"attention{p}": _welford(m) for p, m in entropy.attention.items()},
                      **{f"mlp{p}": _welford(m) for p, m in entropy.mlp.items()}}
    out["transfer_entropy"] = transfer_entropy(model, images, spec, {1}, batch_size=BATCH)
    nose = nose_search(model, images, spec, 2, batch_size=BATCH)
    out["nose"] = {"chosen": nose.chosen, "samples": nose.samples, "target_entropy": nose.target_entropy,
                   "te": [row["te"] for row in nose.trajectory]}
    moments = collect_attention_moments(model, [0, 2], images, spec, batch_size=BATCH)
    out["attnrm_moments"] = {str(b): _pair(m) for b, m in moments.items()}
    grid = model_info(model).grid
    fits = fit_kernels(model, {1: ((0,), "ensembled"), 3: ((0, 1), "unensembled")}, images, spec, k=3,
                       num_prefix_tokens=1, grid=grid, batch_size=BATCH)
    out["dwconv_kernel_fit"] = {str(b): {"count": f.count, "gram": f.gram, "cross": f.cross,
                                         "target_sq": f.target_sq, "target_sum": f.target_sum}
                                for b, f in fits.items()}
    wpac = collect_statistics(model, {0: 0, 3: 3}, images, spec, batch_size=BATCH)
    out["wpac"] = {str(b): {"images": w.images, "taylor_qkv": w.taylor_qkv, "taylor_mlp": w.taylor_mlp,
                            **{part: _weighted(getattr(w, part)) for part in ("q", "k", "v")}}
                   for b, w in wpac.items()}
    return out


def main(weights: str, path: str) -> None:
    torch.set_num_threads(1)
    distributed.init("cpu")
    result = statistics(weights)
    result["world_size"] = distributed.world_size()
    if distributed.is_main():
        torch.save(result, path)
    if distributed.shutdown():
        distributed.end_process(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
