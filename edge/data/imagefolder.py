"""Users' own images: an ImageFolder (one sub-folder per class) read with the model's preprocessing.

The model's timm data config decides resizing, centre crop, mean and std (timm's own eval
transform), so a folder of JPEGs is evaluated the way the model was trained to see them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from edge.data.preprocess import InputSpec
from edge.errors import EdgeError

EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
SPLIT_FOLDERS = {"train": ("train",), "test": ("test", "val", "validation")}


@dataclass(frozen=True)
class ImageFolderDataset:
    name: str
    paths: tuple[Path, ...]
    labels: torch.Tensor
    classes: tuple[str, ...]

    @classmethod
    def from_root(cls, root: Path, split: str = "test") -> ImageFolderDataset:
        """``root/<split>/<class>/*`` if such a split folder exists, else ``root/<class>/*``."""
        folder = next((root / s for s in SPLIT_FOLDERS.get(split, (split,)) if (root / s).is_dir()), root)
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not classes:
            raise EdgeError(f"--data {root} has no class folders",
                            expected=f"{root}/<class>/<image> or {root}/{split}/<class>/<image>",
                            fix="arrange the images in one sub-folder per class")
        paths, labels = [], []
        for index, name in enumerate(classes):
            files = sorted(p for p in (folder / name).rglob("*") if p.suffix.lower() in EXTENSIONS)
            paths += files
            labels += [index] * len(files)
        if not paths:
            raise EdgeError(f"--data {folder} has class folders but no images",
                            expected=f"files ending in {', '.join(sorted(EXTENSIONS))}")
        return cls(f"{folder}", tuple(paths), torch.tensor(labels, dtype=torch.int64), tuple(classes))

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(self, indices: torch.Tensor, name: str | None = None) -> ImageFolderDataset:
        idx = indices.tolist()
        return ImageFolderDataset(name or f"{self.name}[{len(idx)}]", tuple(self.paths[i] for i in idx),
                                  self.labels[indices], self.classes)

    def preprocess_for(self, spec: InputSpec) -> Callable[[Path], torch.Tensor]:
        """timm's eval transform for the model's data config, applied to one image file."""
        from edge._compat import ensure_torchvision_importable

        ensure_torchvision_importable()
        from PIL import Image
        from timm.data import create_transform

        mean, std = spec.normalisation()
        transform = create_transform(input_size=(spec.channels, spec.height, spec.width), is_training=False,
                                     mean=mean, std=std, interpolation=spec.interpolation, crop_pct=spec.crop_pct)
        mode = "L" if spec.channels == 1 else "RGB"

        def load(path: Path) -> torch.Tensor:
            try:
                with Image.open(path) as image:
                    return transform(image.convert(mode))
            except OSError as e:
                raise EdgeError(f"image {path} cannot be read", found=str(e),
                                fix="remove or replace the file") from e

        return load

    def batches(self, batch_size: int, preprocess: Callable[[Path], torch.Tensor],
                indices: torch.Tensor | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = list(range(len(self))) if indices is None else indices.tolist()
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            yield torch.stack([preprocess(self.paths[i]) for i in idx]), self.labels[idx]

    def to_memory(self):
        raise EdgeError(f"edge train reads in-memory image sets; {self.name} is an ImageFolder",
                        fix="train on fmnist / an IDX folder, or fine-tune with your own script and pass --weights")
