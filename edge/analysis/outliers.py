"""Activation outliers of a ViT, the statistics that make quantization hard, read at timm's seams with hooks.

Per block ``b`` (its output, the residual stream after the block):

* ``channel_ratio``: the largest channel magnitude over the median channel's, a channel's magnitude being
  its largest ``|x|`` over all images and tokens (what a per-tensor quantizer's range sees);
  ``top_channels``: the largest channels and their magnitudes;
* ``sun_ratio``: the largest ``|x|`` over the median ``|x|`` of all entries (Sun et al. 2024, "Massive
  activations in large language models", define massive activations against this median);
* ``token_norm_ratio``: the largest token L2 norm over the median token norm (Darcet et al. 2024,
  "Vision Transformers need registers": high-norm tokens); ``top_tokens``: the token positions most
  often the largest of their image (0 is [CLS], 1 + r * cols + c is patch (r, c)).

Per LayerNorm (``blocks.b.norm1``, ``blocks.b.norm2``, ``norm``), over all images and tokens:
``range_spread`` = largest / smallest per-channel range (max - min), ``range_spread_p99_p1`` the same
with the 99th and 1st percentiles of the ranges (RepQ-ViT, Li et al. 2023: post-LayerNorm
inter-channel variation).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

TOP = 4  # channels and tokens listed per block


@dataclass
class _Running:
    """Streamed reductions of one hooked tensor ``[N, T, C]``."""

    channel_max: torch.Tensor | None = None      # max |x| per channel
    channel_hi: torch.Tensor | None = None       # max x per channel
    channel_lo: torch.Tensor | None = None       # min x per channel
    abs_medians: list[torch.Tensor] = field(default_factory=list)   # per-batch median |x| (weighted later)
    token_norms: list[torch.Tensor] = field(default_factory=list)   # [N, T]

    def add(self, x: torch.Tensor, keep_tokens: bool) -> None:
        x = x.detach().float()
        flat = x.reshape(-1, x.shape[-1])
        amax, hi, lo = flat.abs().amax(0).cpu(), flat.amax(0).cpu(), flat.amin(0).cpu()
        if self.channel_max is None:
            self.channel_max, self.channel_hi, self.channel_lo = amax, hi, lo
        else:
            self.channel_max = torch.maximum(self.channel_max, amax)
            self.channel_hi = torch.maximum(self.channel_hi, hi)
            self.channel_lo = torch.minimum(self.channel_lo, lo)
        if keep_tokens:
            self.abs_medians.append(flat.abs().median().cpu())
            self.token_norms.append(x.norm(dim=-1).cpu())


def _residual_summary(run: _Running) -> dict:
    mags = run.channel_max
    order = torch.argsort(mags, descending=True)
    norms = torch.cat(run.token_norms)                    # [N, T]
    top_positions = torch.bincount(norms.argmax(1), minlength=norms.shape[1])
    frequent = torch.argsort(top_positions, descending=True)[:TOP]
    median_abs = float(torch.stack(run.abs_medians).median())
    return {
        "max_abs": float(mags.max()),
        "median_channel_magnitude": float(mags.median()),
        "channel_ratio": float(mags.max() / mags.median()),
        "top_channels": [{"channel": int(c), "magnitude": float(mags[c])} for c in order[:TOP]],
        "median_abs": median_abs,
        "sun_ratio": float(mags.max()) / median_abs,
        "max_token_norm": float(norms.max()),
        "median_token_norm": float(norms.median()),
        "token_norm_ratio": float(norms.max() / norms.median()),
        "top_tokens": [{"token": int(t), "share_of_images": float(top_positions[t]) / norms.shape[0],
                        "mean_norm": float(norms[:, t].mean())} for t in frequent if top_positions[t] > 0],
    }


def _layernorm_summary(run: _Running) -> dict:
    ranges = run.channel_hi - run.channel_lo
    p1, p99 = torch.quantile(ranges, torch.tensor([0.01, 0.99])).tolist()
    return {"max_range": float(ranges.max()), "min_range": float(ranges.min()),
            "range_spread": float(ranges.max() / ranges.min()), "range_spread_p99_p1": p99 / p1,
            "widest_channels": [int(c) for c in torch.argsort(ranges, descending=True)[:TOP]]}


@contextmanager
def _hooked(model: nn.Module, runs: dict[str, _Running]) -> Iterator[None]:
    handles = []

    def keep(name: str, tokens: bool):
        return lambda module, inputs, output: runs[name].add(output, tokens)

    for b, block in enumerate(model.blocks):
        runs[f"blocks.{b}"] = _Running()
        handles.append(block.register_forward_hook(keep(f"blocks.{b}", True)))
        for norm in ("norm1", "norm2"):
            if isinstance(getattr(block, norm, None), nn.LayerNorm):
                runs[f"blocks.{b}.{norm}"] = _Running()
                handles.append(getattr(block, norm).register_forward_hook(keep(f"blocks.{b}.{norm}", False)))
    if isinstance(getattr(model, "norm", None), nn.LayerNorm):
        runs["norm"] = _Running()
        handles.append(model.norm.register_forward_hook(keep("norm", False)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def outlier_statistics(model: nn.Module, batches, device: torch.device | str = "cpu") -> dict:
    """The statistics of the module docstring over ``batches`` (preprocessed float ``[N, C, H, W]``
    tensors, or ``(x, y)`` pairs), in float32, the model in eval mode."""
    runs: dict[str, _Running] = {}
    model = model.to(device).eval()
    images = 0
    with _hooked(model, runs), torch.no_grad():
        for batch in batches:
            x = batch[0] if isinstance(batch, tuple | list) else batch
            model(x.to(device))
            images += len(x)
    blocks = [dict(block=b, **_residual_summary(runs[f"blocks.{b}"])) for b in range(len(model.blocks))]
    norms = {name: _layernorm_summary(run) for name, run in runs.items() if "norm" in name}
    return {"images": images, "blocks": blocks, "layernorms": norms, "summary": summarize(blocks, norms)}


def summarize(blocks: list[dict], norms: dict[str, dict], channel_ratio: float = 100.0,
              range_spread: float = 20.0) -> dict:
    """How many blocks / LayerNorms pass the thresholds of issue 30 (>= 100x, >= 20x)."""
    massive = [b["block"] for b in blocks if b["channel_ratio"] >= channel_ratio]
    spread = [n for n, s in norms.items() if s["range_spread"] >= range_spread]
    robust = [n for n, s in norms.items() if s["range_spread_p99_p1"] >= range_spread]
    return {
        "channel_ratio_threshold": channel_ratio, "range_spread_threshold": range_spread,
        "blocks": len(blocks), "massive_blocks": massive,
        "max_channel_ratio": max(b["channel_ratio"] for b in blocks),
        "max_token_norm_ratio": max(b["token_norm_ratio"] for b in blocks),
        "layernorms": len(norms), "spread_layernorms": spread, "spread_layernorms_p99_p1": robust,
        "min_range_spread": min(s["range_spread"] for s in norms.values()),
        "median_range_spread_p99_p1": float(torch.tensor([s["range_spread_p99_p1"] for s in norms.values()]).median()),
        "meets_targets": 2 * len(massive) >= len(blocks) and 2 * len(spread) >= len(norms),
    }
