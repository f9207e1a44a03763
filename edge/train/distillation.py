"""Distillation as a task of the one training loop (:mod:`edge.train.loop`): a student learns a frozen teacher.

Each step feeds the same seeded, augmented batch to both models and minimises (Hinton et al.)

    L = (1 - alpha) * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))
        + alpha * CE(z_s, y) + beta * MSE(f_s, f_t)

with ``z`` the logits and ``f`` the pre-logit features (after pooling and ``fc_norm``). The task
steps the training phases it is given before every step (a compression method's temporary structure,
:class:`edge.compress.method.TrainingPhase`: dilution's mask M, PIAD's sampled sub-network), keeps
their state in the checkpoint and records their values with every evaluation. ``edge finetune``
(:mod:`edge.compress.finetune`) builds the pair, the phases and this task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from edge.data.preprocess import InputSpec
from edge.progress import log
from edge.train.checkpoint import Progress
from edge.train.held_out import held_out_accuracy
from edge.train.loop import Loop, resumed


class Phase(Protocol):
    """What the task asks of a training phase (:class:`edge.compress.method.TrainingPhase`)."""

    name: str

    @property
    def final(self) -> bool: ...

    def start(self) -> None: ...

    def step(self, step: int, total: int) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Weights(Protocol):
    """The fields of a recipe the task reads (``FinetuneConfig``)."""

    temperature: float
    alpha: float
    feature_weight: float
    eval_every_epoch: bool

def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      labels: torch.Tensor | None = None, *, temperature: float = 1.0, alpha: float = 0.0,
                      student_features: torch.Tensor | None = None, teacher_features: torch.Tensor | None = None,
                      feature_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss ``L`` of the module docstring, in float32; returns ``(loss, parts)`` with ``parts["kl"]`` etc.

    The KL is ``sum p_t (log p_t - log p_s)`` per sample, averaged over the batch and scaled by
    ``T^2`` (so its gradient keeps its size across temperatures); it is exactly 0 where the
    two models give the same logits.
    """
    t = float(temperature)
    log_student = F.log_softmax(student_logits.float() / t, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True) * (t * t)
    parts = {"kl": kl.detach()}
    loss = (1.0 - alpha) * kl
    if alpha:
        ce = F.cross_entropy(student_logits.float(), labels)
        loss = loss + alpha * ce
        parts["ce"] = ce.detach()
    if feature_weight:
        mse = F.mse_loss(student_features.float(), teacher_features.float())
        loss = loss + feature_weight * mse
        parts["feature_mse"] = mse.detach()
    return loss, parts


class StudentOutputs(nn.Module):
    """The student's logits (and pre-logit features) from one ``forward``, the unit DistributedDataParallel wraps.

    It holds the student (its state dict is ``model.*``); the student itself is saved, never this.
    """

    def __init__(self, model: nn.Module, features: bool) -> None:
        super().__init__()
        self.model = model
        self.features = features

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return logits_and_features(self.model, x, self.features)


def logits_and_features(model: nn.Module, x: torch.Tensor, features: bool) -> tuple[torch.Tensor,
                                                                                       torch.Tensor | None]:
    """The logits, and with ``features`` also the pre-logit features timm's head reads."""
    if not features:
        return model(x), None
    pre_logits = model.forward_head(model.forward_features(x), pre_logits=True)
    return model.head(pre_logits), pre_logits


@dataclass
class Distillation:
    """The fine-tune's task for the training loop (:mod:`edge.train.loop`): the loss of the module docstring
    against the frozen teacher, the methods' training phases stepped before every step, and the held-out
    accuracy after each epoch but the last (the result is scored once its phases have finished)."""

    config: Weights
    student: nn.Module
    teacher: nn.Module
    phases: list[Phase]
    held_out: object
    spec: InputSpec
    device: torch.device
    values: dict[str, float] = field(default_factory=dict)  # what the phases showed last (M, sampled MACs)

    @property
    def features(self) -> bool:
        return bool(self.config.feature_weight)

    def accuracy(self) -> dict:
        result = held_out_accuracy(self.student, self.held_out, self.spec, self.device)
        return {k: result[k] for k in ("data", "samples", "accuracy", "loss")}

    def start(self) -> None:
        """Put the phases' structures into the student."""
        for phase in self.phases:
            phase.start()

    def resume(self, loop: Loop, state: dict) -> Progress:
        """The checkpoint ``state`` loaded into the student, optimizer and phases."""
        progress = resumed(loop, state)
        for phase in self.phases:
            phase.load_state_dict(state["phases"][phase.name])
        return progress

    def phase_values(self) -> dict[str, float]:
        """The phases' numbers as they stand (until the first step sets them)."""
        return {k: v for phase in self.phases for k, v in phase.state_dict().items() if isinstance(v, int | float)}

    def before_step(self, step: int, total: int) -> dict[str, float]:
        self.values = {k: v for phase in self.phases for k, v in phase.step(step, total).items()}
        return self.values

    def loss(self, forward: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            teacher_logits, teacher_features = logits_and_features(self.teacher, x, self.features)
        student_logits, student_features = forward(x)
        c = self.config
        local, parts = distillation_loss(student_logits, teacher_logits, y, temperature=c.temperature, alpha=c.alpha,
                                         student_features=student_features, teacher_features=teacher_features,
                                         feature_weight=c.feature_weight)
        return local, {"kl": parts["kl"]}

    def after_epoch(self, progress: Progress, epoch: int, loss: float, last: bool) -> dict[str, str]:
        if not self.config.eval_every_epoch or last:
            return {}
        result = self.accuracy()
        progress.history.append({"epoch": epoch + 1, "step": progress.step, "train_loss": loss, **result,
                                 "elapsed_s": round(progress.elapsed, 1), **phase_state(self.phases, self.values)})
        log(f"epoch {epoch + 1} step {progress.step}: loss {loss:.4f} {self.held_out.name} accuracy "
            f"{result['accuracy']:.4f}{phase_note(self.phases, self.values)} ({progress.elapsed / 60:.1f} min)")
        return {"acc": f"{result['accuracy']:.4f}"}

    def checkpoint(self) -> dict:
        return {"phases": {p.name: p.state_dict() for p in self.phases}}


def phase_state(phases: list[Phase], values: dict) -> dict:
    """What a history entry records of the phases: their logged values and whether the model is final."""
    return {**values, "final_structure": all(p.final for p in phases)} if phases else {}


def values_text(values: dict) -> str:
    return ", ".join(f"{k} = {v:.3g}" for k, v in values.items())


def phase_note(phases: list[Phase], values: dict) -> str:
    if not phases:
        return ""
    shown = values_text(values)
    return f" at {shown}" if all(p.final for p in phases) else f" at {shown} (not the final structure)"
