"""Data: Fashion-MNIST (full or shipped subset), users' ImageFolders, calibration sampling.

``load_dataset(spec, split)`` resolves what ``--data`` names:

* ``fmnist``       the full set (Debian's ``dataset-fashion-mnist`` or ``$EDGE_FMNIST_DIR``)
* ``fmnist-mini``  the subset shipped inside the package (1,000 train / 2,000 test)
* a folder         with MNIST-style IDX files, or an ImageFolder (one sub-folder per class,
                   optionally under ``train/`` and ``val/`` or ``test/``)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from edge.data.dataset import ImageSet, TrainingStream
from edge.data.fmnist import CLASSES as FMNIST_CLASSES
from edge.data.fmnist import MEAN as FMNIST_MEAN
from edge.data.fmnist import STD as FMNIST_STD
from edge.data.fmnist import is_idx_folder, load_fmnist, load_fmnist_mini
from edge.data.images import LabeledImages
from edge.data.preprocess import ArrayPreprocess, InputSpec
from edge.data.sampler import balanced_indices
from edge.errors import EdgeError

__all__ = ["FMNIST_CLASSES", "FMNIST_MEAN", "FMNIST_STD", "ArrayPreprocess", "ImageSet", "InputSpec",
           "LabeledImages", "TrainingStream", "balanced_indices", "calibration_set", "holdout_set", "load_dataset"]

NAMED = ("fmnist", "fmnist-mini")


def _image_folder():
    from edge.data.imagefolder import ImageFolderDataset

    return ImageFolderDataset


def load_dataset(spec: str, split: str = "test") -> ImageSet:
    """Load the ``split`` (``train`` or ``test``) of the data set that ``spec`` names."""
    if spec == "fmnist":
        return load_fmnist(split)
    if spec == "fmnist-mini":
        return load_fmnist_mini(split)
    folder = Path(spec).expanduser()
    if not folder.exists():
        raise EdgeError(f"--data {spec!r} is neither a known data set nor an existing folder",
                        expected=f"one of {', '.join(NAMED)}, or a folder (IDX files or ImageFolder)",
                        fix="check the spelling or the path")
    if folder.is_dir() and is_idx_folder(folder):
        return load_fmnist(split, folder)
    if folder.is_dir():
        return _image_folder().from_root(folder, split)
    raise EdgeError(f"--data {spec!r} is a file", expected="a folder or a named data set")


def calibration_set(spec: str, n: int, seed: int = 0, split: str = "train") -> ImageSet:
    """The seeded, class-balanced calibration samples every compression method uses; all of the split (in the
    seeded order, said once on stderr) when it holds no more than ``n``."""
    data = load_dataset(spec, split)
    if n >= len(data):
        if n > len(data):
            print(f"note: {n} samples asked for, {data.name} holds {len(data)}: using all {len(data)}",
                  file=sys.stderr)
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
        return data.subset(order, f"{data.name}:calib{len(data)}@{seed}")
    return data.subset(balanced_indices(data.labels, n, seed, data.num_classes), f"{data.name}:calib{n}@{seed}")


def holdout_set(spec: str, n: int, seed: int = 0, calibration: int = 0, split: str = "train"):
    """``n`` seeded, class-balanced samples of ``split`` that are not among ``calibration_set(spec,
    calibration, seed)``: what a choice fitted on the calibration samples is scored on."""
    data = load_dataset(spec, split)
    taken = torch.zeros(len(data.labels), dtype=torch.bool)
    if calibration:
        taken[balanced_indices(data.labels, calibration, seed, data.num_classes)] = True
    free = torch.nonzero(~taken).flatten()
    if n > len(free):
        raise EdgeError(f"{n} held-out samples asked for, but {spec} {split} holds {len(free)} beside the "
                        f"{calibration} calibration samples", expected=f"N <= {len(free)}",
                        fix="lower the held-out or calibration sample count, or use a larger data set")
    picked = free[balanced_indices(data.labels[free], n, seed + 1, data.num_classes)]
    return data.subset(picked, f"{data.name}:holdout{n}@{seed}")
