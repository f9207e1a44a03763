"""Users' own images: an ImageFolder (one sub-folder per class), streamed from disk with timm's transforms.

The model's timm data config decides resizing, centre crop, mean and std: evaluation uses timm's eval
transform (resize, centre crop), training timm's training transform (``create_transform(is_training=True)``:
random resized crop, flip, colour jitter). Files are decoded in ``torch.utils.data.DataLoader`` workers
(:func:`loader_workers`), in a fixed order for evaluation and in the seeded order of each training step,
each image's augmentation seeded by the step and the image, so that workers, resuming at a step and the
rows each process of a ``torchrun`` reads change nothing.

Stated behaviours:

* classes are the sub-folders' names, sorted; files ending in one of :data:`EXTENSIONS` in a class
  folder (and below it) are its images; grey, RGBA or palette images are converted to the model's channels;
* ``train/`` is the training split and ``val/``, ``validation/`` or ``test/`` the test split; a folder
  without split folders is used as it is for every split, and says so once (``note: ...``);
* an image that cannot be decoded stops the work with an error naming the file (nothing is skipped
  silently): remove or replace it.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from edge.data.dataset import Batch, ImageSet, TrainingStream, epoch_order, step_seed
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError

EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}
SPLIT_FOLDERS = {"train": ("train",), "test": ("val", "validation", "test")}
_NOTED: set[str] = set()


def loader_workers(images: int, batch_size: int) -> int:
    """Data-loading worker processes: ``$EDGE_DATA_WORKERS`` if set, else none for a single batch (starting
    workers costs more than it saves), else up to 4, one core left to the model."""
    env = os.environ.get("EDGE_DATA_WORKERS")
    if env is not None:
        try:
            return max(0, int(env))
        except ValueError as e:
            raise EdgeError(f"EDGE_DATA_WORKERS={env!r}", expected="a whole number of worker processes, 0: none",
                            fix="set EDGE_DATA_WORKERS=2, or unset it") from e
    if images <= batch_size:
        return 0
    return max(1, min(4, (os.cpu_count() or 2) - 1))


class FolderTransform:
    """A file -> the model's input tensor: timm's eval or training transform for ``spec`` (picklable: it goes
    to the loader's workers, where timm's transform is built once)."""

    def __init__(self, spec: InputSpec, training: bool = False) -> None:
        self.spec, self.training = spec, training
        self._transform = None

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "training": self.training, "_transform": None}

    def transform(self):
        if self._transform is None:
            from edge._compat import ensure_torchvision_importable

            ensure_torchvision_importable()
            from timm.data import create_transform

            spec = self.spec
            mean, std = spec.normalisation()
            options = dict(crop_pct=spec.crop_pct) if not self.training else {}
            self._transform = create_transform(input_size=(spec.channels, spec.height, spec.width),
                                               is_training=self.training, mean=mean, std=std,
                                               interpolation=spec.interpolation, **options)
        return self._transform

    def __call__(self, path: Path) -> torch.Tensor:
        from PIL import Image

        with Image.open(path) as image:
            return self.transform()(image.convert("L" if self.spec.channels == 1 else "RGB"))


class _Files(torch.utils.data.Dataset):
    """Keys -> ``(tensor, label, error)``, ``error`` None or ``(path, what the decoder said)``: ``key`` an index,
    or ``(index, seed)`` to seed the transform's random draws (Python's, NumPy's and torch's, restored after) for
    that one image."""

    def __init__(self, paths: Sequence[Path], labels: torch.Tensor, transform: FolderTransform) -> None:
        self.paths, self.labels, self.transform = paths, labels, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key):
        index, seed = key if isinstance(key, tuple) else (key, None)
        path = self.paths[index]
        try:
            if seed is None:
                x = self.transform(path)
            else:
                x = _seeded(lambda: self.transform(path), seed)
            return x, int(self.labels[index]), None
        except (OSError, ValueError, SyntaxError) as e:  # PIL raises these for a file it cannot decode
            spec = self.transform.spec
            return torch.zeros(spec.channels, spec.height, spec.width), -1, (str(path), str(e))


def _seeded(work, seed: int):
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return work()
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def _collate(items):
    xs, ys, errors = zip(*items)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.int64), [e for e in errors if e is not None]


def _checked(batch) -> Batch:
    x, y, errors = batch
    if errors:
        path, said = errors[0]
        raise EdgeError(f"image {path} cannot be read", found=said,
                        fix="remove or replace the file (edge stops at an unreadable image rather than skip it)")
    return x, y


@dataclass(frozen=True)
class ImageFolderDataset(ImageSet):
    name: str
    paths: tuple[Path, ...]
    labels: torch.Tensor
    classes: tuple[str, ...]

    @classmethod
    def from_root(cls, root: Path, split: str = "test") -> ImageFolderDataset:
        """``root/<split>/<class>/*`` if such a split folder exists, else ``root/<class>/*`` (noted once)."""
        candidates = SPLIT_FOLDERS.get(split, (split,))
        folder = next((root / s for s in candidates if (root / s).is_dir()), None)
        if folder is None:
            folder = root
            if str(root) not in _NOTED:
                _NOTED.add(str(root))
                print(f"note: {root} has no {' or '.join(c + '/' for c in candidates)} folder: its images serve as "
                      f"the {split} split (and as every other split asked for)", file=sys.stderr)
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not classes:
            raise EdgeError(f"--data {root} has no class folders",
                            expected=f"{root}/<class>/<image> or {root}/train/<class>/<image> with {root}/val/...",
                            fix="arrange the images in one sub-folder per class")
        paths, labels = [], []
        for index, name in enumerate(classes):
            files = sorted(p for p in (folder / name).rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file())
            paths += files
            labels += [index] * len(files)
        if not paths:
            raise EdgeError(f"--data {folder} has class folders but no images",
                            expected=f"files ending in {', '.join(sorted(EXTENSIONS))}")
        return cls(f"{folder}", tuple(paths), torch.tensor(labels, dtype=torch.int64), tuple(classes))

    def subset(self, indices: torch.Tensor, name: str | None = None) -> ImageFolderDataset:
        idx = indices.tolist()
        return ImageFolderDataset(name or f"{self.name}[{len(idx)}]", tuple(self.paths[i] for i in idx),
                                  self.labels[indices], self.classes)

    def preprocess_for(self, spec: InputSpec) -> FolderTransform:
        """timm's eval transform for the model's data config (resize, centre crop, normalise), per file."""
        return FolderTransform(spec, training=False)

    def _loader(self, transform: FolderTransform, batch_keys, batch_size: int, workers: int | None = None,
                pin_memory: bool = False, batches: int | None = None) -> Iterator[Batch]:
        images = batch_size * batches if batches is not None else sum(len(keys) for keys in batch_keys)
        workers = loader_workers(images, batch_size) if workers is None else workers
        loader = torch.utils.data.DataLoader(_Files(self.paths, self.labels, transform), batch_sampler=batch_keys,
                                             num_workers=workers, collate_fn=_collate, pin_memory=pin_memory,
                                             persistent_workers=False)
        for batch in loader:
            yield _checked(batch)

    def batches(self, batch_size: int, preprocess: FolderTransform,
                indices: torch.Tensor | None = None) -> Iterator[Batch]:
        order = list(range(len(self))) if indices is None else indices.tolist()
        keys = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
        return self._loader(preprocess, keys, batch_size)

    def training_batches(self, spec: InputSpec, stream: TrainingStream):
        steps: deque = deque()   # (epoch, share) of each step the sampler has handed to the loader, in order
        keys = _step_keys(len(self), stream, steps)
        loader = self._loader(FolderTransform(spec, training=stream.augment), keys, stream.batch_size,
                              stream.workers, stream.pin_memory, stream.stop - stream.start)
        for x, y in loader:
            epoch, share = steps.popleft()
            yield epoch, x, y, share

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for path, label in zip(self.paths, self.labels.tolist()):
            stat = path.stat()
            digest.update(f"{path}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return digest.hexdigest()


def _step_keys(n: int, stream: TrainingStream, steps: deque) -> Iterator[list[tuple[int, int]]]:
    """This process's keys ``(index, seed)`` of each global batch from ``stream.start`` on: the rows
    ``stream.rows`` picks of the step's slice of the seeded epoch order, each image's augmentation seeded by its
    step and its row in the global batch (so the same image gets the same draws in one process or many)."""
    cached: tuple[int, torch.Tensor] | None = None
    per_epoch = -(-n // stream.batch_size)
    for step in range(stream.start, stream.stop):
        epoch, offset = divmod(step, per_epoch)
        if cached is None or cached[0] != epoch:
            cached = (epoch, epoch_order(n, stream.seed, epoch))
        idx = cached[1][offset * stream.batch_size:(offset + 1) * stream.batch_size]
        rows = stream.rows(len(idx))
        base = step_seed(stream.seed, step) * 4099 % (1 << 62)
        steps.append((epoch, (rows.stop - rows.start) / len(idx)))
        yield [(int(i), base + rows.start + k) for k, i in enumerate(idx[rows].tolist())]
