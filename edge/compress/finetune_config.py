"""The distillation recipe of ``edge finetune`` (:mod:`edge.compress.finetune`): its options and their checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edge.config import MAX_BATCH, MAX_EPOCHS, MAX_SAMPLES, MAX_SEED, MAX_STEPS, MAX_THREADS, option
from edge.errors import EdgeError

TRAINABLE = ("all", "replaced")
DILUTION_SCHEDULES = ("linear", "cosine")


@dataclass
class FinetuneConfig:
    """The distillation recipe. ``None`` fields mean "default", resolved in :func:`finetune`."""

    data: str | None = None   # None: the bundled model's data set (edge.models.data_for); other models need it
    epochs: int = option(1, minimum=1, maximum=MAX_EPOCHS)
    # schedule length in steps (default: epochs x steps per epoch)
    steps: int | None = option(None, minimum=1, maximum=MAX_STEPS)
    # stop early (a shortened run of the same schedule)
    max_steps: int | None = option(None, minimum=1, maximum=MAX_STEPS)
    train_samples: int | None = option(None, minimum=1, maximum=MAX_SAMPLES)  # train on a seeded class-balanced subset
    batch_size: int = option(128, minimum=1, maximum=MAX_BATCH)
    lr: float = option(1e-4, above=0, maximum=10)
    min_lr: float = option(1e-6, minimum=0, maximum=10)
    weight_decay: float = option(0.05, minimum=0, maximum=10)
    warmup_steps: int = option(50, minimum=0, maximum=MAX_STEPS)
    grad_clip: float = option(1.0, minimum=0, maximum=1e6)
    temperature: float = option(2.0, above=0, maximum=100)
    alpha: float = option(0.0, minimum=0, maximum=1)  # weight of the hard-label cross-entropy (1 - alpha on the KL)
    feature_weight: float = option(0.0, minimum=0, maximum=1e6)  # weight of the MSE between pre-logit features
    train: str = "all"                    # all | replaced
    augment: bool = True                  # random shift of up to 2 px and horizontal flip (both models)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    eval_data: str | None = None          # held-out set: the test split of this (default: ``data``)
    # seeded class-balanced subset of it (default: all)
    eval_samples: int | None = option(None, minimum=1, maximum=MAX_SAMPLES)
    eval_every_epoch: bool = True
    teacher: str | None = None            # default: the artifact's source model
    teacher_weights: str | None = None
    amp: str = "auto"                     # auto | bf16 | fp16 | off
    device: str = "auto"                  # auto | cpu | cuda[:N]
    threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)
    checkpoint_every: int = option(100, minimum=1, maximum=MAX_STEPS)
    dilute: bool = False                  # dilution learning: the removed attention faded out (mask M 1 -> 0)
    # M decays over the first 0.75 of the steps, then a quarter of the run trains the exact saved
    # structure at M = 0 (why 0.75: edge/compress/dilution.py)
    dilution_fraction: float = option(0.75, above=0, maximum=1)
    dilution_schedule: str = "linear"     # linear | cosine (shape of M's decay in the step index)
    piad: bool = False                    # progressive importance-aware dropout of a wpac model (edge/compress/piad.py)
    piad_target: float = option(0.75, above=0, below=1)  # share of the MACs the dropout list grows to drop
    # epochs over which the list grows (default: half of --epochs, rounded up; the rest trains the whole list)
    piad_epochs: int | None = option(None, minimum=1, maximum=MAX_EPOCHS)
    piad_samples: int = option(1024, minimum=1, maximum=MAX_SAMPLES)  # proxy images the units are ranked on
    command: list[str] = field(default_factory=list)


def check_config(config: FinetuneConfig) -> None:
    """Refuse option values outside their range before anything is loaded or written."""
    problems = [
        (config.train not in TRAINABLE, "train", config.train, f"one of {', '.join(TRAINABLE)}"),
        (config.temperature <= 0, "temperature", config.temperature, "> 0"),
        (not 0 <= config.alpha <= 1, "alpha", config.alpha, "between 0 and 1"),
        (config.feature_weight < 0, "feature-weight", config.feature_weight, ">= 0"),
        (config.epochs < 1, "epochs", config.epochs, ">= 1"),
        (config.steps is not None and config.steps < 1, "steps", config.steps, ">= 1"),
        (config.max_steps is not None and config.max_steps < 0, "max-steps", config.max_steps, ">= 0"),
        (config.batch_size < 1, "batch-size", config.batch_size, ">= 1"),
        (config.lr <= 0, "lr", config.lr, "> 0"),
        (config.amp not in ("auto", "bf16", "fp16", "off"), "amp", config.amp, "auto, bf16, fp16 or off"),
        (config.checkpoint_every < 1, "checkpoint-every", config.checkpoint_every, ">= 1"),
        (not 0 < config.dilution_fraction <= 1, "dilution-fraction", config.dilution_fraction,
         "in (0, 1]: M decays from 1 to 0 over that part of the steps and must end at 0, the model kept"),
        (config.dilution_schedule not in DILUTION_SCHEDULES, "dilution-schedule", config.dilution_schedule,
         " or ".join(DILUTION_SCHEDULES)),
    ]
    for bad, name, value, expected in problems:
        if bad:
            raise EdgeError(f"--{name} {value} is not a valid fine-tuning option", expected=expected,
                            fix=f"pass --{name} with a value {expected}")
    defaults = FinetuneConfig()
    if not config.dilute and (config.dilution_fraction, config.dilution_schedule) != \
            (defaults.dilution_fraction, defaults.dilution_schedule):
        raise EdgeError("--dilution-fraction and --dilution-schedule shape the mask of dilution learning, which "
                        "is off", fix="add --dilute, or drop the dilution options")
    if not config.piad and (config.piad_target, config.piad_epochs, config.piad_samples) != \
            (defaults.piad_target, defaults.piad_epochs, defaults.piad_samples):
        raise EdgeError("--piad-target, --piad-epochs and --piad-samples shape progressive importance-aware dropout, "
                        "which is off", fix="add --piad, or drop the PIAD options")
    if not 0 < config.piad_target < 1:
        raise EdgeError(f"--piad-target {config.piad_target} is not a valid fine-tuning option",
                        expected="a share of the MACs in (0, 1) for the dropout list to drop",
                        fix="pass e.g. --piad-target 0.75 (sub-networks down to a quarter of the MACs)")
    if config.piad_epochs is not None and config.piad_epochs > config.epochs:
        raise EdgeError(f"--piad-epochs {config.piad_epochs} is more than --epochs {config.epochs}: the dropout list "
                        "would not reach its target within the schedule", fix="pass --piad-epochs <= --epochs")


def piad_epochs(config: FinetuneConfig) -> int:
    """The epochs over which PIAD's dropout list grows: ``piad_epochs``, default half of ``epochs`` rounded up."""
    return config.piad_epochs if config.piad_epochs is not None else math.ceil(config.epochs / 2)
