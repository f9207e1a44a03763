"""Entropy of sub-layer outputs, transfer entropy to the output, and NOSE (attention-removal selection).

The attention-removal paper (mlp-only-nose-dilution, Sec. 3.2-3.3) takes a feature as Gaussian
per channel, so its entropy is ``log sigma`` plus constants (Eq. 5), and a layer's entropy is

    H_sigma(F) = sum_j log std(F^j)                                            (Eq. 6)

over the channels ``j`` of its output ``F``. Here:

* **Which output.** A block's attention sub-layer output is ``ls1(attn(norm1(x)))`` and its MLP
  sub-layer output ``ls2(mlp(norm2(x)))``: the sub-layer's own output before the residual add, as
  in the paper's Fig. 1(b). They are read by forward hooks on ``blocks[i].ls1`` / ``blocks[i].ls2``
  (timm's LayerScale, an ``nn.Identity`` without one); ``drop_path`` after them is the identity in
  eval mode.
* **Rows.** The std of a channel is taken over images x tokens. The class and register tokens are
  left out by default (``tokens="patch"``): they are few, and before the first block they do not
  depend on the image at all, so they would mix a second, differently scaled population into
  every channel. ``tokens="all"`` includes them.
* **Which std.** The population std (divide by ``n``): the maximum-likelihood sigma of Eq. 5, and
  what the authors' own entropy printout computes (``np.std``). The sample std would add the same
  constant ``D/2 log(n/(n-1))`` to every entropy; transfer entropies do not change.
* **Streaming.** Per channel a float64 count, mean and sum of squared deviations, merged batch by
  batch (Chan, Golub and LeVeque's pairwise update), so memory does not grow with the calibration
  set and the result does not depend on the batch size beyond rounding. Under torchrun each
  process streams its share of the images (:func:`edge.distributed.shard_of`) and the moments are
  merged exactly from all-reduced sums (:func:`edge.distributed.merge_welford`) before any entropy
  is taken, so every process makes the same NOSE choice.
* A channel with zero std (e.g. the output of an attention whose projection is zero) has
  ``log 0 = -inf``: the entropy is then ``-inf`` and the JSON writes ``null`` with the count of
  such channels.

**Transfer entropy** (Eq. 7) of a set ``S`` of attention sub-layers to the target layer:

    TE(S) = H(F_target) - H(F_target | the attention sub-layers of S made identity)

"Made identity" is the residual only: the block computes ``x = x; x = x + ls2(mlp(norm2(x)))``.
It is done by a temporary structural substitution at timm's seam: ``blocks[i].attn`` becomes
:class:`ZeroBranch` (zeros of its input's shape) and is put back in a ``finally``. In a timm
``Block`` the attention branch is ``x + drop_path1(ls1(attn(norm1(x))))``; LayerScale multiplies
and DropPath multiplies (and is the identity in eval mode), so a zero branch leaves exactly
``x`` (bit for bit; the tests compare with ``MLPOnlyBlock(scale=1)``). Only timm ``Block``
modules (pre-norm residual) are candidates; ``forward`` is never replaced.

The target is the **pre-logits features** (``forward_head(..., pre_logits=True)``: the final norm's
output pooled as the head sees it, the class token or the mean of the patch tokens, after
``fc_norm``), one row per image. The paper's target is "the final output layer"; everything the
head reads passes through these features (the logits are a linear map of them), they have ``D``
channels where the logits of a 10-class head have 10, and it is where the authors' code measures
its "entropy at last block" (the class token after the final norm).

NOSE, the greedy selection by transfer entropy: :mod:`edge.analysis.nose`.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edge import distributed
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.models.info import model_info, original_block_indices
from edge.progress import bar
from edge.runtime import computing_on

TOKENS = ("patch", "all")


# ---- streamed per-channel statistics ---------------------------------------------------------
@dataclass
class ChannelMoments:
    """Float64 count, mean and sum of squared deviations (``m2``) of every channel of a feature."""

    count: int
    mean: torch.Tensor
    m2: torch.Tensor

    @classmethod
    def zeros(cls, dim: int) -> ChannelMoments:
        return cls(0, torch.zeros(dim, dtype=torch.float64), torch.zeros(dim, dtype=torch.float64))

    def update(self, rows: torch.Tensor) -> None:
        """Add ``rows`` (``[..., D]``): their mean and ``m2`` in float64, merged pairwise (Chan et al.)."""
        x = rows.detach().reshape(-1, rows.shape[-1]).to(torch.float64)
        n = int(x.shape[0])
        if n == 0:
            return
        mean = x.mean(0)
        m2 = ((x - mean) ** 2).sum(0).cpu()   # the moments live on the CPU; the batch's where its rows are
        mean = mean.cpu()
        total = self.count + n
        delta = mean - self.mean
        self.m2 += m2 + delta ** 2 * (self.count * n / total)
        self.mean += delta * (n / total)
        self.count = total

    def all_reduce(self) -> ChannelMoments:
        """Merge every process's moments into these (in place; nothing changes in one process)."""
        self.count, self.mean, self.m2 = distributed.merge_welford(self.count, self.mean, self.m2)
        return self

    def std(self) -> torch.Tensor:
        """Population std per channel (divide by the count)."""
        if self.count < 2:
            raise EdgeError(f"feature statistics of {self.count} row(s)",
                            expected="at least 2 rows for a standard deviation", fix="raise --samples")
        return (self.m2 / self.count).clamp_min(0).sqrt()

    def zero_std_channels(self) -> int:
        return int((self.std() == 0).sum())

    def entropy(self) -> float:
        """``H_sigma = sum_j log std_j`` (Eq. 6); ``-inf`` when a channel does not vary."""
        return float(torch.log(self.std()).sum())


def entropy_of(features: torch.Tensor) -> float:
    """Eq. 6 of features held in memory (``[..., D]``, rows = everything but the last axis)."""
    moments = ChannelMoments.zeros(int(features.shape[-1]))
    moments.update(features)
    return moments.entropy()


def finite(value: float) -> float | None:
    """A JSON-able number: ``None`` for -inf/inf/NaN."""
    return value if math.isfinite(value) else None


# ---- the model's parts -----------------------------------------------------------------------
class ZeroBranch(nn.Module):
    """Stands at ``blocks[i].attn`` while that attention is "identity": the branch adds nothing."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return torch.zeros_like(x)


def attention_blocks(model: nn.Module) -> dict[int, int]:
    """Original block index -> position in ``model.blocks`` of every timm ``Block`` (pre-norm, with attention)."""
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import Block

    return {entry[0]: position for position, (entry, block) in enumerate(zip(original_block_indices(model.blocks),
                                                                             model.blocks))
            if len(entry) == 1 and isinstance(block, Block)}


@contextmanager
def attention_removed(model: nn.Module, positions):
    """Inside: the attention sub-layer of ``model.blocks[p]`` for ``p`` in ``positions`` adds nothing."""
    saved = {p: model.blocks[p].attn for p in positions}
    try:
        for p in saved:
            model.blocks[p].attn = ZeroBranch()
        yield model
    finally:
        for p, attn in saved.items():
            model.blocks[p].attn = attn


def target_features(model: nn.Module, final_tokens: torch.Tensor) -> torch.Tensor:
    """The pre-logits features (``[B, D]``) from the final norm's output."""
    return model.forward_head(final_tokens, pre_logits=True)


def model_preprocess(images, spec: InputSpec):
    return images.preprocess_for(spec)


def _check_tokens(tokens: str) -> None:
    if tokens not in TOKENS:
        raise EdgeError(f"token view {tokens!r}", expected=f"one of {', '.join(TOKENS)}")


# ---- entropy of every sub-layer --------------------------------------------------------------
@dataclass
class SublayerEntropy:
    """Streamed statistics of every attention and MLP sub-layer output and of the target."""

    blocks: list[tuple[int, ...]]            # original blocks of each entry of model.blocks
    attention: dict[int, ChannelMoments]     # position -> moments (only entries with attention)
    mlp: dict[int, ChannelMoments]
    target: ChannelMoments
    tokens: str
    num_prefix_tokens: int
    samples: int = 0

    def all_reduce(self) -> SublayerEntropy:
        """Merge every process's moments and sample count into these (in place)."""
        for moments in (*self.attention.values(), *self.mlp.values(), self.target):
            moments.all_reduce()
        self.samples = distributed.all_reduce_count(self.samples)
        return self

    def rows(self) -> list[dict]:
        out = []
        for position, entry in enumerate(self.blocks):
            row: dict = {"position": position, "blocks": list(entry)}
            for name, moments in (("attention", self.attention.get(position)), ("mlp", self.mlp.get(position))):
                row[name] = None if moments is None else finite(moments.entropy())
                row[f"{name}_zero_std_channels"] = None if moments is None else moments.zero_std_channels()
            out.append(row)
        return out


@contextmanager
def sublayer_outputs(model: nn.Module, on_output):
    """Call ``on_output(kind, position, tensor)`` with every ``ls1`` (attention) / ``ls2`` (MLP) output."""
    handles = []
    for position, block in enumerate(model.blocks):
        for kind, seam, branch in (("attention", "ls1", "attn"), ("mlp", "ls2", "mlp")):
            if hasattr(block, seam) and hasattr(block, branch):
                handles.append(getattr(block, seam).register_forward_hook(
                    lambda _m, _a, out, kind=kind, p=position: on_output(kind, p, out.detach())))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def collect_entropy(model: nn.Module, images, spec: InputSpec, *, tokens: str = "patch", batch_size: int = 64,
                    desc: str = "entropy", device: torch.device | None = None) -> SublayerEntropy:
    """Stream ``images`` through ``model``: float64 per-channel moments of every sub-layer output and the target.

    Under torchrun: this process's share of ``images``, merged over all processes.
    """
    _check_tokens(tokens)
    images = distributed.shard_of(images)
    info = model_info(model)
    dim, prefix = info.embed_dim, info.num_prefix_tokens
    stats = SublayerEntropy(original_block_indices(model.blocks), {}, {}, ChannelMoments.zeros(dim), tokens, prefix)
    for position, block in enumerate(model.blocks):
        if hasattr(block, "ls1") and hasattr(block, "attn"):
            stats.attention[position] = ChannelMoments.zeros(dim)
        if hasattr(block, "ls2") and hasattr(block, "mlp"):
            stats.mlp[position] = ChannelMoments.zeros(dim)
    skip = prefix if tokens == "patch" else 0

    def on_output(kind: str, position: int, out: torch.Tensor) -> None:
        getattr(stats, kind)[position].update(out[:, skip:])

    model.eval()
    with computing_on(model, device) as put, sublayer_outputs(model, on_output), \
            bar(total=len(images), desc=desc, unit="img") as progress:
        for x, _ in images.batches(batch_size, model_preprocess(images, spec)):
            stats.target.update(target_features(model, model.forward_features(put(x))))
            stats.samples += int(x.shape[0])
            progress.update(int(x.shape[0]))
    return stats.all_reduce()


# ---- transfer entropy ---------------------------------------------------------------------
@torch.no_grad()
def transfer_entropy(model: nn.Module, images, spec: InputSpec, removed, *, batch_size: int = 64,
                     device: torch.device | None = None) -> dict:
    """TE (Eq. 7) of the attention sub-layers of original blocks ``removed`` to the pre-logits features.

    The plain definition, one full forward pass per condition (NOSE computes the same numbers from
    cached hidden states); returns ``{"te", "entropy", "target_entropy"}``.
    """
    positions = _positions(model, set(removed))
    dim = model_info(model).embed_dim
    original, without = ChannelMoments.zeros(dim), ChannelMoments.zeros(dim)
    images = distributed.shard_of(images)
    model.eval()
    preprocess = model_preprocess(images, spec)
    with computing_on(model, device) as put:
        for x, _ in images.batches(batch_size, preprocess):
            x = put(x)
            original.update(target_features(model, model.forward_features(x)))
            with attention_removed(model, positions):
                without.update(target_features(model, model.forward_features(x)))
    original.all_reduce()
    without.all_reduce()
    h, h_without = original.entropy(), without.entropy()
    return {"te": h - h_without, "entropy": h_without, "target_entropy": h}


def _positions(model: nn.Module, blocks: set[int]) -> list[int]:
    candidates = attention_blocks(model)
    missing = sorted(blocks - set(candidates))
    if missing:
        raise EdgeError(f"blocks {missing} have no timm attention sub-layer to remove",
                        expected=f"original blocks with one: {sorted(candidates)}")
    return sorted(candidates[b] for b in blocks)


# ---- edge analyze --entropy ---------------------------------------------------------------
def save_entropy_plot(rows: list[dict], title: str, path: Path) -> None:
    """Per block: attention vs MLP sub-layer entropy (the paper's Fig. 1(a))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = ["-".join(map(str, (r["blocks"][0], r["blocks"][-1]) if len(r["blocks"]) > 1 else r["blocks"]))
              for r in rows]
    x = np.arange(len(rows))
    values = {k: np.array([np.nan if r[k] is None else r[k] for r in rows], dtype=float) for k in ("attention", "mlp")}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 3.8), dpi=110, layout="constrained")
    ax.bar(x - 0.2, values["attention"], 0.4, label="attention sub-layer", color="#4c72b0")
    ax.bar(x + 0.2, values["mlp"], 0.4, label="MLP sub-layer", color="#dd8452")
    for kind, offset in (("attention", -0.2), ("mlp", 0.2)):
        for i, r in enumerate(rows):
            if r[kind] is None and r[f"{kind}_zero_std_channels"]:
                ax.text(i + offset, 0, "-inf", ha="center", va="bottom", fontsize=6, color="gray")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlabel("block")
    ax.set_ylabel("H_sigma = sum_j log std_j")
    ax.axhline(0, color="black", lw=0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.savefig(path)
    plt.close(fig)


def short_name(model_name: str) -> str:
    return model_name if len(model_name) <= 40 else model_name[:37] + "..."


def analyze_entropy(model: nn.Module, model_name: str, calibration, spec: InputSpec, out, *, tokens: str = "patch",
                    batch_size: int = 64, device: torch.device | None = None) -> dict:
    """Entropy of every attention and MLP sub-layer: ``out/entropy.json`` and ``out/entropy.png``."""
    from edge import __version__
    from edge.fileio import write_json_atomic
    from edge.runtime import hardware

    out = Path(out)
    start = time.perf_counter()
    stats = collect_entropy(model, calibration, spec, tokens=tokens, batch_size=batch_size, device=device)
    rows = stats.rows()
    result = {"model": model_name, "data": calibration.name, "samples": stats.samples,
              "entropy": "H_sigma = sum over channels of log std (Eq. 6), population std, float64",
              "sublayers": "attention: ls1(attn(norm1(x))), MLP: ls2(mlp(norm2(x))), before the residual add",
              "tokens": tokens, "num_prefix_tokens": stats.num_prefix_tokens,
              "rows_per_sample": "tokens" if tokens == "all" else "patch tokens",
              "target": {"features": "pre-logits (forward_head(pre_logits=True)), one row per image",
                         "entropy": finite(stats.target.entropy())},
              "blocks": rows, "seconds": round(time.perf_counter() - start, 2), "hardware": hardware(device),
              "edge": __version__}
    save_entropy_plot(rows, f"{short_name(model_name)}: sub-layer entropy ({tokens} tokens, {stats.samples} samples)",
                      out / "entropy.png")
    write_json_atomic(result, out / "entropy.json")
    result["pictures"] = {"entropy": "entropy.png"}
    return result
