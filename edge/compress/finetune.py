"""Fine-tune a compressed model by knowledge distillation from the model it was compressed from.

The student (:mod:`edge.compress.student`) is an artifact of ``edge compress``, a model spec with a
weights file (e.g. a model pruned by another tool), or, through :func:`distil`, a module of the
user's own code; one recipe serves all three. The teacher is ``--teacher`` (``teacher=``), else the
artifact's source model (its manifest names the model, weights and input size; the bundled
reference model rebuilds from its name) or the spec's own model. Each step feeds the same seeded,
augmented batch to both models and minimises the distillation loss of :mod:`edge.train.distillation`
(Hinton et al.)

    L = (1 - alpha) * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))
        + alpha * CE(z_s, y) + beta * MSE(f_s, f_t)

with ``z`` the logits, ``f`` the pre-logit features (after pooling and ``fc_norm``), AdamW,
linear warm-up then cosine decay: the one training loop of ``edge train`` (:mod:`edge.train.loop`),
with the distillation as its task; this module builds the pair, the methods' training phases and
the artifact. ``train=all`` trains every parameter of the student; ``train=replaced`` only the
modules the compression put in (the registered methods' ``module_types``, e.g. ``DepthwiseAttention``,
``ApproximatedSpan``); buffers (``prefix=pool`` weights) stay fixed.
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
process scores its share of the images and the counts and loss sums are added
(:func:`edge.train.held_out.held_out_accuracy`). Only the main process writes the checkpoint and the
artifact and prints; the others wait for it at a barrier and end with it.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from torch import nn

from edge import __version__, distributed
from edge.compress.artifact import WEIGHTS, is_artifact, save_artifact, source_state_sha256
from edge.compress.finetune_config import TRAINABLE, FinetuneConfig, check_config, piad_epochs
from edge.compress.load import load_model
from edge.compress.method import TrainingPhase
from edge.compress.registry import methods, module_types
from edge.compress.student import ENTRY_POINT, Student, check_classifier, load_student, module_student, own_data_config
from edge.data import load_dataset
from edge.data.preprocess import InputSpec
from edge.data.sampler import balanced_indices
from edge.errors import EdgeError, plural
from edge.models import data_for, parse_model_spec
from edge.models.weights_io import load_weights, read_state_dict
from edge.progress import log
from edge.runtime import hardware
from edge.train.batches import training_set
from edge.train.checkpoint import CHECKPOINT, Progress, open_checkpoint, recipe_of
from edge.train.distillation import Distillation, StudentOutputs, values_text
from edge.train.loop import Loop, Runtime, run
from edge.train.schedule import Schedule, adamw


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


@dataclass
class Pair:
    """The student and the frozen teacher of a fine-tune, on the device, and the inputs both are fed."""

    source: Student
    student: nn.Module
    teacher: nn.Module
    reference: dict                       # how the teacher was built (what the record names)
    spec: InputSpec


def distillation_pair(source: Student, config: FinetuneConfig, module: nn.Module | None,
                      device: torch.device) -> Pair:
    """The teacher (``module``, else as ``config`` or the manifest names it) and the student, on ``device``."""
    reference, teacher = resolve_teacher(source.manifest, config, module)
    teacher = teacher.to(device)
    student = source.model.to(device)
    spec = InputSpec.from_data_config(input_config(source, teacher, reference))
    return Pair(source, student, teacher, reference, spec)


@dataclass
class Session:
    """A fine-tune ready to run: the pair, the loop and its task, where it stands."""

    pair: Pair
    loop: Loop
    task: Distillation
    progress: Progress
    trainable: int                        # trainable parameters of the student


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
    runtime = Runtime.start(config)
    pair = distillation_pair(source, config, teacher, runtime.device)
    config = replace(config, data=data_for(config.data, pair.reference.get("model"), "--data (distil(data=...))"))
    session = prepare(pair, config, runtime, out, resume)
    run(session.loop, session.task, session.progress)
    return conclude(session, out, student_name)


def prepare(pair: Pair, config: FinetuneConfig, runtime: Runtime, out: Path, resume: bool) -> Session:
    """Check the pair on the data; the methods' training phases, the task and the loop. A checkpoint of another
    recipe is refused before any work; a new run first scores the student as it came."""
    train_set = training_set(config.data, config.train_samples, config.seed)
    held_out = held_out_set(config)
    check_pair(pair.source, pair.student, pair.teacher, pair.reference, pair.spec, train_set, config, runtime.device)
    schedule = Schedule.of(len(train_set), config.batch_size, config.epochs, steps=config.steps,
                           max_steps=config.max_steps)
    task = Distillation(config, pair.student, pair.teacher, pair_phases(pair, config, schedule), held_out, pair.spec,
                        runtime.device)
    recipe = recipe_of(config, student_sha256=pair.source.sha256, teacher_sha256=source_state_sha256(pair.teacher))
    state = open_checkpoint(out / CHECKPOINT, recipe, asdict(FinetuneConfig()), resume)
    # the compressed model as it came, before any phase changes it
    history = [] if state is not None else [{"epoch": 0, "step": 0, **task.accuracy()}]
    task.start()
    trainable = select_trainable(pair.student, config.train, tuple(t for p in task.phases for t in p.module_types))
    loop = Loop(model=pair.student, forward=StudentOutputs(pair.student, task.features),
                optimizer=adamw(pair.student, config), data=train_set, spec=pair.spec,
                config=config, schedule=schedule, runtime=runtime, checkpoint=out / CHECKPOINT, recipe=recipe,
                desc="finetune", activity="fine-tuning", find_unused=bool(task.phases))
    return start(Session(pair, loop, task, Progress(history=history), trainable), state)


def pair_phases(pair: Pair, config: FinetuneConfig, schedule: Schedule) -> list[TrainingPhase]:
    """The training phases of the student's plan, for ``schedule``'s steps (PIAD's epochs resolved)."""
    resolved = replace(config, steps=schedule.total, piad_epochs=piad_epochs(config))
    return training_phases(pair.student, pair.teacher, resolved, pair.source.where,
                           pair.source.manifest.get("steps", []))


def start(session: Session, state: dict | None) -> Session:
    """Continue the checkpoint ``state`` (student, optimizer, phases) or make the output folder; log the run."""
    if state is not None:
        session.progress = session.task.resume(session.loop, state)
    elif distributed.is_main():
        session.loop.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    session.task.values = session.task.phase_values()
    log_start(session)
    return session


def log_start(session: Session) -> None:
    pair, loop, config = session.pair, session.loop, session.task.config
    runtime, manifest = loop.runtime, pair.source.manifest
    log(f"finetune {pair.source.where}{f' ({plan})' if (plan := manifest.get('plan')) else ''} from "
        f"{pair.reference['model']} on {loop.data.name} ({len(loop.data)} images): "
        f"{plural(loop.schedule.last, 'step')} ({loop.schedule.per_epoch}/epoch), train={config.train} "
        f"({session.trainable:,} parameters), device {runtime.device}, amp {runtime.amp_dtype}, "
        f"threads {runtime.threads}{_processes_note(config.batch_size)}")
    for phase in session.task.phases:
        log(f"{phase.name}: {phase.record()}")


def conclude(session: Session, out: Path, student_name: str | None) -> dict:
    """Score the result in its final structure, or say why no artifact is written; the record; the artifact."""
    complete = all(phase.final for phase in session.task.phases)
    final, stopped = (final_accuracy(session), None) if complete else (None, stopped_early(session))
    record = finetune_record(session, out if complete else None, student_name, final, stopped)
    if complete and distributed.is_main():
        save_finetuned(session, out, record)
    distributed.barrier()   # the others return once the main process has written
    return record


def final_accuracy(session: Session) -> dict:
    """Finish every phase (the student in its final structure) and score it on the held-out set."""
    task, progress = session.task, session.progress
    for phase in task.phases:
        phase.finish()
    session.pair.student.eval()
    final = task.accuracy()
    log(f"{task.held_out.name} accuracy {progress.history[0]['accuracy']:.4f} -> {final['accuracy']:.4f} "
        f"after {plural(progress.step, 'step')}")
    return final


def stopped_early(session: Session) -> str:
    """Where a run stopped before its phases' final structure (dilution at M > 0): no artifact, only the checkpoint."""
    progress, task = session.progress, session.task
    stopped = f"at step {progress.step} of {session.loop.schedule.total} with {values_text(task.values)}, before " \
              "the final structure"
    log(f"stopped {stopped}: no artifact written (it is kept only in its final structure), only "
        f"{session.loop.checkpoint}; run the same command without --max-steps to continue")
    return stopped


def finetune_record(session: Session, artifact: Path | None, student_name: str | None, final: dict | None,
                    stopped: str | None) -> dict:
    """The ``finetune`` record of the manifest (and what ``finetune`` returns)."""
    pair, loop, task, progress = session.pair, session.loop, session.task, session.progress
    before = progress.history[0]
    record = {
        "recipe": {**loop.recipe, "max_steps": task.config.max_steps},
        "teacher": {**pair.reference, "sha256": loop.recipe["teacher_sha256"]},
        "student": {**pair.source.record, **({"artifact": student_name} if student_name else {}),
                    "sha256": loop.recipe["student_sha256"]},
        "trainable_params": session.trainable,
        "steps": progress.step,
        "schedule_steps": loop.schedule.total,
        "epochs": round(progress.step / loop.schedule.per_epoch, 4),
        "train_data": loop.data.name,
        "train_samples": len(loop.data),
        "eval_before": {k: before[k] for k in ("data", "samples", "accuracy", "loss")},
        "eval": final,
        "artifact": str(artifact) if artifact is not None else None,
        "stopped": stopped,
        "history": progress.history,
        "command": task.config.command or [sys.argv[0], *sys.argv[1:]],
        "wall_time_s": round(progress.elapsed, 1),
        # of this sitting's steps (a resumed run: since it resumed), the seconds spent waiting for a batch
        "data_wait_s": round(loop.data_wait, 2),
        "hardware": hardware(loop.runtime.device),
        "precision": {"train_amp": loop.runtime.amp_name, "weights": "float32", "eval": "float32"},
        "edge": __version__,
    }
    if task.phases:
        record["phases"] = {phase.name: phase.record() for phase in task.phases}
    if distributed.active():
        record["processes"] = distributed.world_size()
    return record


def save_finetuned(session: Session, out: Path, record: dict) -> None:
    """Write the trained student as an artifact whose manifest gains ``record``; the checkpoint stays only while
    resumable work remains (a --max-steps stop), a finished run drops it."""
    manifest, reference = session.pair.source.manifest, session.pair.reference
    stages = [*manifest.get("finetune", []), record]
    # the teacher a later fine-tune of this artifact distils from by default (a module cannot be rebuilt)
    named = {"teacher": reference} if not reference["model"].startswith("Python module") else {}
    for phase in session.task.phases:   # what the trained structure offers (PIAD: the sub-network order)
        manifest = phase.manifest(manifest)
    finished = session.progress.step >= session.loop.schedule.total
    save_artifact(session.pair.student.cpu(), out, {**manifest, **named, "finetune": stages},
                  keep=() if finished else (CHECKPOINT,), drop=(CHECKPOINT,))


def _processes_note(batch_size: int) -> str:
    if not distributed.active():
        return ""
    processes = distributed.world_size()
    rows = batch_size // processes
    share = f"{rows}" if batch_size % processes == 0 else f"{rows}-{rows + 1}"
    return f", {processes} processes (DistributedDataParallel), {share} rows of each global batch of {batch_size} each"


RECIPE_ARGUMENTS = tuple(f.name for f in fields(FinetuneConfig) if f.name not in ("data", "teacher", "teacher_weights",
                                                                                   "command"))


def distil(student: nn.Module, *, out: str | Path, teacher: str | nn.Module, teacher_weights: str | Path | None = None,
           data: str | None = None, name: str | None = None, data_config: dict | None = None, resume: bool = True,
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


__all__ = ["FinetuneConfig", "check_config", "distil", "finetune", "held_out_set",
           "load_distilled", "select_trainable", "training_phases"]
