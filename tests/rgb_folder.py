"""A user's own images, made up: an RGB JPEG ImageFolder with ``train/`` and ``val/`` splits.

Each class is a colour and a stripe direction, drawn with seeded noise, so that a model can learn the
classes in a few steps and a wrong label mapping shows. Nothing here reads Fashion-MNIST: the tests of
the user's path make the bundled data unreadable while they run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

CLASSES = tuple(f"class_{i:02d}" for i in range(10))


def class_image(label: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """One ``size`` x ``size`` RGB uint8 image of class ``label``: its hue, its stripes' angle, noise."""
    hue = label / len(CLASSES) * 2 * math.pi
    colour = 127 + 100 * np.array([math.cos(hue), math.cos(hue + 2.1), math.cos(hue + 4.2)])
    yy, xx = np.mgrid[0:size, 0:size] / size
    angle = label * math.pi / len(CLASSES)
    stripes = np.sin(2 * math.pi * 4 * (xx * math.cos(angle) + yy * math.sin(angle)) + rng.uniform(0, 6.3))
    image = colour[None, None, :] * (0.75 + 0.25 * stripes[..., None]) + rng.normal(0, 12, (size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def make_rgb_folder(root: Path, train: int = 24, val: int = 12, size: int = 64, seed: int = 0,
                    classes: int = 10, splits: tuple[str, ...] = ("train", "val")) -> Path:
    """``root/<split>/<class>/<i>.jpg``: ``train`` and ``val`` images per class (JPEG, RGB, ``size`` px)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    counts = {"train": train, "val": val, "test": val}
    for split in splits:
        for label in range(classes):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(counts[split]):
                Image.fromarray(class_image(label, rng, size)).save(folder / f"{i:04d}.jpg", quality=90)
    return root


if __name__ == "__main__":  # python -m tests.rgb_folder DIR [TRAIN VAL SIZE]
    import sys

    args = sys.argv[1:]
    make_rgb_folder(Path(args[0]), *(int(a) for a in args[1:4]))
