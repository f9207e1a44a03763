"""The papers' linear-probe protocol: a linear classifier on the frozen backbone's features.

Features are the model's pre-logit representation (what its own head sees). The classifier
is trained with Adam (lr 1e-3), batch 256, 5 epochs, seeded, on the training split, and
evaluated on the full test split (TOAST, Sec. 5).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.config import MAX_SEED, option
from edge.data.preprocess import InputSpec
from edge.progress import bar


@dataclass
class ProbeConfig:
    epochs: int = 5
    batch_size: int = 256
    lr: float = 1e-3
    seed: int = option(0, minimum=0, maximum=MAX_SEED)


@torch.no_grad()
def features(model: nn.Module, dataset, spec: InputSpec, batch_size: int = 256, desc: str = "features") -> torch.Tensor:
    preprocess = dataset.preprocess_for(spec)
    out = []
    model.eval()
    with bar(total=len(dataset), desc=desc, unit="img") as progress:
        for x, _ in dataset.batches(batch_size, preprocess):
            out.append(model.forward_head(model.forward_features(x), pre_logits=True).float())
            progress.update(len(x))
    return torch.cat(out)


def linear_probe(model: nn.Module, train_set, test_set, spec: InputSpec, config: ProbeConfig | None = None) -> dict:
    config = config or ProbeConfig()
    start = time.perf_counter()
    train_x = features(model, train_set, spec, desc="probe: train features")
    test_x = features(model, test_set, spec, desc="probe: test features")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    classifier = nn.Linear(train_x.shape[1], train_set.num_classes)
    optimizer = torch.optim.Adam(classifier.parameters(), lr=config.lr)
    for _ in range(config.epochs):
        order = torch.randperm(len(train_x), generator=generator)
        for begin in range(0, len(order), config.batch_size):
            idx = order[begin:begin + config.batch_size]
            loss = F.cross_entropy(classifier(train_x[idx]), train_set.labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predictions = classifier(test_x).argmax(-1)
    correct = int((predictions == test_set.labels).sum())
    return {"accuracy": correct / len(test_set), "samples": len(test_set), "correct": correct,
            "probe": {"features": "pre-logits (frozen)", "optimizer": "Adam", **vars(config),
                         "train_samples": len(train_set)},
            "seconds": round(time.perf_counter() - start, 2)}
