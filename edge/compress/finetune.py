"""Fine-tune a compressed model by knowledge distillation from the model it was compressed from.

The student (:mod:`edge.compress.student`) is an artifact of ``edge compress``, a model spec with a
weights file (e.g. a model pruned by another tool), or, through :func:`distil`, a module of the
user's own code; one recipe serves all three. The teacher is ``--teacher`` (``teacher=``), else the
artifact's source model (its manifest names the model, weights and input size; the bundled
reference model rebuilds from its name) or the spec's own model. Each step feeds the same seeded,
augmented batch to both models and minimises (Hinton et al.)

    L = (1 - alpha) * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))
        + alpha * CE(z_s, y) + beta * MSE(f_s, f_t)

with ``z`` the logits, ``f`` the pre-logit features (after pooling and ``fc_norm``), AdamW,
linear warm-up then cosine decay (the schedule of ``edge train``). ``train=all`` trains every
parameter of the student; ``train=replaced`` only the modules the compression put in (the
registered methods' ``module_types``, e.g. ``DepthwiseAttention``, ``ApproximatedSpan``); buffers
(``prefix=pool`` weights) stay fixed.
``all`` is the default, measured on a short run: fmnist-deit-tiny, ``dwconv:auto=6:init=lsq``
(training-free 0.588, original 0.873 on 1000 test images), 60 steps of batch 64 on 3,840
training images: ``all`` 0.807, ``replaced`` 0.732
(benchmarks/results/dwconv_finetune_train_mode.json).

Determinism and resuming follow ``edge train``: epoch ``e`` visits the training set in the
order ``randperm(N, seed=(seed, e))``, step ``s`` draws its augmentation from ``(seed, s)``,
and ``OUT/checkpoint.pt`` (model, optimizer, step, recipe) is continued by the same command;
a checkpoint of another recipe, student or teacher is refused. It is kept only while resumable
work remains (a ``max_steps`` stop, Ctrl-C, a crash): a finished run's artifact holds none. The
result is an artifact like the one it started from (same plan and modules, restorable by :func:`load_artifact`), whose
manifest gains a ``finetune`` record: recipe, teacher, held-out accuracy before and after.

``dilute`` (dilution learning, :mod:`edge.compress.dilution`): a method may train its modules
through a temporary structure, a :class:`~edge.compress.method.TrainingPhase` it returns from
``training_phase``; here the removed attention of each MLP-only block comes back from the
teacher and is faded out, its mask M set every step. The phase's state travels in the
checkpoint; evaluations record M; the artifact is written only once every phase is ``final``
(M = 0) and has been converted to its final structure: a run stopped earlier (``max_steps``)
leaves only the checkpoint, to be continued.

Many processes (``torchrun --nproc_per_node N -m edge finetune ...``): PyTorch's
DistributedDataParallel, gloo on the CPU, NCCL on GPUs (one GPU per process). The global batch
stays ``batch_size``: every process draws the same global batch the one-process run draws and
takes its rows (:func:`edge.distributed.batch_rows`); its loss is weighted by its share of the
rows, so the averaged gradient is the gradient of the global batch mean, and the weights equal the
one-process run's up to the order of float additions. The held-out evaluations are sharded: every
process scores its share of the images and the counts and loss sums are added (:func:`edge.train.
held_out_accuracy`). Only the main process writes the checkpoint and the artifact and prints; the
others wait for it at a barrier and end with it.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edge import __version__, distributed
from edge.compress.artifact import WEIGHTS, is_artifact, save_artifact, source_state_sha256
from edge.compress.load import load_model
from edge.compress.method import TrainingPhase
from edge.compress.registry import methods, module_types
from edge.compress.student import ENTRY_POINT, Student, check_classifier, load_student, module_student, own_data_config
from edge.config import MAX_BATCH, MAX_EPOCHS, MAX_SAMPLES, MAX_SEED, MAX_STEPS, MAX_THREADS, option
from edge.data import load_dataset
from edge.data.preprocess import ArrayPreprocess, InputSpec
from edge.data.sampler import balanced_indices
from edge.errors import EdgeError, plural
from edge.models import parse_model_spec
from edge.models.weights_io import load_weights, read_state_dict
from edge.progress import bar, log
from edge.runtime import hardware, resolve_amp, resolve_device, set_threads
from edge.train import (
    atomic_torch_save,
    check_global_batch,
    found_by_all,
    held_out_accuracy,
    learning_rate,
    load_checkpoint,
    param_groups,
    training_batch,
    training_set,
)

CHECKPOINT = "checkpoint.pt"
TRAINABLE = ("all", "replaced")
DILUTION_SCHEDULES = ("linear", "cosine")
# Not part of the recipe a checkpoint must match: where/how fast it runs, when it saves, where it stops.
RUN_ONLY = ("command", "checkpoint_every", "threads", "device", "eval_every_epoch", "max_steps")


@dataclass
class FinetuneConfig:
    """The distillation recipe. ``None`` fields mean "default", resolved in :func:`finetune`."""

    data: str = "fmnist"
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


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      labels: torch.Tensor | None = None, *, temperature: float = 1.0, alpha: float = 0.0,
                      student_features: torch.Tensor | None = None, teacher_features: torch.Tensor | None = None,
                      feature_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of the module docstring, in float32; returns ``(loss, parts)`` with ``parts["kl"]`` etc.

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


def select_trainable(model: nn.Module, which: str, extra_types: tuple[type[nn.Module], ...] = ()) -> int:
    """Set ``requires_grad`` for ``train=all|replaced``; returns the number of trainable parameters.

    ``replaced`` trains the registered methods' modules and ``extra_types`` (training phases' modules).
    """
    if which not in TRAINABLE:
        raise EdgeError(f"--train {which}", expected=f"one of {', '.join(TRAINABLE)}")
    for p in model.parameters():
        p.requires_grad_(which == "all")
    if which == "replaced":
        for module in model.modules():
            if isinstance(module, (*module_types(), *extra_types)):
                for p in module.parameters():
                    p.requires_grad_(True)
    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if not count:
        raise EdgeError("the compressed model has no parameters to train with --train replaced",
                        found="its replaced modules have no parameters (identity or skip spans)",
                        fix="use --train all")
    return count


def teacher_reference(manifest: dict, config: FinetuneConfig) -> dict:
    """How to build the teacher: ``--teacher``/``--teacher-weights``, else the teacher the manifest names (that of
    an earlier fine-tune, or a model student's own model), else the artifact's source model."""
    default = manifest.get("teacher") or manifest.get("source") or {}
    if config.teacher:
        reference = {"model": config.teacher, "weights": config.teacher_weights, "img_size": None}
    else:
        reference = {"model": default.get("model"), "weights": config.teacher_weights or default.get("weights"),
                     "img_size": default.get("img_size")}
    spec = reference["model"]
    if not spec:
        raise EdgeError("no teacher to distil from: the student names no source model",
                        fix="pass --teacher MODEL (and --teacher-weights), or teacher= in Python")
    if reference["weights"] is None and not (Path(spec).exists() and is_artifact(spec)) \
            and parse_model_spec(spec).bundled is None:
        raise EdgeError(f"the teacher {spec} has no weights (it would be randomly initialised)",
                        expected="a bundled model, an artifact, or a timm architecture with --teacher-weights",
                        fix="pass --teacher-weights with the weights of the model to distil from (the one the "
                            "student was compressed or pruned from)")
    return reference


def build_teacher(reference: dict) -> nn.Module:
    teacher = load_model(reference["model"], weights=reference["weights"], img_size=reference["img_size"])
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.eval()


def held_out_set(config: FinetuneConfig):
    """The held-out images the fine-tune scores on: the test split of ``eval_data``, seeded subset if asked."""
    data = load_dataset(config.eval_data or config.data, "test")
    if config.eval_samples and config.eval_samples < len(data):
        indices = balanced_indices(data.labels, config.eval_samples, config.seed, data.num_classes)
        data = data.subset(indices, f"{data.name}:eval{config.eval_samples}@{config.seed}")
    return data


def training_phases(student: nn.Module, teacher: nn.Module, config: FinetuneConfig, where: str,
                    steps: list[dict]) -> list[TrainingPhase]:
    """The training phases of the methods the artifact's plan applied (``steps``: its step entries;
    ``config.steps`` resolved); none changes ``student`` yet. Only the plan's own methods are asked: two
    methods may put modules of one type (an MLP-only block) into models, and each trains only its own."""
    used = {step["method"]: tuple(s for s in steps if s["method"] == step["method"]) for step in steps}
    phases = [p for m in methods() if m.name in used
              and (p := m.training_phase(student, teacher, config, used[m.name])) is not None]
    names = {p.name for p in phases}
    if config.dilute and "dilution" not in names:
        raise EdgeError(f"--dilute: nothing in {where} can be diluted", expected="an artifact whose plan removes "
                        "attention sub-layers (MLP-only blocks) and an edge with the method that removed them",
                        fix="compress with an attnrm step, or fine-tune without --dilute")
    if config.piad and "piad" not in names:
        raise EdgeError(f"--piad: {where} has no width-compressed (wpac) blocks to train as a super-network",
                        expected="an artifact of `edge compress MODEL --plan wpac:keep=1` (full widths in WPAC's "
                                 "order) or of a wpac:macs=F plan",
                        fix="compress the model with a wpac step first, or fine-tune without --piad")
    return phases


def _resume(state: dict, student: nn.Module, optimizer: torch.optim.Optimizer,
            phases: list[TrainingPhase]) -> tuple[int, list, float]:
    """Load a checkpoint into the student, optimizer and phases: (step, history, elapsed)."""
    student.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for phase in phases:
        phase.load_state_dict(state["phases"][phase.name])
    return int(state["step"]), list(json.loads(state["history"])), float(state["elapsed"])


def _accuracy(model: nn.Module, data, spec: InputSpec, device: torch.device) -> dict:
    result = held_out_accuracy(model, data, spec, device)
    return {"data": result["data"], "samples": result["samples"], "accuracy": result["accuracy"],
            "loss": result["loss"]}


def check_out(out: Path, student: str | Path | Student) -> None:
    """Refuse an ``out`` that is the student's own folder, a file, or a folder of something else."""
    folder = student.folder if isinstance(student, Student) else Path(student)
    if folder is not None and folder.exists() and out.resolve() == folder.resolve():
        raise EdgeError(f"--out {out} is the artifact being fine-tuned", fix="write the result to another folder")
    if out.exists() and not out.is_dir():
        raise EdgeError(f"--out {out} is a file", fix="choose a new folder")
    if out.exists() and not is_artifact(out) and any(p.name != CHECKPOINT for p in out.iterdir()):
        raise EdgeError(f"--out {out} exists and is not an edge artifact", fix="choose a new or empty folder")


def resolve_teacher(manifest: dict, config: FinetuneConfig, module: nn.Module | None) -> tuple[dict, nn.Module]:
    """The teacher's reference (what the record names) and the frozen teacher: ``module`` if given (Python)."""
    if module is None:
        reference = teacher_reference(manifest, config)
        return reference, build_teacher(reference)
    if config.teacher or config.teacher_weights:
        raise EdgeError("a teacher module and --teacher/--teacher-weights were both given", fix="give one teacher")
    for p in module.parameters():
        p.requires_grad_(False)
    cls = f"{type(module).__module__}.{type(module).__qualname__}"
    return {"model": f"Python module {cls}", "weights": None, "img_size": None}, module.eval()


def input_config(source: Student, teacher: nn.Module, reference: dict) -> dict:
    """The timm data config both models are fed with: the student's own, else the teacher's."""
    config = source.data_config or own_data_config(teacher)
    if config is None:
        raise EdgeError(f"neither the student {source.where} nor the teacher {reference['model']} says which inputs "
                        "it takes", expected="a timm ViT on either side, or a data config",
                        fix="pass data_config={'input_size': (C, H, W), 'mean': ..., 'std': ...} to distil()")
    return config


def check_pair(source: Student, student: nn.Module, teacher: nn.Module, reference: dict, spec: InputSpec,
               data, config: FinetuneConfig, device: torch.device) -> None:
    """Refuse a student/teacher pair the recipe cannot distil, before anything is written."""
    size = (spec.channels, spec.height, spec.width)
    for role, model, where in (("student", student, source.where), ("teacher", teacher, reference["model"])):
        check_classifier(model, size, data.num_classes, data.name, role=role, where=where, device=device)
    if config.feature_weight and not all(hasattr(m, a) for m in (student, teacher)
                                         for a in ("forward_features", "forward_head", "head")):
        raise EdgeError(f"--feature-weight {config.feature_weight} needs the pre-logit features of both models",
                        expected="timm models (forward_features, forward_head, head)",
                        fix="drop --feature-weight (distil the logits only)")
    if source.kind == "artifact":
        return
    if config.train == "replaced":
        raise EdgeError(f"--train replaced trains the modules a compression put in; {source.where} has none "
                        "(it is no artifact of `edge compress`)", fix="use --train all")
    if config.alpha == 0 and source.sha256 == source_state_sha256(teacher):
        raise EdgeError(f"the student {source.where} and the teacher {reference['model']} are the same weights: "
                        "the distillation loss is 0 and only weight decay would move them",
                        fix="pass the student's own weights (--weights), or another teacher (--teacher, "
                            "--teacher-weights)")


def finetune(source: str | Path | Student, out: str | Path, config: FinetuneConfig, *,
             weights: str | Path | None = None, teacher: nn.Module | None = None, resume: bool = True,
             student_name: str | None = None) -> dict:
    """Distil the teacher into the student; write the result as an artifact at ``out``.

    ``source`` (the student): an artifact folder (the teacher defaults to its source model), a model spec with its
    ``weights`` (the teacher defaults to the spec's own model), or a :class:`Student` (:func:`distil`
    makes one of a Python module). ``teacher``: a teacher module (Python only; default: built from
    ``config.teacher``, else the student's default). Returns the ``finetune`` record added to the
    manifest. With ``resume`` (default) an existing ``out/checkpoint.pt`` of the same recipe, student
    and teacher is continued. ``student_name`` replaces the artifact's path in the record (for a
    temporary artifact).
    """
    check_config(config)
    out = Path(out)
    check_out(out, source)
    source = source if isinstance(source, Student) else load_student(source, weights=weights)
    folder = source.where

    threads = set_threads(config.threads)
    device = distributed.local_device(resolve_device(config.device))
    distributed.init(device)
    amp_dtype = resolve_amp(config.amp, device)
    student, manifest = source.model, source.manifest
    reference, teacher = resolve_teacher(manifest, config, teacher)
    teacher = teacher.to(device)
    student = student.to(device)
    spec = InputSpec.from_data_config(input_config(source, teacher, reference))
    preprocess = ArrayPreprocess(spec)
    train_set = training_set(config.data, config.train_samples, config.seed)
    held_out = held_out_set(config)
    check_pair(source, student, teacher, reference, spec, train_set, config, device)

    check_global_batch(len(train_set), config.batch_size)
    steps_per_epoch = math.ceil(len(train_set) / config.batch_size)
    total_steps = config.steps or steps_per_epoch * config.epochs
    last_step = min(total_steps, total_steps if config.max_steps is None else config.max_steps)
    phases = training_phases(student, teacher, replace(config, steps=total_steps, piad_epochs=piad_epochs(config)),
                             folder, manifest.get("steps", []))
    teacher_sha = source_state_sha256(teacher)
    recipe = {**{k: v for k, v in asdict(config).items() if k not in RUN_ONLY},
              "student_sha256": source.sha256, "teacher_sha256": teacher_sha}

    step, history, elapsed = 0, [], 0.0
    checkpoint_path = out / CHECKPOINT
    state = None
    if resume and found_by_all(checkpoint_path):
        # refuse another recipe before any work; fields added in later versions compare as their defaults
        state = load_checkpoint(checkpoint_path, recipe, asdict(FinetuneConfig()))
    else:  # the compressed model as it came, before any phase changes it
        history.append({"epoch": 0, "step": 0, **_accuracy(student, held_out, spec, device)})
    for phase in phases:
        phase.start()
    trainable = select_trainable(student, config.train, tuple(t for p in phases for t in p.module_types))
    optimizer = torch.optim.AdamW(param_groups(student, config.weight_decay), lr=config.lr, betas=(0.9, 0.999))
    if state is not None:
        step, history, elapsed = _resume(state, student, optimizer, phases)
        del state
        log(f"resuming {checkpoint_path} at step {step}/{last_step}")
    elif distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)

    def save_checkpoint() -> None:
        if not distributed.is_main():
            return
        atomic_torch_save({"model": student.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                           "recipe": recipe, "history": json.dumps(history), "elapsed": elapsed,
                           "phases": {p.name: p.state_dict() for p in phases}}, checkpoint_path)

    log(f"finetune {folder}{f' ({plan})' if (plan := manifest.get('plan')) else ''} from {reference['model']} "
        f"on {train_set.name} "
        f"({len(train_set)} images): {plural(last_step, 'step')} ({steps_per_epoch}/epoch), train={config.train} "
        f"({trainable:,} parameters), device {device}, amp {amp_dtype}, threads {threads}"
        f"{_processes_note(config.batch_size)}")
    for phase in phases:
        log(f"{phase.name}: {phase.record()}")
    features = bool(config.feature_weight)
    values = {k: v for phase in phases for k, v in phase.state_dict().items()   # until the first step sets them
              if isinstance(v, int | float)}
    trainer = distributed.data_parallel(StudentOutputs(student, features), device, find_unused=bool(phases))
    student.train()
    started = time.perf_counter() - elapsed
    with bar(total=last_step, initial=step, desc="finetune", unit="step") as progress:
        while step < last_step:
            epoch, images, labels = training_batch(train_set, step, config.batch_size, config.seed, config.augment)
            rows = distributed.batch_rows(len(labels))       # this process's rows of the global batch
            share = (rows.stop - rows.start) / len(labels)
            x, y = preprocess(images[rows]).to(device), labels[rows].to(device)
            values = {k: v for phase in phases for k, v in phase.step(step, total_steps).items()}
            lr = learning_rate(step, total_steps, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                with torch.no_grad():
                    teacher_logits, teacher_features = logits_and_features(teacher, x, features)
                student_logits, student_features = trainer(x)
            local, parts = distillation_loss(student_logits, teacher_logits, y, temperature=config.temperature,
                                             alpha=config.alpha, student_features=student_features,
                                             teacher_features=teacher_features, feature_weight=config.feature_weight)
            # the global batch's mean loss and KL (the sum of every process's share; the same on all)
            loss, kl = distributed.all_reduce_sum(torch.stack([local.detach(), parts["kl"]]) * share).unbind()
            if not torch.isfinite(loss):
                raise EdgeError(f"fine-tuning diverged at step {step}: loss is {float(loss)}",
                                fix="lower --lr or use --amp off")
            optimizer.zero_grad(set_to_none=True)
            # DDP averages the processes' gradients: weighted by its share of the rows, each adds its part of
            # the gradient of the global batch mean (the weight is exactly 1 in one process)
            (local * (share * distributed.world_size())).backward()
            if config.grad_clip:
                torch.nn.utils.clip_grad_norm_([p for p in student.parameters() if p.requires_grad],
                                               config.grad_clip)
            optimizer.step()
            step += 1
            elapsed = time.perf_counter() - started
            postfix = {"epoch": epoch, "loss": f"{loss.item():.4f}", "kl": f"{kl.item():.4f}",
                       "lr": f"{lr:.2e}", **{k: f"{v:.3f}" for k, v in values.items()}}
            epoch_done = step % steps_per_epoch == 0
            if epoch_done and config.eval_every_epoch and step < last_step:
                result = _accuracy(student, held_out, spec, device)
                student.train()
                history.append({"epoch": epoch + 1, "step": step, "train_loss": loss.item(), **result,
                                "elapsed_s": round(elapsed, 1), **_phase_state(phases, values)})
                postfix["acc"] = f"{result['accuracy']:.4f}"
                log(f"epoch {epoch + 1} step {step}: loss {loss.item():.4f} {held_out.name} accuracy "
                    f"{result['accuracy']:.4f}{_phase_note(phases, values)} ({elapsed / 60:.1f} min)")
            progress.set_postfix(postfix, refresh=False)
            progress.update(1)
            if step % config.checkpoint_every == 0 or epoch_done or step == last_step:
                save_checkpoint()

    before = history[0]
    complete = all(phase.final for phase in phases)
    final, stopped = None, None
    if complete:
        for phase in phases:
            phase.finish()
        student.eval()
        final = _accuracy(student, held_out, spec, device)
        log(f"{held_out.name} accuracy {before['accuracy']:.4f} -> {final['accuracy']:.4f} "
            f"after {plural(step, 'step')}")
    else:
        stopped = f"at step {step} of {total_steps} with {_values_text(values)}, before the final structure"
        log(f"stopped {stopped}: no artifact written (it is kept only in its final structure), only "
            f"{checkpoint_path}; run the same command without --max-steps to continue")
    record = {
        "recipe": {**recipe, "max_steps": config.max_steps},
        "teacher": {**reference, "sha256": teacher_sha},
        "student": {**source.record, **({"artifact": student_name} if student_name else {}),
                    "sha256": recipe["student_sha256"]},
        "trainable_params": trainable,
        "steps": step,
        "schedule_steps": total_steps,
        "epochs": round(step / steps_per_epoch, 4),
        "train_data": train_set.name,
        "train_samples": len(train_set),
        "eval_before": {k: before[k] for k in ("data", "samples", "accuracy", "loss")},
        "eval": final,
        "artifact": str(out) if complete else None,
        "stopped": stopped,
        "history": history,
        "command": config.command or [sys.argv[0], *sys.argv[1:]],
        "wall_time_s": round(elapsed, 1),
        "hardware": hardware(device),
        "precision": {"train_amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "float32",
                      "weights": "float32", "eval": "float32"},
        "edge": __version__,
    }
    if phases:
        record["phases"] = {phase.name: phase.record() for phase in phases}
    if distributed.active():
        record["processes"] = distributed.world_size()
    if complete and distributed.is_main():
        stages = [*manifest.get("finetune", []), record]
        # the teacher a later fine-tune of this artifact distils from by default (a module cannot be rebuilt)
        named = {"teacher": reference} if not reference["model"].startswith("Python module") else {}
        # the checkpoint stays only while resumable work remains (a --max-steps stop); a finished run drops it
        for phase in phases:   # what the trained structure offers (PIAD: the sub-network order)
            manifest = phase.manifest(manifest)
        save_artifact(student.cpu(), out, {**manifest, **named, "finetune": stages},
                      keep=(CHECKPOINT,) if step < total_steps else (), drop=(CHECKPOINT,))
    distributed.barrier()   # the others return once the main process has written
    return record


def _processes_note(batch_size: int) -> str:
    if not distributed.active():
        return ""
    processes = distributed.world_size()
    rows = batch_size // processes
    share = f"{rows}" if batch_size % processes == 0 else f"{rows}-{rows + 1}"
    return f", {processes} processes (DistributedDataParallel), {share} rows of each global batch of {batch_size} each"


def _phase_state(phases: list[TrainingPhase], values: dict) -> dict:
    """What a history entry records of the phases: their logged values and whether the model is final."""
    return {**values, "final_structure": all(p.final for p in phases)} if phases else {}


def _values_text(values: dict) -> str:
    return ", ".join(f"{k} = {v:.3g}" for k, v in values.items())


def _phase_note(phases: list[TrainingPhase], values: dict) -> str:
    if not phases:
        return ""
    shown = _values_text(values)
    return f" at {shown}" if all(p.final for p in phases) else f" at {shown} (not the final structure)"


RECIPE_ARGUMENTS = tuple(f.name for f in fields(FinetuneConfig) if f.name not in ("data", "teacher", "teacher_weights",
                                                                                   "command"))


def distil(student: nn.Module, *, out: str | Path, teacher: str | nn.Module, teacher_weights: str | Path | None = None,
           data: str = "fmnist", name: str | None = None, data_config: dict | None = None, resume: bool = True,
           **recipe) -> dict:
    """Distil ``teacher`` into a model built by your own code, with the recipe of ``edge finetune``.

    ``student``: any ``torch.nn.Module`` classifier of ``data``'s classes (e.g. a ViT pruned by another
    tool, whose widths no model spec names). ``teacher``: a model spec edge knows (with
    ``teacher_weights``), an artifact folder, or a module. ``recipe``: the options of ``edge finetune``
    as :class:`FinetuneConfig` fields (``epochs=1, lr=5e-4, batch_size=64, ...``). The inputs (size,
    mean, std) are ``data_config`` if given, else the student's own (a timm ViT), else the teacher's.

    Neither module you pass is changed. ``out`` holds the trained weights (``model.safetensors``) and a
    manifest whose ``origin`` names the student's class: edge cannot rebuild a module from it, so restore
    it with :func:`load_distilled` on a module built as ``student`` was. Returns the fine-tune record.
    """
    unknown = sorted(set(recipe) - set(RECIPE_ARGUMENTS))
    if unknown:
        raise EdgeError(f"distil() has no recipe option {', '.join(map(repr, unknown))}",
                        expected=f"FinetuneConfig fields: {', '.join(RECIPE_ARGUMENTS)}",
                        fix="check the spelling (the CLI's --max-steps is max_steps)")
    if not isinstance(teacher, (str, Path, nn.Module)):
        raise EdgeError(f"teacher= is a {type(teacher).__name__}",
                        expected="a model spec, an artifact folder, or a torch.nn.Module")
    source = module_student(copy.deepcopy(student), name=name, data_config=data_config)
    module = copy.deepcopy(teacher) if isinstance(teacher, nn.Module) else None
    config = FinetuneConfig(data=data, teacher=None if module is not None else str(teacher),
                            teacher_weights=None if teacher_weights is None else str(teacher_weights),
                            command=[f"{ENTRY_POINT}({source.record['name']}, ...)"], **recipe)
    return finetune(source, out, config, teacher=module, resume=resume)


def load_distilled(module: nn.Module, folder: str | Path) -> nn.Module:
    """Load the weights :func:`distil` wrote to ``folder`` into ``module`` (built as the student was); returns it."""
    folder = Path(folder)
    if not is_artifact(folder):
        raise EdgeError(f"{folder} is not an edge artifact", expected="the out= folder of distil()")
    load_weights(module, read_state_dict(folder / WEIGHTS), str(folder / WEIGHTS))
    return module.eval()


__all__ = ["FinetuneConfig", "check_config", "distil", "distillation_loss", "finetune", "held_out_set",
           "load_distilled", "select_trainable", "training_phases"]
