"""The learning rate of every distillation, chosen on images held out of the training split, never on the test split.

For each model and budget the distillation runs once per rate of ``--lrs``, on the training split minus a
validation split, and each run is scored on that validation split; the rate of the highest validation
accuracy is chosen (ties: the lower rate), and only then is the chosen model scored on the test split
(:func:`select`). Same seed, teacher, batch order and step budget for every model and rate: one split, one
recipe but the rate.

The validation split is ``edge.data.holdout_set(data, N, seed, calibration=C)``: ``N`` seeded, class-balanced
training images, none of the first ``C`` of edge's seeded calibration order (the plans' ``--samples`` and
Torch-Pruning's Taylor batches are drawn from those): no image that shaped a model chooses its rate. edge's
fine-tune trains on a data set's whole training split, or on a seeded subset of it (``train_samples``), not on
all of it but a subset; so the two parts are written once as an IDX folder under ``--work`` (its ``train``
split the rest, its ``test`` split the validation images), which the distillation takes as ``data`` and
``eval_data``. That needs a data set held in memory in gray (Fashion-MNIST, its shipped subset, an IDX
folder).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from _peers_names import rate_key, slug

from edge.errors import EdgeError

LRS = (1e-4, 3e-4, 1e-3, 3e-3)
VAL_SAMPLES = 5000          # of Fashion-MNIST's 60,000 training images
SMALL_SHARE = 12            # a smaller training split gives a twelfth of its images (as 5,000 of 60,000)
RULE = "the highest validation accuracy; ties: the lower rate"
SPLIT_FILE = "split.json"
KEPT = ("out", "steps", "epochs", "teacher_sha256", "recipe", "wall_time_s", "hardware", "params", "widths")


def validation_size(given: int | None, train_size: int) -> int:
    """``--val-samples`` resolved: as given, else 5,000 images, or a twelfth of a smaller training split."""
    return given if given is not None else min(VAL_SAMPLES, train_size // SMALL_SHARE)


def check_rates(lrs: Iterable[float]) -> list[float]:
    """The rates of ``--lrs`` in increasing order; an EdgeError for a repeated or non-positive one."""
    lrs = list(lrs)
    if not lrs or any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
        raise EdgeError(f"--lrs {' '.join(map(str, lrs))}", expected="distinct learning rates above 0",
                        fix="pass e.g. --lrs 1e-4 3e-4 1e-3 3e-3")
    return sorted(lrs)


def choose_rate(validation: dict[float, float]) -> float:
    """The rate of the highest validation accuracy in ``validation`` (rate -> accuracy); ties: the lower rate."""
    return min(validation, key=lambda lr: (-validation[lr], lr))


def split_indices(labels: torch.Tensor, n: int, seed: int, num_classes: int,
                  calibration: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, validation)`` indices of a training split: validation the images of
    ``edge.data.holdout_set(spec, n, seed, calibration)``, train all the others (in index order)."""
    from edge.data import balanced_indices

    taken = torch.zeros(len(labels), dtype=torch.bool)
    if calibration:
        taken[balanced_indices(labels, calibration, seed, num_classes)] = True
    free = torch.nonzero(~taken).flatten()
    if n > len(free):
        raise EdgeError(f"{n} validation images asked for, but the training split holds {len(free)} beside the "
                        f"{calibration} calibration images", expected=f"--val-samples <= {len(free)}",
                        fix="lower --val-samples, or use a larger data set")
    validation = free[balanced_indices(labels[free], n, seed + 1, num_classes)]
    rest = torch.ones(len(labels), dtype=torch.bool)
    rest[validation] = False
    return torch.nonzero(rest).flatten(), validation


@dataclass(frozen=True)
class Split:
    """A training split cut in two, as an IDX folder: ``train`` what the distillation trains on, ``test`` the
    validation images its rate is chosen on. ``data``: the folder, as ``--data`` / ``eval_data`` name it."""

    folder: Path
    record: dict

    @property
    def data(self) -> str:
        return str(self.folder)


def held_out_split(data: str, val_samples: int | None, seed: int, calibration: int, root: Path) -> Split:
    """The split of ``data``'s training split under ``root``: written once (a temporary folder, then renamed),
    found again by every later run and process of the same data, size, calibration and seed."""
    from edge.data import load_dataset
    from edge.data.images import LabeledImages

    train = load_dataset(data, "train")
    if not isinstance(train, LabeledImages) or train.images.ndim != 3:
        raise EdgeError(f"--data {data}: the learning-rate selection cannot hold a validation split out of its "
                        "training split", expected="a gray data set held in memory (fmnist, fmnist-mini, an IDX "
                        "folder): edge's fine-tune trains on a whole training split or a subset of it, so the rest "
                        "is written as an IDX folder", found=type(train).__name__,
                        fix="pass one --lrs rate with --val-samples 0 (no selection: the whole training split)")
    n = validation_size(val_samples, len(train))
    fingerprint = train.fingerprint()
    folder = root / f"{slug(data)}-{fingerprint[:8]}-val{n}-calib{calibration}-seed{seed}"
    if (folder / SPLIT_FILE).is_file():
        return Split(folder, json.loads((folder / SPLIT_FILE).read_text()))
    rest, validation = split_indices(train.labels, n, seed, train.num_classes, calibration)
    record = {"data": data, "train_images": len(rest), "validation_images": n, "seed": seed,
              "calibration_excluded": calibration, "source_sha256": fingerprint, "folder": str(folder),
              "validation": f"edge.data.holdout_set({data!r}, {n}, {seed}, calibration={calibration})"}
    write_split(folder, train.subset(rest), train.subset(validation), record)
    return Split(folder, record)


def write_split(folder: Path, train, validation, record: dict) -> None:
    """``train`` and ``validation`` as the ``train`` and ``test`` IDX files of ``folder``, with ``record``; a
    half-written folder is never left under the final name (another process's finished one wins)."""
    from edge.data.idx import write_idx

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for prefix, part in (("train", train), ("t10k", validation)):
        write_idx(tmp / f"{prefix}-images-idx3-ubyte.gz", part.images.numpy())
        write_idx(tmp / f"{prefix}-labels-idx1-ubyte.gz", part.labels.numpy())
    (tmp / SPLIT_FILE).write_text(json.dumps(record, indent=1))
    try:
        tmp.rename(folder)
    except OSError:                         # written meanwhile by another process: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / SPLIT_FILE).is_file():
            raise


def trial_of(summary: dict, lr: float) -> dict:
    """One rate's run as the selection keeps it: the fine-tune's scores are on the validation images."""
    trial = {"lr": lr, **summary}
    trial["validation_before"], trial["validation"] = trial.pop("before"), trial.pop("after")
    return trial


def select(trials: dict[str, dict], score_test: Callable[[dict], dict], split: dict) -> dict:
    """The run of the best validation accuracy among ``trials`` (rate key -> :func:`trial_of`), then its test
    figures: ``score_test(trial)`` (``{"before", "after"}``) is called once, for the chosen run only, after
    every validation score is in. Returns the model's summary: the chosen run, its test figures, and every
    rate's validation score."""
    validation = {trial["lr"]: trial["validation"]["accuracy"] for trial in trials.values()}
    chosen = choose_rate(validation)
    trial = trials[rate_key(chosen)]
    figures = score_test(trial)
    return {**{k: trial[k] for k in KEPT if k in trial}, "before": figures["before"], "after": figures["after"],
            "selection": {"lrs": sorted(validation), "chosen_lr": chosen, "rule": RULE,
                          "validation": {rate_key(lr): trials[rate_key(lr)]["validation"] for lr in sorted(validation)},
                          "validation_before": trial["validation_before"], "split": split,
                          "wall_time_s": round(sum(t.get("wall_time_s") or 0 for t in trials.values()), 1)}}
