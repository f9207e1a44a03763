"""Run a model over calibration images and stream block representations into moments.

Representations are read at timm's seams with hooks (never by replacing ``forward``):
index 0 is the input of ``blocks[0]`` (the embedding output, "block -1" in plans) and
index ``b + 1`` is the output of ``blocks[b]``. Three token views are kept apart:

* ``prefix``: the class and register tokens,
* ``patch``:  the patch tokens,
* ``pooled``: one row per image, the class token (or the mean of the patch tokens for
  models without one, which is what their ``global_pool='avg'`` head sees).

The all-token view is ``prefix`` merged with ``patch``.

Under torchrun each process streams its share of the images (:func:`edge.distributed.shard_of`)
and the float64 sums are added over the processes before they are returned: every process gets
the moments of the whole set.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from edge import distributed
from edge.analysis.moments import PairMoments
from edge.data.preprocess import InputSpec
from edge.models.info import ModelInfo, model_info
from edge.progress import bar
from edge.runtime import computing_on


@dataclass
class BlockMoments:
    """Streamed statistics of every block representation, per token view."""

    prefix: PairMoments
    patch: PairMoments
    pooled: PairMoments
    samples: int

    def view(self, name: str) -> PairMoments:
        if name == "all":
            return self.patch.merge(self.prefix) if self.prefix.count else self.patch
        if name in ("cls", "pooled"):
            return self.pooled
        return {"prefix": self.prefix, "patch": self.patch}[name]

    def all_reduce(self) -> BlockMoments:
        """Sum every process's moments into these (in place; nothing changes in one process)."""
        for view in (self.prefix, self.patch, self.pooled):
            view.all_reduce()
        self.samples = distributed.all_reduce_count(self.samples)
        return self


@contextmanager
def block_outputs(model: nn.Module):
    """Yield a list that fills with ``[B, T, D]`` tensors: blocks[0] input, then every block's output."""
    captured: list[torch.Tensor] = []
    handles = [model.blocks[0].register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))]
    for block in model.blocks:
        handles.append(block.register_forward_hook(lambda _m, _a, out: captured.append(out.detach())))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def pooled_token(tokens: torch.Tensor, info: ModelInfo) -> torch.Tensor:
    if info.has_class_token:
        return tokens[:, 0]
    return tokens[:, info.num_prefix_tokens:].mean(1)


@torch.no_grad()
def collect_block_moments(model: nn.Module, images, spec: InputSpec, *, batch_size: int = 64,
                          desc: str = "analyze", device: torch.device | None = None) -> BlockMoments:
    """Stream the representations of ``images`` (a data set) through the model into float64 moments (the
    passes on ``device``, the moments on the CPU: :func:`edge.runtime.computing_on`).

    Under torchrun: this process's share of ``images``, summed over all processes.
    """
    info = model_info(model)
    images = distributed.shard_of(images)
    reps, dim, prefix = info.num_blocks + 1, info.embed_dim, info.num_prefix_tokens
    moments = BlockMoments(PairMoments.zeros(reps, dim), PairMoments.zeros(reps, dim),
                           PairMoments.zeros(reps, dim), 0)
    preprocess = images.preprocess_for(spec)
    model.eval()
    with computing_on(model, device) as put, block_outputs(model) as captured, \
            bar(total=len(images), desc=desc, unit="img") as progress:
        for x, _ in images.batches(batch_size, preprocess):
            captured.clear()
            model.forward_features(put(x))
            n = x.shape[0]
            if prefix:
                moments.prefix.update([t[:, :prefix] for t in captured], images=n)
            moments.patch.update([t[:, prefix:] for t in captured], images=n)
            moments.pooled.update([pooled_token(t, info) for t in captured], images=n)
            moments.samples += n
            progress.update(n)
    return moments.all_reduce()
