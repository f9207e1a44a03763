"""What every step of edge's training loop trains on: the seeded epoch order, the augmented global batch.

Epoch ``e`` visits the training set in the order ``randperm(N, seed=(seed, e))``; the augmentation
of step ``s`` draws from a generator seeded with ``(seed, s)``. Every process draws the same global
batch and trains on its rows (:func:`edge.distributed.batch_rows`).
"""

from __future__ import annotations

import torch

from edge import distributed
from edge.data import load_dataset
from edge.data.dataset import ImageSet, epoch_order
from edge.data.images import LabeledImages
from edge.errors import EdgeError

__all__ = ["check_global_batch", "epoch_order", "process_rows", "training_batch", "training_set"]


def training_set(spec: str, samples: int | None, seed: int) -> ImageSet:
    """The train split of ``spec`` (streamed from disk for a folder); a seeded class-balanced subset of
    ``samples`` if given."""
    data = load_dataset(spec, "train")
    if samples:
        from edge.data.sampler import balanced_indices

        data = data.subset(balanced_indices(data.labels, samples, seed, data.num_classes))
    return data


def training_batch(data: LabeledImages, step: int, batch_size: int, seed: int,
                   augment: bool) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(epoch, uint8 images, labels)`` of global step ``step`` of an in-memory set (the seeded epoch order
    and augmentation): :meth:`edge.data.images.LabeledImages.training_batch`."""
    return data.training_batch(step, batch_size, seed, augment)


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
