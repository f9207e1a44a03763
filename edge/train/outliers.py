"""``fmnist-deit-tiny-outliers``: the reference model with the activation outliers of pretrained ViTs.

The recipe (seeded, run by ``scripts/make_outlier_model.py``):

1. **Plant** (:mod:`edge.models.massive`): in ``blocks[massive_block]``'s MLP two hidden units become a
   gate that fires on the patch tokens ``sink_patches`` (background corners of Fashion-MNIST) and
   writes ``+-magnitude`` into ``massive_channels`` residual channels, the circuit by which pretrained
   ViTs grow massive activations after an early block.
2. **Fine-tune** with edge's one training loop (:mod:`edge.train.loop`): distillation from the
   reference model's logits (keeps its accuracy while the later blocks adapt to the sink tokens) plus
   ``aux_weight`` times the mean squared relative error of the planted values in every block from
   ``massive_block`` on (keeps them where pretrained ViTs have them, riding the residual stream).
3. **Spread** (:mod:`edge.models.layernorm_spread`): an exact reparameterisation that scales
   ``ln_channels`` channels of every LayerNorm affine by ``ln_low``..``ln_high`` and divides the next
   Linear's input columns by the same factors (RepQ-ViT's inter-channel variation, in reverse).

The result is saved in float16 like the reference model and scored in float32 on the test split.
``scripts/make_outlier_model.py`` adds its outlier statistics (:mod:`edge.analysis.outliers`, a layer
this module may not import) to the model card.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from edge import __version__
from edge.check.accuracy import evaluate
from edge.config import MAX_BATCH, MAX_EPOCHS, MAX_SAMPLES, MAX_SEED, MAX_STEPS, MAX_THREADS, option
from edge.data import InputSpec, balanced_indices, load_dataset
from edge.data.dataset import ImageSet
from edge.fileio import write_text_atomic
from edge.models import create_model, data_config, data_for
from edge.models.layernorm_spread import spread_layernorm_channels
from edge.models.massive import MassiveSite, choose_channels, plant_massive_activations
from edge.models.weights_io import save_safetensors
from edge.progress import log
from edge.runtime import hardware
from edge.train.checkpoint import CHECKPOINT, Progress, open_checkpoint, recipe_of
from edge.train.distillation import distillation_loss
from edge.train.held_out import held_out_accuracy
from edge.train.loop import Loop, Runtime, resumed, run
from edge.train.schedule import Schedule, adamw

TEACHER = "fmnist-deit-tiny"
NAME = "fmnist-deit-tiny-outliers"


@dataclass
class OutlierConfig:
    """The recipe of the module docstring. ``None`` fields are resolved where they are read."""

    data: str | None = None               # None: the bundled model's set (the full Fashion-MNIST), or a folder
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    # 1. plant
    massive_block: int = option(2, minimum=0, maximum=11)
    sink_patches: tuple[int, ...] = (0, 6)   # patches (0, 0) and (0, 6): the top corners
    massive_channels: int = option(2, minimum=1, maximum=16)
    magnitude: float = option(4000.0, above=0, maximum=60000)
    gate_images: int = option(2000, minimum=10, maximum=MAX_SAMPLES)
    # 2. fine-tune (edge's training loop)
    epochs: int = option(6, minimum=1, maximum=MAX_EPOCHS)
    batch_size: int = option(256, minimum=1, maximum=MAX_BATCH)
    lr: float = option(1e-4, above=0, maximum=10)
    min_lr: float = option(1e-6, minimum=0, maximum=10)
    weight_decay: float = option(0.05, minimum=0, maximum=10)
    warmup_steps: int = option(100, minimum=0, maximum=MAX_STEPS)
    grad_clip: float = option(1.0, minimum=0, maximum=1e6)
    augment: bool = True
    temperature: float = option(1.0, above=0, maximum=100)
    aux_weight: float = option(1.0, minimum=0, maximum=1e6)
    # 3. spread
    ln_channels: int = option(6, minimum=0, maximum=192)
    ln_low: float = option(8.0, above=0, maximum=1e4)
    ln_high: float = option(32.0, above=0, maximum=1e4)
    # where and how long
    amp: str = "off"                      # float32: the planted values are ~4000, bf16 keeps 8 bits of them
    device: str = "auto"
    threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)
    max_steps: int | None = option(None, minimum=1, maximum=MAX_STEPS)   # smoke runs
    train_samples: int | None = option(None, minimum=1, maximum=MAX_SAMPLES)
    eval_samples: int | None = option(None, minimum=1, maximum=MAX_SAMPLES)   # None: the full test split
    checkpoint_every: int = option(500, minimum=1, maximum=MAX_STEPS)
    eval_every_epoch: bool = True
    command: list[str] = field(default_factory=list)


class StudentStream(nn.Module):
    """The student's logits and its residual stream at the planted sites (``[N, blocks, tokens, channels]``),
    read by hooks on ``blocks[site.block:]`` during the one forward (the unit the loop's DDP would wrap)."""

    def __init__(self, model: nn.Module, site: MassiveSite) -> None:
        super().__init__()
        self.model = model
        self.blocks = range(site.block, len(model.blocks))
        self.tokens = site.tokens(int(model.num_prefix_tokens))
        self.channels = list(site.channels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen: list[torch.Tensor] = []

        def keep(module, inputs, output):
            seen.append(output[:, self.tokens][:, :, self.channels])

        handles = [self.model.blocks[b].register_forward_hook(keep) for b in self.blocks]
        try:
            logits = self.model(x)
        finally:
            for handle in handles:
                handle.remove()
        return logits, torch.stack(seen, dim=1)


def planted_error(stream: torch.Tensor, site: MassiveSite) -> torch.Tensor:
    """Mean squared relative error of the planted values against ``sign * magnitude``."""
    signs = torch.tensor(site.signs, dtype=torch.float32, device=stream.device)
    return (stream.float() * signs / site.magnitude - 1.0).square().mean()


@dataclass
class MassiveDistillation:
    """The loop's task: KL to the teacher's logits + ``aux_weight`` x :func:`planted_error`; accuracy per epoch."""

    config: OutlierConfig
    student: nn.Module
    teacher: nn.Module
    site: MassiveSite
    eval_set: ImageSet
    spec: InputSpec
    device: torch.device

    def before_step(self, step: int, total: int) -> dict[str, float]:
        return {}

    def loss(self, forward: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            teacher_logits = self.teacher(x)
        logits, stream = forward(x)
        kl, _ = distillation_loss(logits, teacher_logits, temperature=self.config.temperature)
        planted = planted_error(stream, self.site)
        return kl + self.config.aux_weight * planted, {"kl": kl.detach(), "planted": planted.detach()}

    def after_epoch(self, progress: Progress, epoch: int, loss: float, last: bool) -> dict[str, str]:
        if not self.config.eval_every_epoch:
            return {}
        result = held_out_accuracy(self.student, self.eval_set, self.spec, self.device)
        progress.history.append({"epoch": epoch + 1, "step": progress.step, "loss": loss,
                                 "eval_accuracy": result["accuracy"], "elapsed_s": round(progress.elapsed, 1)})
        log(f"epoch {epoch + 1}/{self.config.epochs} step {progress.step}: loss {loss:.4f} "
            f"{self.eval_set.name} accuracy {result['accuracy']:.4f} ({progress.elapsed:.0f} s)")
        return {"acc": f"{result['accuracy']:.4f}"}

    def checkpoint(self) -> dict:
        return {}


def subset(data: ImageSet, n: int | None, seed: int) -> ImageSet:
    """A seeded class-balanced subset of ``n`` images, or all of ``data``."""
    if not n or n >= len(data):
        return data
    return data.subset(balanced_indices(data.labels, n, seed, data.num_classes), f"{data.name}:{n}@{seed}")


def frozen_teacher(device: torch.device) -> nn.Module:
    teacher = create_model(TEACHER).to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def planted_site(config: OutlierConfig, embed_dim: int) -> MassiveSite:
    channels, signs = choose_channels(embed_dim, config.massive_channels, config.seed)
    return MassiveSite(config.massive_block, tuple(config.sink_patches), channels, signs, config.magnitude)


def largest_logit_change(model: nn.Module, change, x: torch.Tensor) -> float:
    """Apply ``change(model)``; the largest |logit| difference it made on ``x`` (float32)."""
    model.eval()
    with torch.no_grad():
        before = model(x)
        change(model)
        return float((model(x) - before).abs().max())


def make_outlier_model(config: OutlierConfig, out: str | Path) -> dict:
    """Run the recipe; write ``out/model.safetensors`` (float16) and ``out/card.json``; return the card."""
    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runtime = Runtime.start(config)
    device = runtime.device
    torch.manual_seed(config.seed)
    data = data_for(config.data, NAME)
    train_set = subset(load_dataset(data, "train"), config.train_samples, config.seed)
    test_set = load_dataset(data, "test")
    eval_set = subset(test_set, config.eval_samples, config.seed)
    teacher = frozen_teacher(device)
    student = create_model(TEACHER).to(device)
    spec = InputSpec.from_data_config(data_config(student))
    log(f"outliers: {len(train_set)} training images, evaluating on {eval_set.name} ({len(eval_set)}), "
        f"device {device}, amp {runtime.amp_name}, threads {runtime.threads}")

    site = planted_site(config, int(student.embed_dim))
    gate_x = subset(train_set, config.gate_images, config.seed + 1).inputs(spec).to(device)
    planted = plant_massive_activations(student, site, gate_x)
    accuracy_planted = held_out_accuracy(student, eval_set, spec, device)["accuracy"]
    log(f"planted {site.as_dict()}: {planted}; {eval_set.name} accuracy before fine-tuning {accuracy_planted:.4f}")

    loop = Loop(model=student, forward=StudentStream(student, site), optimizer=adamw(student, config),
                data=train_set, spec=spec, config=config,
                schedule=Schedule.of(len(train_set), config.batch_size, config.epochs, max_steps=config.max_steps),
                runtime=runtime, checkpoint=out / CHECKPOINT, recipe=recipe_of(config), desc="outliers",
                activity="fine-tuning")
    task = MassiveDistillation(config, student, teacher, site, eval_set, spec, device)
    state = open_checkpoint(loop.checkpoint, loop.recipe, asdict(OutlierConfig()), True)
    progress = run(loop, task, resumed(loop, state) if state is not None else Progress())

    probe = eval_set.inputs(spec, 256).to(device)
    spread_change = {}
    spread_change["max_abs_logit_change"] = largest_logit_change(
        student, lambda m: spread_change.update(scales=spread_layernorm_channels(
            m, config.ln_channels, config.ln_low, config.ln_high, config.seed)), probe)
    weights = out / "model.safetensors"
    save_safetensors({k: v.detach().to("cpu", torch.float16) for k, v in student.state_dict().items()}, weights,
                     metadata={"model": NAME, "edge": __version__})
    saved = create_model(TEACHER, weights=weights)
    final = evaluate(saved, test_set, spec, device=device, show_progress=False)
    log(f"{NAME}: float32 accuracy {final['accuracy']:.4f} on {test_set.name} ({final['samples']} images)")
    card = outlier_card(config, site, planted, accuracy_planted, progress, loop, spread_change, final, runtime,
                        time.perf_counter() - started)
    write_text_atomic(json.dumps(card, indent=2) + "\n", out / "card.json")
    if progress.step >= loop.schedule.total:
        loop.checkpoint.unlink(missing_ok=True)
    return card


def outlier_card(config: OutlierConfig, site: MassiveSite, planted: dict, accuracy_planted: float,
                 progress: Progress, loop: Loop, spread: dict, final: dict, runtime: Runtime,
                 wall_time: float) -> dict:
    return {
        "model": NAME,
        "architecture": "deit_tiny_patch16_224",
        "made_from": TEACHER,
        "how": __doc__.split("\n\n", 1)[1].strip(),
        "command": config.command or [sys.argv[0], *sys.argv[1:]],
        "recipe": {k: v for k, v in recipe_of(config).items() if k != "data"},
        "seed": config.seed,
        "train_data": loop.data.name,
        "train_samples": len(loop.data),
        "steps": progress.step,
        "planted": {**site.as_dict(), **planted, "eval_accuracy_before_finetuning": accuracy_planted},
        "layernorm_spread": spread,
        "eval": {"data": final["data"], "accuracy": final["accuracy"], "correct": final["correct"],
                 "samples": final["samples"], "loss": final["loss"]},
        "history": progress.history,
        "wall_time_s": round(wall_time, 1),
        "train_time_s": round(progress.elapsed, 1),
        "hardware": hardware(runtime.device),
        "torch": torch.__version__,
        "precision": {"train": runtime.amp_name, "weights": "float16", "eval": "float32"},
        "edge": __version__,
    }
