"""Fashion-MNIST: the full set from Debian's package (or a folder), and the shipped subset."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from edge.data.idx import read_idx
from edge.data.images import LabeledImages
from edge.errors import EdgeError

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# Per-pixel statistics of the 60,000 training images (scaled to [0, 1]).
MEAN = (0.2860,)
STD = (0.3530,)

NAME, MINI_NAME = "fmnist", "fmnist-mini"   # what --data calls the full set and the shipped subset
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
MINI_DIR = Path(__file__).with_name("fmnist_mini")
SPLITS = {"train": "train", "test": "t10k"}
FULL_SIZES = {"train": 60000, "test": 10000}

INSTALL_HINT = ("install Debian's package: apt-get install dataset-fashion-mnist; or pass --data DIR "
                "(a folder with the four IDX files, or set EDGE_FMNIST_DIR); or use --data fmnist-mini, "
                "the 3,000-image subset shipped with edge")


def _idx_path(folder: Path, prefix: str, kind: str) -> Path | None:
    for name in (f"{prefix}-{kind}", f"{prefix}-{kind}".replace("-idx", ".idx")):
        for suffix in (".gz", ""):
            candidate = folder / f"{name}{suffix}"
            if candidate.exists():
                return candidate
    return None


def is_idx_folder(folder: Path) -> bool:
    return _idx_path(folder, "t10k", "images-idx3-ubyte") is not None or \
        _idx_path(folder, "train", "images-idx3-ubyte") is not None


def find_fmnist_dir() -> Path:
    """The folder of the full set: $EDGE_FMNIST_DIR, else Debian's package location."""
    env = os.environ.get("EDGE_FMNIST_DIR")
    folder = Path(env) if env else DEBIAN_DIR
    if not is_idx_folder(folder):
        where = f"EDGE_FMNIST_DIR={env}" if env else str(DEBIAN_DIR)
        raise EdgeError(f"Fashion-MNIST was not found in {where}",
                        expected="t10k-images-idx3-ubyte.gz and the other three IDX files",
                        fix=INSTALL_HINT)
    return folder


def load_idx_split(folder: Path, split: str, name: str, expected_size: int | None = None) -> LabeledImages:
    """Load one split (``train`` or ``test``) of an MNIST-style IDX folder."""
    if split not in SPLITS:
        raise EdgeError(f"unknown split {split!r}", expected="train or test")
    prefix = SPLITS[split]
    images_path = _idx_path(folder, prefix, "images-idx3-ubyte")
    labels_path = _idx_path(folder, prefix, "labels-idx1-ubyte")
    if images_path is None or labels_path is None:
        raise EdgeError(f"the {split} split of {name} is missing in {folder}",
                        expected=f"{prefix}-images-idx3-ubyte[.gz] and {prefix}-labels-idx1-ubyte[.gz]",
                        fix=INSTALL_HINT)
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise EdgeError(f"{images_path.name} and {labels_path.name} disagree on the number of samples",
                        expected="as many labels as images",
                        found=f"{images.shape[0]} images, {labels.shape[0]} labels",
                        fix="one of the files is from another data set or truncated: reinstall the data set")
    if expected_size is not None and images.shape[0] != expected_size:
        raise EdgeError(f"{images_path} holds {images.shape[0]} images",
                        expected=f"{expected_size} for the {split} split of {name}",
                        fix="reinstall the data set (apt-get install --reinstall dataset-fashion-mnist)")
    if labels.size and int(labels.max()) >= len(CLASSES):
        raise EdgeError(f"{labels_path} has label {int(labels.max())}", expected=f"labels 0..{len(CLASSES) - 1}")
    return LabeledImages(f"{name}:{split}", torch.from_numpy(images), torch.from_numpy(labels.astype("int64")),
                         CLASSES)


def load_fmnist(split: str, folder: Path | None = None) -> LabeledImages:
    """The full Fashion-MNIST split (60,000 train / 10,000 test)."""
    if folder is None:
        return load_idx_split(find_fmnist_dir(), split, "fmnist", FULL_SIZES.get(split))
    return load_idx_split(folder, split, str(folder))


def load_fmnist_mini(split: str) -> LabeledImages:
    """The subset shipped inside the package (1,000 train / 2,000 test, class-balanced)."""
    return load_idx_split(MINI_DIR, split, "fmnist-mini")
