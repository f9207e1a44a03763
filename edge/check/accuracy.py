"""Accuracy of a model on a labelled data set (full split unless a subset is passed)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.config import MAX_BATCH, option
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.progress import bar


@dataclass(frozen=True)
class EvaluateConfig:
    batch_size: int = option(256, minimum=1, maximum=MAX_BATCH)  # images per forward pass


def head_mismatch(shape: tuple[int, ...], num_classes: int, data: str) -> str | None:
    """Why outputs of ``shape`` (batch first) are not class scores for ``data``, or None when they are.

    A 1000-class ImageNet head on a 10-class set, or a feature-only model (``num_classes=0``: its
    outputs are features), would be scored as if its outputs were logits: accuracy near 0, or a
    loss computed on features.
    """
    if len(shape) != 2:
        return f"outputs have shape {list(shape[1:])} per image, not one score per class of {data}"
    if shape[1] != num_classes:
        return f"outputs are {shape[1]} values per image but {data} has {num_classes} classes"
    return None


def require_head(model: nn.Module, dataset, purpose: str, fix: str) -> None:
    """Refuse to read ``dataset``'s labels as ``model``'s classes when its head has another number of outputs: the
    folder's classes (sorted folder names) would index another set of classes, silently. ``purpose``: what reads
    them; ``fix``: what else the user can do (a method's label-free criterion)."""
    outputs = int(getattr(model, "num_classes", 0) or 0)
    if outputs != dataset.num_classes:
        raise EdgeError(f"{purpose} reads the labels of {dataset.name} as the model's classes, but the model's head "
                        f"has {outputs} outputs and {dataset.name} has {dataset.num_classes} classes",
                        expected="a head with one output per class folder, in the folders' sorted order",
                        fix=f"give the model a head for these classes (timm:ARCH,num_classes={dataset.num_classes} "
                            f"with weights fine-tuned on them, or `edge eval MODEL --probe` to fit one), or {fix}")


def _outputs(model, batches, device: torch.device):
    """``(model(x), y)`` for every batch, in order: several at once where the model runs them so (an ONNX graph's
    :meth:`~edge.check.onnx_classifier.OnnxClassifier.map`), else one by one."""
    concurrent = getattr(model, "map", None)
    if concurrent is not None:
        return concurrent(batches)
    return ((model(x.to(device)), y) for x, y in batches)


@torch.no_grad()
def evaluate(model: nn.Module, dataset, spec: InputSpec, *, batch_size: int = EvaluateConfig.batch_size,
             device: torch.device | str = "cpu", show_progress: bool = True, predictions: bool = False) -> dict:
    """Top-1 accuracy, mean cross-entropy and per-class accuracy, in float32; ``predictions``: also every
    image's predicted class, in the data set's order (to compare another graph on the same images)."""
    device = torch.device(device)
    if isinstance(model, nn.Module):
        model = model.to(device).eval()
    preprocess = dataset.preprocess_for(spec)
    num_classes = dataset.num_classes
    correct = torch.zeros(num_classes, dtype=torch.int64)
    total = torch.zeros(num_classes, dtype=torch.int64)
    loss_sum = 0.0
    predicted: list[torch.Tensor] = []
    start = time.perf_counter()
    with bar(total=len(dataset), desc=f"eval {dataset.name}", unit="img", disable=not show_progress) as progress:
        for logits, y in _outputs(model, dataset.batches(batch_size, preprocess), device):
            logits = logits.float().cpu()
            mismatch = head_mismatch(tuple(logits.shape), num_classes, dataset.name)
            if mismatch:
                raise EdgeError(f"the model's {mismatch}", expected=f"a classifier head of {num_classes} classes",
                                fix="evaluate its features with --probe (a linear classifier on the frozen "
                                    "backbone), or fine-tune a head for this data first")
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            top1 = logits.argmax(-1)
            if predictions:
                predicted.append(top1)
            hit = top1 == y
            total += torch.bincount(y, minlength=num_classes)
            correct += torch.bincount(y[hit], minlength=num_classes)
            progress.update(len(y))
    samples = int(total.sum())
    return {
        "accuracy": float(correct.sum()) / samples,
        "samples": samples,
        "correct": int(correct.sum()),
        "loss": loss_sum / samples,
        "per_class_accuracy": {name: (float(c) / float(t) if t else None)
                               for name, c, t in zip(dataset.classes, correct, total)},
        "data": dataset.name,
        "seconds": round(time.perf_counter() - start, 3),
    } | ({"predictions": torch.cat(predicted).tolist()} if predictions else {})
