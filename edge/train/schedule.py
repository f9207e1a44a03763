"""How long and how fast edge's training loop runs: steps, learning rate, optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from edge.train.batches import check_global_batch


class Rates(Protocol):
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float


@dataclass(frozen=True)
class Schedule:
    """``total`` steps of the learning-rate schedule in epochs of ``per_epoch``; the run stops at ``last``."""

    per_epoch: int
    total: int
    last: int

    @classmethod
    def of(cls, samples: int, batch_size: int, epochs: int, *, steps: int | None = None,
           max_steps: int | None = None) -> Schedule:
        """``steps`` (default: ``epochs`` of ``samples``), stopped at ``max_steps`` if given; refuses a
        global batch too small for the processes."""
        check_global_batch(samples, batch_size)
        per_epoch = math.ceil(samples / batch_size)
        total = steps or per_epoch * epochs
        return cls(per_epoch, total, total if max_steps is None else min(total, max_steps))


def learning_rate(step: int, total: int, config: Rates) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay from ``lr`` to ``min_lr`` (reached at ``total``)."""
    warmup = min(config.warmup_steps, max(total - 1, 1))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters; no weight decay on biases, norms, tokens and position embeddings (as timm/DeiT)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in ("cls_token", "pos_embed", "reg_token") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(model: torch.nn.Module, config: Rates) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters at ``config.lr`` (the loop sets each step's rate)."""
    return torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, betas=(0.9, 0.999))
