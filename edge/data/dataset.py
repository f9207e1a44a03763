"""The one data-set type every verb reads images through: :class:`ImageSet`.

Two kinds exist: images held in memory as uint8 tensors (Fashion-MNIST, an IDX folder:
:class:`edge.data.images.LabeledImages`) and a user's folder of image files read from disk as they are
needed (:class:`edge.data.imagefolder.ImageFolderDataset`). Both give

* ``labels``, ``classes``, ``subset(indices)``: what the seeded class-balanced samplers pick from;
* ``preprocess_for(spec)`` and ``batches(batch_size, preprocess)``: images as the model takes them
  (the model's timm data config: size, mean, std), in order, for evaluation, calibration and statistics;
* ``inputs(spec, count)``: the first ``count`` of those as one tensor (small checks: gates, ranges);
* ``training_batches(...)``: this process's rows of each seeded global training batch from a given
  step on, augmented, preprocessed (streamed from disk with workers for a folder);
* ``fingerprint()``: what identifies the images, for caches.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from edge.data.preprocess import InputSpec

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class TrainingStream:
    """How training draws its batches: the global batch, the seed, augmentation, where to start, this
    process's rows of a global batch (``rows(n)``), data-loading workers and pinned memory (CUDA)."""

    batch_size: int
    seed: int
    augment: bool
    start: int
    stop: int
    rows: Callable[[int], slice]
    workers: int | None = None        # None: edge.data.imagefolder.loader_workers decides
    pin_memory: bool = False


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The seeded order epoch ``epoch`` visits ``n`` training images in."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def step_seed(seed: int, step: int) -> int:
    """The seed of global step ``step``'s augmentation."""
    return seed * 1_000_003 + step


def global_batch(n: int, step: int, batch_size: int, seed: int) -> tuple[int, torch.Tensor]:
    """``(epoch, indices)`` of global step ``step``: its slice of the seeded epoch order."""
    steps_per_epoch = math.ceil(n / batch_size)
    epoch, offset = divmod(step, steps_per_epoch)
    order = epoch_order(n, seed, epoch)
    return epoch, order[offset * batch_size:(offset + 1) * batch_size]


class ImageSet(ABC):
    """A labelled set of images (see the module's text); subclasses are frozen dataclasses."""

    name: str
    labels: torch.Tensor
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @abstractmethod
    def subset(self, indices: torch.Tensor, name: str | None = None) -> ImageSet:
        """The images at ``indices``, in that order."""

    @abstractmethod
    def preprocess_for(self, spec: InputSpec) -> Callable:
        """What :meth:`batches` applies to stored images to make the model's input (evaluation transform)."""

    @abstractmethod
    def batches(self, batch_size: int, preprocess: Callable,
                indices: torch.Tensor | None = None) -> Iterator[Batch]:
        """``(model_input, labels)`` batches in order (or in the order of ``indices``)."""

    @abstractmethod
    def training_batches(self, spec: InputSpec, stream: TrainingStream) -> Iterator[tuple[int, torch.Tensor,
                                                                                          torch.Tensor, float]]:
        """For each step from ``stream.start`` to ``stream.stop``: ``(epoch, x, y, share)``, this process's rows
        ``x, y`` of the step's seeded global batch, preprocessed (augmented if ``stream.augment``), and their share
        of the global batch."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A sha256 (hex) that changes when the images or labels do (a cache key's part)."""

    def eval_batches(self, spec: InputSpec, batch_size: int, indices: torch.Tensor | None = None) -> Iterator[Batch]:
        """:meth:`batches` with the model's evaluation preprocessing."""
        return self.batches(batch_size, self.preprocess_for(spec), indices)

    def inputs(self, spec: InputSpec, count: int | None = None, batch_size: int = 64) -> torch.Tensor:
        """The first ``count`` images (all: None) as one float tensor ``[N, C, H, W]`` the model takes."""
        count = len(self) if count is None else min(count, len(self))
        parts = [x for x, _ in self.eval_batches(spec, batch_size, torch.arange(count))]
        return torch.cat(parts) if parts else torch.empty(0, spec.channels, spec.height, spec.width)
