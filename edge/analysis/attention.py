"""Attention-map statistics: the pointwise mean and standard deviation of every head's softmax map.

The drop-in depthwise-convolution paper (Scribano et al., Sec. 3.3) scores a head by how little
its attention map ``E^h(X)`` moves across inputs: ``Sigma_h`` is the sum over the map of the
pointwise standard deviation (Eq. 15) and ``Sigma_b`` the mean of ``Sigma_h`` over a block's
heads (Eq. 16). Low scores mark convolution-like (input-invariant) heads.

Maps are read at a timm seam: with the fused kernel switched off (only while capturing), timm's
``Attention`` passes the softmax map through ``attn.attn_drop``, an identity in eval mode, so a
forward hook there sees ``[B, H, N, N]``. Each map is folded into float64 Welford accumulators
(Welford 1962: one sample at a time, the same arithmetic whatever the batch size) inside the
hook, so at most one block's batch of maps is alive at a time and memory stays bounded by
``2 * blocks * H * N * N`` float64 numbers.

Under torchrun each process folds its share of the images (:func:`edge.distributed.shard_of`);
the accumulators are then merged exactly from all-reduced sums (:func:`edge.distributed.merge_welford`)
before any standard deviation is taken.

The standard deviation is the sample one (``n - 1`` in the denominator). Scores are summed over
the patch-to-patch part of the map (what a convolution over the patch grid can stand for);
``all_tokens`` scores include the class/register rows and columns too.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from edge import distributed
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.models.info import model_info
from edge.progress import bar
from edge.runtime import computing_on


@dataclass
class WelfordMap:
    """Running count, mean and sum of squared deviations (``M2``) of one tensor shape, in float64."""

    count: int
    mean: torch.Tensor
    m2: torch.Tensor

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> WelfordMap:
        return cls(0, torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))

    def update(self, samples: torch.Tensor) -> None:
        """Add ``samples`` (``[n, *shape]``) one at a time (Welford's update)."""
        for x in samples.detach().cpu():   # the sums live on the CPU
            x = x.to(torch.float64)   # one sample at a time: no float64 copy of the whole batch
            self.count += 1
            delta = x - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (x - self.mean)

    def all_reduce(self) -> WelfordMap:
        """Merge every process's accumulator into this one (in place; nothing changes in one process)."""
        self.count, self.mean, self.m2 = distributed.merge_welford(self.count, self.mean, self.m2)
        return self

    def std(self) -> torch.Tensor:
        if self.count < 2:
            raise EdgeError(f"attention statistics of {self.count} sample(s)",
                            expected="at least 2 samples for a standard deviation", fix="raise --samples")
        return (self.m2 / (self.count - 1)).clamp_min(0).sqrt()


@dataclass
class AttentionStats:
    """Per block: Welford accumulators of the ``[H, N, N]`` attention maps; ``blocks`` are original indices."""

    blocks: tuple[int, ...]
    maps: list[WelfordMap]
    num_prefix_tokens: int
    grid: tuple[int, int]
    samples: int = 0
    extra: dict = field(default_factory=dict)

    def all_reduce(self) -> AttentionStats:
        """Merge every process's maps and sample count into these (in place)."""
        for welford in self.maps:
            welford.all_reduce()
        self.samples = distributed.all_reduce_count(self.samples)
        return self

    def mean_map(self, block: int) -> torch.Tensor:
        """The mean attention map ``[H, N, N]`` of original block ``block`` (float64)."""
        return self.maps[self.blocks.index(block)].mean

    def std_map(self, block: int) -> torch.Tensor:
        return self.maps[self.blocks.index(block)].std()

    def sigma_head(self, all_tokens: bool = False) -> torch.Tensor:
        """``Sigma_h`` (Eq. 15), ``[blocks, H]``: the summed pointwise std of each head's map."""
        p = 0 if all_tokens else self.num_prefix_tokens
        return torch.stack([w.std()[:, p:, p:].sum((-2, -1)) for w in self.maps])

    def sigma_block(self, all_tokens: bool = False) -> torch.Tensor:
        """``Sigma_b`` (Eq. 16), ``[blocks]``: the mean of ``Sigma_h`` over the block's heads."""
        return self.sigma_head(all_tokens).mean(1)

    def scores(self) -> dict:
        return {"blocks": list(self.blocks), "samples": self.samples, "grid": list(self.grid),
                "num_prefix_tokens": self.num_prefix_tokens, "std": "sample (n - 1)",
                "sigma_head": self.sigma_head().tolist(), "sigma_block": self.sigma_block().tolist(),
                "all_tokens": {"sigma_head": self.sigma_head(True).tolist(),
                               "sigma_block": self.sigma_block(True).tolist()}}


def attention_modules(model: nn.Module) -> dict[int, nn.Module]:
    """Original block index -> timm ``Attention`` whose softmax map can be captured (``attn_drop`` seam)."""
    from edge.models.info import original_block_indices

    out = {}
    for entry, block in zip(original_block_indices(model.blocks), model.blocks):
        attn = getattr(block, "attn", None)
        if len(entry) == 1 and attn is not None and hasattr(attn, "qkv") and hasattr(attn, "attn_drop") \
                and hasattr(attn, "fused_attn"):
            out[entry[0]] = attn
    return out


@contextmanager
def attention_maps(modules: dict[int, nn.Module], on_map):
    """Call ``on_map(block, maps)`` with every ``[B, H, N, N]`` softmax map; fused attention off inside."""
    saved = {b: m.fused_attn for b, m in modules.items()}
    handles = []
    for b, module in modules.items():
        module.fused_attn = False
        handles.append(module.attn_drop.register_forward_hook(lambda _m, _a, out, b=b: on_map(b, out.detach())))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for b, module in modules.items():
            module.fused_attn = saved[b]


@torch.no_grad()
def collect_attention_stats(model: nn.Module, images, spec: InputSpec, *, blocks: tuple[int, ...] | None = None,
                            batch_size: int = 32, desc: str = "attention statistics",
                            device: torch.device | None = None) -> AttentionStats:
    """Stream ``images`` through ``model``; Welford mean/std of every head's attention map, per block.

    Under torchrun: this process's share of ``images``, merged over all processes.
    """
    info = model_info(model)
    images = distributed.shard_of(images)
    modules = attention_modules(model)
    if blocks is not None:
        missing = [b for b in blocks if b not in modules]
        if missing:
            raise EdgeError(f"blocks {missing} have no attention to analyze",
                            expected=f"original blocks with timm attention: {sorted(modules)}")
        modules = {b: modules[b] for b in blocks}
    if not modules:
        raise EdgeError("the model has no timm attention blocks to analyze",
                        expected="a timm VisionTransformer with Attention modules")
    order = tuple(sorted(modules))
    n = info.num_tokens
    stats = AttentionStats(order, [WelfordMap.zeros((modules[b].num_heads, n, n)) for b in order],
                           info.num_prefix_tokens, info.grid)
    index = {b: i for i, b in enumerate(order)}
    model.eval()
    preprocess = images.preprocess_for(spec)
    with computing_on(model, device) as put, \
            attention_maps(modules, lambda b, maps: stats.maps[index[b]].update(maps)), \
            bar(total=len(images), desc=desc, unit="img") as progress:
        for x, _ in images.batches(batch_size, preprocess):
            model.forward_features(put(x))
            stats.samples += int(x.shape[0])
            progress.update(int(x.shape[0]))
    return stats.all_reduce()


def save_attention_plot(stats: AttentionStats, title: str, path) -> None:
    """Sigma_b per block (bars) beside Sigma_h per head (heatmap, blocks x heads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    heads = stats.sigma_head().numpy()
    block = heads.mean(1)
    labels = [str(b) for b in stats.blocks]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110, layout="constrained")
    order = np.argsort(block)
    colors = ["tab:green" if i in order[: max(1, len(block) // 2)] else "tab:gray" for i in range(len(block))]
    left.bar(range(len(block)), block, color=colors)
    left.set_xticks(range(len(block)), labels, fontsize=8)
    left.set_xlabel("block")
    left.set_ylabel("Sigma_b (mean over heads of summed std)")
    left.set_title("block score (green: lowest half)", fontsize=10)
    image = right.imshow(heads.T, cmap="viridis", aspect="auto", origin="lower")
    right.set_xticks(range(len(block)), labels, fontsize=8)
    right.set_xlabel("block")
    right.set_yticks(range(heads.shape[1]), [str(h) for h in range(heads.shape[1])], fontsize=8)
    right.set_ylabel("head")
    right.set_title("Sigma_h per head", fontsize=10)
    fig.colorbar(image, ax=right, label="summed pointwise std")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path)
    plt.close(fig)


def analyze_attention(model: nn.Module, model_name: str, calibration, spec: InputSpec, out,
                      batch_size: int = 32, device: torch.device | None = None) -> dict:
    """Score every head over ``calibration``; write ``out/attention.json`` and ``out/attention_std.png``."""
    import time
    from pathlib import Path

    from edge import __version__
    from edge.fileio import write_json_atomic
    from edge.runtime import hardware

    out = Path(out)
    start = time.perf_counter()
    stats = collect_attention_stats(model, calibration, spec, batch_size=batch_size, device=device)
    result = {"model": model_name, "data": calibration.name, **stats.scores(),
              "seconds": round(time.perf_counter() - start, 2), "hardware": hardware(device), "edge": __version__}
    short = model_name if len(model_name) <= 40 else model_name[:37] + "..."
    save_attention_plot(stats, f"{short}: attention-map variation ({stats.samples} samples)",
                        out / "attention_std.png")
    write_json_atomic(result, out / "attention.json")
    result["pictures"] = {"attention_std": "attention_std.png"}
    return result
