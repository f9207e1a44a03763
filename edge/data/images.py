"""In-memory labelled image sets (Fashion-MNIST, its shipped subset, an IDX folder)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from edge.data.augment import random_shift_flip
from edge.data.dataset import Batch, ImageSet, TrainingStream, global_batch, step_seed
from edge.data.preprocess import ArrayPreprocess, InputSpec


@dataclass(frozen=True)
class LabeledImages(ImageSet):
    """Images held as uint8 tensors ``[N, H, W]`` (gray) or ``[N, C, H, W]``, with int64 labels."""

    name: str
    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim not in (3, 4):
            raise ValueError(f"{self.name}: images must be uint8 [N,H,W] or [N,C,H,W], got "
                             f"{self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"{self.name}: {self.images.shape[0]} images but labels of shape "
                             f"{tuple(self.labels.shape)}")

    def subset(self, indices: torch.Tensor, name: str | None = None) -> LabeledImages:
        return LabeledImages(name or f"{self.name}[{len(indices)}]", self.images[indices],
                             self.labels[indices], self.classes)

    def preprocess_for(self, spec: InputSpec) -> ArrayPreprocess:
        return ArrayPreprocess(spec)

    def batches(self, batch_size: int, preprocess: Callable[[torch.Tensor], torch.Tensor],
                indices: torch.Tensor | None = None) -> Iterator[Batch]:
        """Yield ``(model_input, labels)`` batches in order (or in the order of ``indices``)."""
        order = torch.arange(len(self)) if indices is None else indices
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            yield preprocess(self.images[idx]), self.labels[idx]

    def training_batch(self, step: int, batch_size: int, seed: int,
                       augment: bool) -> tuple[int, torch.Tensor, torch.Tensor]:
        """``(epoch, uint8 images, labels)`` of global step ``step``: the seeded epoch order and augmentation
        (a random shift of up to 2 pixels and a horizontal flip, seeded by the step)."""
        epoch, idx = global_batch(len(self), step, batch_size, seed)
        images = self.images[idx]
        if augment:
            images = random_shift_flip(images, torch.Generator().manual_seed(step_seed(seed, step)))
        return epoch, images, self.labels[idx]

    def training_batches(self, spec: InputSpec, stream: TrainingStream):
        preprocess = ArrayPreprocess(spec)
        for step in range(stream.start, stream.stop):
            epoch, images, labels = self.training_batch(step, stream.batch_size, stream.seed, stream.augment)
            rows = stream.rows(len(labels))
            yield epoch, preprocess(images[rows]), labels[rows], (rows.stop - rows.start) / len(labels)

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.images.contiguous().numpy().tobytes())
        digest.update(self.labels.contiguous().numpy().tobytes())
        return digest.hexdigest()
