"""What every step of edge's training loop trains on: the seeded epoch order, the augmented global batch.

Epoch ``e`` visits the training set in the order ``randperm(N, seed=(seed, e))``; the augmentation
of step ``s`` draws from a generator seeded with ``(seed, s)``. Every process draws the same global
batch and trains on its rows (:func:`edge.distributed.batch_rows`).
"""

from __future__ import annotations

import math

import torch

from edge import distributed
from edge.data import load_dataset
from edge.data.augment import random_shift_flip
from edge.data.images import LabeledImages
from edge.errors import EdgeError


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def training_set(spec: str, samples: int | None, seed: int) -> LabeledImages:
    """The train split of ``spec`` in memory; a seeded class-balanced subset of ``samples`` if given."""
    data = load_dataset(spec, "train")
    if not isinstance(data, LabeledImages):
        data = data.to_memory()
    if samples:
        from edge.data.sampler import balanced_indices

        data = data.subset(balanced_indices(data.labels, samples, seed, data.num_classes))
    return data


def training_batch(data: LabeledImages, step: int, batch_size: int, seed: int,
                   augment: bool) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(epoch, uint8 images, labels)`` of global step ``step``: the seeded epoch order and augmentation."""
    steps_per_epoch = math.ceil(len(data) / batch_size)
    epoch, offset = divmod(step, steps_per_epoch)
    order = epoch_order(len(data), seed, epoch)
    start = offset * batch_size
    idx = order[start:start + batch_size]
    images = data.images[idx]
    if augment:
        images = random_shift_flip(images, torch.Generator().manual_seed(seed * 1_000_003 + step))
    return epoch, images, data.labels[idx]


def check_global_batch(samples: int, batch_size: int) -> None:
    """Refuse a global batch (or an epoch's last, partial one) with fewer images than processes."""
    processes = distributed.world_size()
    smallest = min(batch_size, samples % batch_size or batch_size)
    if smallest < processes:
        raise EdgeError(f"a global batch of {smallest} image(s) cannot be split over {processes} processes "
                        f"({samples} training images, --batch-size {batch_size})",
                        expected=f"every batch of the epoch to have at least {processes} images, one per process",
                        fix=f"raise --batch-size to at least {processes} or change --train-samples so that the "
                            "last batch of an epoch is not that small")


def process_rows(labels: torch.Tensor) -> tuple[slice, float]:
    """This process's rows of a global batch and their share of it (1.0 in one process)."""
    rows = distributed.batch_rows(len(labels))
    return rows, (rows.stop - rows.start) / len(labels)
