"""The one training loop of edge: ``edge train`` and ``edge finetune`` (distillation, dilution, PIAD) run it.

Each step draws this process's rows of the seeded global batch of ``batch_size`` (``ImageSet.training_batches``),
lets the :class:`Task` do its per-step work (dilution's mask M, PIAD's sampled sub-network), sets the
step's learning rate (linear warm-up, cosine decay), computes the task's loss under autocast and takes
one AdamW step with the gradient norm clipped. At the end of each epoch the task evaluates (the model
in eval mode); ``OUT/checkpoint.pt`` is written every ``checkpoint_every`` steps, at each epoch's end
and at the last step, so a run resumes to the weights of an uninterrupted one.

What differs between kinds of training is the task: ``edge train``'s cross-entropy
(:mod:`edge.train.reference`), the fine-tune's distillation from a teacher with the training phases of
the compression methods (:mod:`edge.compress.finetune`).

Many processes (``torchrun --nproc_per_node N``): PyTorch's DistributedDataParallel. Every process
draws the same global batch and trains on its rows (:func:`edge.distributed.batch_rows`), its loss
weighted by its share of the rows, so the averaged gradient is the gradient of the global batch mean
and the weights equal a one-process run's up to the order of float additions. Only the main process
writes the checkpoint.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from edge import distributed
from edge.data.dataset import ImageSet, TrainingStream
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.progress import bar, log
from edge.runtime import resolve_amp, resolve_device, set_threads
from edge.train.checkpoint import Progress, restore, save_checkpoint
from edge.train.schedule import Rates, Schedule, learning_rate


class Task(Protocol):
    """What one kind of training adds to the loop."""

    def before_step(self, step: int, total: int) -> dict[str, float]:
        """Per-step work before the forward of (0-based) step ``step`` of ``total``; the values to show."""
        ...

    def loss(self, forward: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor,
                                                                                  dict[str, torch.Tensor]]:
        """This process's mean loss over its rows ``x, y`` (``forward``: the loop's module, in DDP when
        distributed), called under autocast; and detached parts to show (e.g. ``{"kl": ...}``)."""
        ...

    def after_epoch(self, progress: Progress, epoch: int, loss: float, last: bool) -> dict[str, str]:
        """At the end of (0-based) ``epoch``, the model in eval mode: evaluate and add to ``progress.history``
        if wanted (``last``: the run's last step); the progress-bar fields to add."""
        ...

    def checkpoint(self) -> dict:
        """What the checkpoint holds beyond the model, optimizer and progress (training phases' state)."""
        ...


class Recipe(Rates, Protocol):
    """The fields of a training config the loop reads (``TrainConfig``, ``FinetuneConfig``)."""

    batch_size: int
    seed: int
    augment: bool
    grad_clip: float
    checkpoint_every: int


@dataclass(frozen=True)
class Runtime:
    """Where a run computes: CPU threads, this process's device, the autocast dtype (None: float32)."""

    threads: int
    device: torch.device
    amp_dtype: torch.dtype | None

    @classmethod
    def start(cls, config) -> Runtime:
        """Set the threads, pick the device (one GPU per process under torchrun) and join the process group."""
        threads = set_threads(config.threads)
        device = distributed.local_device(resolve_device(config.device))
        distributed.init(device)
        return cls(threads, device, resolve_amp(config.amp, device))

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                              enabled=self.amp_dtype is not None)

    @property
    def amp_name(self) -> str:
        """The training precision as a record names it."""
        return str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else "float32"


@dataclass
class Loop:
    """What the loop trains, on what, how long, and where it checkpoints."""

    model: nn.Module                  # trained, clipped, checkpointed
    forward: nn.Module                # what the task's loss calls: ``model`` or a module holding it
    optimizer: torch.optim.Optimizer
    data: ImageSet                    # streamed: an image folder is read from disk as the steps need it
    spec: InputSpec                   # the model's input: size, mean, std (the data's transforms follow it)
    config: Recipe
    schedule: Schedule
    runtime: Runtime
    checkpoint: Path
    recipe: dict                      # what a checkpoint must match to be continued
    desc: str                         # the progress bar's name: train, finetune
    activity: str                     # what diverges in the error: training, fine-tuning
    find_unused: bool = False         # some steps leave trainable parameters without a gradient (DDP)
    data_wait: float = 0.0            # seconds this run's steps waited for their batch (data loading not hidden)


@dataclass(frozen=True)
class StepResult:
    """What one step shows: its epoch, the global batch's mean loss and parts, the rate, the task's values."""

    epoch: int
    loss: float
    parts: dict[str, float]
    lr: float
    values: dict[str, float]

    def postfix(self) -> dict[str, str]:
        return {"epoch": self.epoch, "loss": f"{self.loss:.4f}", **{k: f"{v:.4f}" for k, v in self.parts.items()},
                "lr": f"{self.lr:.2e}", **{k: f"{v:.3f}" for k, v in self.values.items()}}


def resumed(loop: Loop, state: dict) -> Progress:
    """The checkpoint ``state`` loaded into the loop's model and optimizer; where its run stood."""
    progress = restore(state, loop.model, loop.optimizer)
    log(f"resuming {loop.checkpoint} at step {progress.step}/{loop.schedule.last}")
    return progress


def run(loop: Loop, task: Task, progress: Progress) -> Progress:
    """Train from ``progress.step`` to ``loop.schedule.last``; returns ``progress``, advanced."""
    forward = distributed.data_parallel(loop.forward, loop.runtime.device, find_unused=loop.find_unused)
    loop.model.train()
    started = time.perf_counter() - progress.elapsed
    device = loop.runtime.device
    stream = TrainingStream(loop.config.batch_size, loop.config.seed, loop.config.augment, progress.step,
                            loop.schedule.last, distributed.batch_rows, pin_memory=device.type == "cuda")
    batches = loop.data.training_batches(loop.spec, stream)
    with bar(total=loop.schedule.last, initial=progress.step, desc=loop.desc, unit="step") as shown:
        while progress.step < loop.schedule.last:
            waited = time.perf_counter()
            batch = next(batches)
            loop.data_wait += time.perf_counter() - waited
            result = train_step(loop, task, forward, progress.step, batch)
            progress.step += 1
            progress.elapsed = time.perf_counter() - started
            epoch_done = progress.step % loop.schedule.per_epoch == 0
            fields = end_of_epoch(loop, task, progress, result) if epoch_done else {}
            shown.set_postfix({**result.postfix(), **fields}, refresh=False)
            shown.update(1)
            if epoch_done or progress.step % loop.config.checkpoint_every == 0 or progress.step == loop.schedule.last:
                save_checkpoint(loop.checkpoint, loop.model, loop.optimizer, progress, loop.recipe, task.checkpoint())
    return progress


def train_step(loop: Loop, task: Task, forward: nn.Module, step: int,
               batch: tuple[int, torch.Tensor, torch.Tensor, float]) -> StepResult:
    """One optimizer step on ``batch``: this process's rows of global batch ``step``, their epoch and share."""
    config, total = loop.config, loop.schedule.total
    epoch, x, y, share = batch
    x = x.to(loop.runtime.device, non_blocking=True)
    y = y.to(loop.runtime.device, non_blocking=True)
    values = task.before_step(step, total)
    lr = set_learning_rate(loop.optimizer, learning_rate(step, total, config))
    with loop.runtime.autocast():
        local, parts = task.loss(forward, x, y)
    loss, *logged = global_mean(local, parts, share)
    if not math.isfinite(loss):
        raise EdgeError(f"{loop.activity} diverged at step {step}: loss is {loss}", fix="lower --lr or use --amp off")
    # DDP averages the processes' gradients: weighted by its share of the rows, each adds its part of the
    # gradient of the global batch mean (the weight is exactly 1 in one process)
    update(loop, local * (share * distributed.world_size()))
    return StepResult(epoch, loss, dict(zip(parts, logged)), lr, values)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def global_mean(local: torch.Tensor, parts: dict[str, torch.Tensor], share: float) -> list[float]:
    """The global batch's mean loss and parts: the sum of every process's share (the same on all)."""
    return distributed.all_reduce_sum(torch.stack([local.detach(), *parts.values()]) * share).tolist()


def update(loop: Loop, loss: torch.Tensor) -> None:
    """Backward ``loss``, clip the trainable parameters' gradient norm to ``grad_clip`` (0: no clipping), step."""
    loop.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if loop.config.grad_clip:
        torch.nn.utils.clip_grad_norm_([p for p in loop.model.parameters() if p.requires_grad],
                                       loop.config.grad_clip)
    loop.optimizer.step()


def end_of_epoch(loop: Loop, task: Task, progress: Progress, result: StepResult) -> dict[str, str]:
    """The task's evaluation at an epoch's end, the model in eval mode, then back in train mode."""
    loop.model.eval()
    fields = task.after_epoch(progress, result.epoch, result.loss, progress.step == loop.schedule.last)
    loop.model.train()
    return fields
