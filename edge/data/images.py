"""In-memory labelled image sets (Fashion-MNIST and its shipped subset)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class LabeledImages:
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

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(self, indices: torch.Tensor, name: str | None = None) -> LabeledImages:
        return LabeledImages(name or f"{self.name}[{len(indices)}]", self.images[indices],
                             self.labels[indices], self.classes)

    def batches(self, batch_size: int, preprocess: Callable[[torch.Tensor], torch.Tensor],
                indices: torch.Tensor | None = None) -> Iterator[Batch]:
        """Yield ``(model_input, labels)`` batches in order (or in the order of ``indices``)."""
        order = torch.arange(len(self)) if indices is None else indices
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            yield preprocess(self.images[idx]), self.labels[idx]
