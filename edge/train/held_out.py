"""The held-out accuracy a training run records, sharded over torchrun's processes."""

from __future__ import annotations

import torch

from edge import distributed
from edge.check.accuracy import evaluate
from edge.data.preprocess import InputSpec


def held_out_accuracy(model: torch.nn.Module, data, spec: InputSpec, device: torch.device) -> dict:
    """:func:`edge.check.accuracy.evaluate` without progress; under torchrun each process scores its share of
    ``data`` and the correct counts, sample counts and loss sums are added (the same result in every process)."""
    share = distributed.shard_of(data)
    if not distributed.active():
        return evaluate(model, share, spec, device=device, show_progress=False)
    result = evaluate(model, share, spec, device=device, show_progress=False) if len(share) else \
        {"correct": 0, "samples": 0, "loss": 0.0}
    sums = torch.tensor([result["correct"], result["samples"], result["loss"] * result["samples"]],
                        dtype=torch.float64)
    correct, samples, loss_sum = distributed.all_reduce_sum(sums).tolist()
    return {"accuracy": correct / samples, "samples": int(samples), "correct": int(correct),
            "loss": loss_sum / samples, "data": data.name}
