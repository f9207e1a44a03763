"""``edge train``: seeded, resumable supervised training of a ViT on an image data set.

Determinism: the model is initialised from ``seed``; epoch ``e`` visits the training set
in the order ``randperm(N, seed=(seed, e))``; the augmentation of step ``s`` draws from a
generator seeded with ``(seed, s)``. A run therefore resumes from any checkpoint to the
same weights as an uninterrupted run on the same machine, threads and precision.

Under ``torchrun --nproc_per_node N -m edge train ...`` the same steps run with PyTorch's
DistributedDataParallel: every process draws the same global batch of ``batch_size`` and trains on
its rows (:func:`edge.distributed.batch_rows`), its loss weighted by its share, so the weights equal
a one-process run's up to the order of float additions (and a checkpoint continues with any number
of processes). Held-out evaluations are sharded and their counts added (:func:`held_out_accuracy`);
only the main process writes (checkpoint, weights, card) and prints; ``--out`` must be a folder
every process sees (a shared file system on several machines).

The steps are those of the one training loop (:mod:`edge.train.loop`); this module adds its task,
label-smoothed cross-entropy with a held-out evaluation per epoch, and the model card.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edge import __version__, distributed
from edge.check.accuracy import evaluate
from edge.config import MAX_BATCH, MAX_EPOCHS, MAX_SAMPLES, MAX_SEED, MAX_STEPS, MAX_THREADS, option
from edge.data import load_dataset
from edge.data.preprocess import InputSpec
from edge.errors import plural
from edge.fileio import write_text_atomic
from edge.models import create_model, data_config, data_for, model_info, parse_model_spec
from edge.models.weights_io import save_safetensors
from edge.progress import log
from edge.runtime import hardware
from edge.train.batches import training_set
from edge.train.checkpoint import CHECKPOINT, Progress, open_checkpoint, recipe_of
from edge.train.held_out import held_out_accuracy
from edge.train.loop import Loop, Runtime, resumed, run
from edge.train.schedule import Schedule, adamw


@dataclass
class TrainConfig:
    """The recipe. ``None`` fields are resolved in :func:`resolve` (one place for defaults)."""

    model: str = "fmnist-deit-tiny"
    init_weights: str | None = None       # start from these weights (a fine-tuning stage), not random init
    data: str | None = None   # None: the bundled model's data set (edge.models.data_for); other models need it
    eval_data: str | None = None          # default: the test split of ``data``
    epochs: int = option(10, minimum=1, maximum=MAX_EPOCHS)
    batch_size: int = option(128, minimum=1, maximum=MAX_BATCH)
    lr: float = option(1e-3, above=0, maximum=10)
    min_lr: float = option(1e-5, minimum=0, maximum=10)
    weight_decay: float = option(0.05, minimum=0, maximum=10)
    warmup_steps: int = option(500, minimum=0, maximum=MAX_STEPS)
    label_smoothing: float = option(0.1, minimum=0, below=1)
    grad_clip: float = option(1.0, minimum=0, maximum=1e6)  # 0: no clipping
    augment: bool = True                  # random shift of up to 2 px and horizontal flip
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    amp: str = "auto"                     # auto | bf16 | fp16 | off
    device: str = "auto"                  # auto | cpu | cuda[:N]
    threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)
    # stop early (a shortened run of the same schedule)
    max_steps: int | None = option(None, minimum=1, maximum=MAX_STEPS)
    # train on a seeded subset (shortened runs, tests)
    train_samples: int | None = option(None, minimum=1, maximum=MAX_SAMPLES)
    checkpoint_every: int = option(200, minimum=1, maximum=MAX_STEPS)
    eval_every_epoch: bool = True
    save_dtype: str = "float16"           # dtype of the final weights file
    command: list[str] = field(default_factory=list)


@dataclass
class CrossEntropy:
    """``edge train``'s task for the loop: label-smoothed cross-entropy; held-out accuracy after each epoch."""

    config: TrainConfig
    model: nn.Module
    eval_set: object
    spec: InputSpec
    device: torch.device

    def before_step(self, step: int, total: int) -> dict[str, float]:
        return {}

    def loss(self, forward: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return F.cross_entropy(forward(x), y, label_smoothing=self.config.label_smoothing), {}

    def after_epoch(self, progress: Progress, epoch: int, loss: float, last: bool) -> dict[str, str]:
        if not self.config.eval_every_epoch:
            return {}
        result = held_out_accuracy(self.model, self.eval_set, self.spec, self.device)
        progress.history.append({"epoch": epoch + 1, "step": progress.step, "loss": loss,
                                 "eval_accuracy": result["accuracy"], "elapsed_s": round(progress.elapsed, 1)})
        log(f"epoch {epoch + 1}/{self.config.epochs} step {progress.step}: loss {loss:.4f} "
            f"{self.eval_set.name} accuracy {result['accuracy']:.4f} ({progress.elapsed / 60:.1f} min)")
        return {}

    def checkpoint(self) -> dict:
        return {}


def train(config: TrainConfig, out: str | Path, *, resume: bool = True) -> dict:
    """Train ``config.model`` on ``config.data``; write weights, checkpoint and model card to ``out``.

    With ``resume`` (default) an existing ``out/checkpoint.pt`` of the same recipe is continued. The
    checkpoint is removed once the whole schedule has run; a run stopped earlier (``max_steps``,
    Ctrl-C, a crash) keeps it.
    """
    out = Path(out)
    config = replace(config, data=data_for(config.data, config.model))
    runtime = Runtime.start(config)
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
    spec = parse_model_spec(config.model)
    torch.manual_seed(config.seed)
    model = create_model(spec, pretrained_weights=False, weights=config.init_weights).to(runtime.device)
    input_spec = InputSpec.from_data_config(data_config(model))
    loop = reference_loop(config, model, input_spec, runtime, out)
    task = CrossEntropy(config, model, load_dataset(config.eval_data or config.data, "test"), input_spec,
                        runtime.device)
    state = open_checkpoint(loop.checkpoint, loop.recipe, asdict(TrainConfig()), resume)
    progress = resumed(loop, state) if state is not None else Progress()
    log(f"train {config.model} on {loop.data.name} ({len(loop.data)} images): {plural(loop.schedule.last, 'step')} "
        f"({loop.schedule.per_epoch}/epoch), device {runtime.device}, amp {runtime.amp_dtype}, "
        f"threads {runtime.threads}")
    run(loop, task, progress)
    return finish(loop, task, progress, out)


def reference_loop(config: TrainConfig, model: nn.Module, spec: InputSpec, runtime: Runtime, out: Path) -> Loop:
    """The loop of ``edge train``: ``model`` on ``config.data`` (the seeded subset), AdamW, the recipe's schedule."""
    data = training_set(config.data, config.train_samples, config.seed)
    schedule = Schedule.of(len(data), config.batch_size, config.epochs, max_steps=config.max_steps or None)
    return Loop(model=model, forward=model, optimizer=adamw(model, config), data=data,
                spec=spec, config=config, schedule=schedule, runtime=runtime,
                checkpoint=out / CHECKPOINT, recipe=recipe_of(config), desc="train", activity="training")


def finish(loop: Loop, task: CrossEntropy, progress: Progress, out: Path) -> dict:
    """Save the weights (``save_dtype``), score them as saved, write the card; drop a finished run's checkpoint."""
    loop.model.eval()
    weights_path = out / "model.safetensors"
    save_weights(loop.model, task.config, weights_path)
    # Accuracy of the weights as saved (e.g. float16), evaluated in float32 on the full test split.
    saved = create_model(parse_model_spec(task.config.model), weights=weights_path)
    final = evaluate(saved, task.eval_set, task.spec, device=task.device) if not distributed.active() else \
        held_out_accuracy(saved, task.eval_set, task.spec, task.device)
    card = model_card(loop, task, progress, saved, final)
    if distributed.is_main():
        write_text_atomic(json.dumps(card, indent=2) + "\n", out / "card.json")
        if progress.step >= loop.schedule.total:  # finished: nothing left to resume (a --max-steps stop keeps it)
            loop.checkpoint.unlink(missing_ok=True)
    distributed.barrier()   # the others return once the main process has written
    return card


def save_weights(model: nn.Module, config: TrainConfig, path: Path) -> None:
    """The main process writes the weights in ``save_dtype``; every process waits until they are written."""
    dtype = getattr(torch, config.save_dtype)
    if distributed.is_main():
        save_safetensors({k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}, path,
                         metadata={"model": config.model, "edge": __version__})
    distributed.barrier()   # the weights file is written before any process reads it


def model_card(loop: Loop, task: CrossEntropy, progress: Progress, saved: nn.Module, final: dict) -> dict:
    config = task.config
    card = {
        "model": config.model,
        "architecture": parse_model_spec(config.model).arch,
        "info": model_info(saved).as_dict(),
        "data_config": task.spec.as_dict(),
        "command": config.command or [sys.argv[0], *sys.argv[1:]],
        "recipe": {**loop.recipe, "max_steps": config.max_steps},
        "seed": config.seed,
        "epochs": config.epochs,
        "steps": progress.step,
        "train_data": loop.data.name,
        "train_samples": len(loop.data),
        "eval": {"data": task.eval_set.name, "accuracy": final["accuracy"], "samples": final["samples"],
                 "loss": final["loss"]},
        "history": progress.history,
        "wall_time_s": round(progress.elapsed, 1),
        "hardware": hardware(loop.runtime.device),
        "precision": {"train_amp": loop.runtime.amp_name, "weights": config.save_dtype, "eval": "float32"},
        "edge": __version__,
    }
    if distributed.active():
        card["processes"] = distributed.world_size()
    return card
