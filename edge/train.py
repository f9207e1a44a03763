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
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from edge import __version__, distributed
from edge.check.accuracy import evaluate
from edge.config import MAX_BATCH, MAX_EPOCHS, MAX_SAMPLES, MAX_SEED, MAX_STEPS, MAX_THREADS, option
from edge.data import load_dataset
from edge.data.augment import random_shift_flip
from edge.data.images import LabeledImages
from edge.data.preprocess import ArrayPreprocess, InputSpec
from edge.errors import EdgeError, plural
from edge.fileio import replace_atomic, write_text_atomic
from edge.models import create_model, data_config, model_info, parse_model_spec
from edge.models.weights_io import save_safetensors
from edge.progress import bar, log
from edge.runtime import hardware, resolve_amp, resolve_device, set_threads

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainConfig:
    """The recipe. ``None`` fields are resolved in :func:`resolve` (one place for defaults)."""

    model: str = "fmnist-deit-tiny"
    init_weights: str | None = None       # start from these weights (a fine-tuning stage), not random init
    data: str = "fmnist"
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


def atomic_torch_save(obj, path: Path) -> None:
    replace_atomic(path, lambda tmp: torch.save(obj, tmp))


def learning_rate(step: int, total: int, config: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay from ``lr`` to ``min_lr`` (reached at ``total``)."""
    warmup = min(config.warmup_steps, max(total - 1, 1))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def training_set(spec: str, samples: int | None, seed: int) -> LabeledImages:
    """The train split of ``spec`` in memory; a seeded class-balanced subset of ``samples`` if given."""
    data = load_dataset(spec, "train")
    if not isinstance(data, LabeledImages):
        data = data.to_memory()
    if samples:
        from edge.data.sampler import balanced_indices

        data = data.subset(balanced_indices(data.labels, samples, seed, data.num_classes))
    return data


def training_batch(data: LabeledImages, step: int, batch_size: int, seed: int,
                   augment: bool) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(epoch, uint8 images, labels)`` of global step ``step``: the seeded epoch order and augmentation."""
    steps_per_epoch = math.ceil(len(data) / batch_size)
    epoch, offset = divmod(step, steps_per_epoch)
    order = epoch_order(len(data), seed, epoch)
    start = offset * batch_size
    idx = order[start:start + batch_size]
    images = data.images[idx]
    if augment:
        images = random_shift_flip(images, torch.Generator().manual_seed(seed * 1_000_003 + step))
    return epoch, images, data.labels[idx]


def check_global_batch(samples: int, batch_size: int) -> None:
    """Refuse a global batch (or an epoch's last, partial one) with fewer images than processes."""
    processes = distributed.world_size()
    smallest = min(batch_size, samples % batch_size or batch_size)
    if smallest < processes:
        raise EdgeError(f"a global batch of {smallest} image(s) cannot be split over {processes} processes "
                        f"({samples} training images, --batch-size {batch_size})",
                        expected=f"every batch of the epoch to have at least {processes} images, one per process",
                        fix=f"raise --batch-size to at least {processes} or change --train-samples so that the "
                            "last batch of an epoch is not that small")


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


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters; no weight decay on biases, norms, tokens and position embeddings (as timm/DeiT)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in ("cls_token", "pos_embed", "reg_token") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_checkpoint(path: Path, recipe: dict, defaults: dict) -> dict:
    """The checkpoint at ``path`` if its recipe equals ``recipe`` (absent keys compare as ``defaults``)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    changed = sorted(k for k in recipe if state["recipe"].get(k, defaults.get(k)) != recipe[k])
    if changed:
        raise EdgeError(f"{path} was written by a different recipe (differs in {', '.join(changed)})",
                        fix="use the same options to resume, another --out, or --no-resume to start over")
    return state


def resume_from(path: Path, recipe: dict, defaults: dict, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer) -> tuple[int, list, float]:
    """Load a checkpoint of the same recipe into ``model`` and ``optimizer``: (step, history, elapsed)."""
    state = load_checkpoint(path, recipe, defaults)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), list(json.loads(state["history"])), float(state["elapsed"])


def train(config: TrainConfig, out: str | Path, *, resume: bool = True) -> dict:
    """Train ``config.model`` on ``config.data``; write weights, checkpoint and model card to ``out``.

    With ``resume`` (default) an existing ``out/checkpoint.pt`` of the same recipe is continued. The
    checkpoint is removed once the whole schedule has run; a run stopped earlier (``max_steps``,
    Ctrl-C, a crash) keeps it.
    """
    out = Path(out)
    threads = set_threads(config.threads)
    device = distributed.local_device(resolve_device(config.device))
    distributed.init(device)
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
    amp_dtype = resolve_amp(config.amp, device)
    spec = parse_model_spec(config.model)

    torch.manual_seed(config.seed)
    model = create_model(spec, pretrained_weights=False, weights=config.init_weights).to(device)
    input_spec = InputSpec.from_data_config(data_config(model))
    preprocess = ArrayPreprocess(input_spec)
    train_set = training_set(config.data, config.train_samples, config.seed)
    eval_set = load_dataset(config.eval_data or config.data, "test")

    check_global_batch(len(train_set), config.batch_size)
    steps_per_epoch = math.ceil(len(train_set) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    last_step = min(total_steps, config.max_steps or total_steps)
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, betas=(0.9, 0.999))

    # What must match for a checkpoint to be continued; max_steps may grow (extend a shortened run).
    recipe = {k: v for k, v in asdict(config).items() if k not in ("command", "checkpoint_every", "threads",
                                                                   "device", "eval_every_epoch", "max_steps")}
    step, history, elapsed = 0, [], 0.0
    checkpoint_path = out / CHECKPOINT
    if resume and found_by_all(checkpoint_path):
        # fields added in later versions compare as their defaults
        step, history, elapsed = resume_from(checkpoint_path, recipe, asdict(TrainConfig()), model, optimizer)
        log(f"resuming {checkpoint_path} at step {step}/{last_step}")

    def save_checkpoint() -> None:
        if not distributed.is_main():
            return
        atomic_torch_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                            "recipe": recipe, "history": json.dumps(history), "elapsed": elapsed}, checkpoint_path)

    log(f"train {config.model} on {train_set.name} ({len(train_set)} images): {plural(last_step, 'step')} "
        f"({steps_per_epoch}/epoch), device {device}, amp {amp_dtype}, threads {threads}")
    trainer = distributed.data_parallel(model, device)
    model.train()
    started = time.perf_counter() - elapsed
    with bar(total=last_step, initial=step, desc="train", unit="step") as progress:
        while step < last_step:
            epoch, images, labels = training_batch(train_set, step, config.batch_size, config.seed, config.augment)
            rows = distributed.batch_rows(len(labels))       # this process's rows of the global batch
            share = (rows.stop - rows.start) / len(labels)
            x, y = preprocess(images[rows]).to(device), labels[rows].to(device)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total_steps, config)
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                local = F.cross_entropy(trainer(x), y, label_smoothing=config.label_smoothing)
            loss = distributed.all_reduce_sum(local.detach() * share)  # the global batch's mean loss
            if not torch.isfinite(loss):
                raise EdgeError(f"training diverged at step {step}: loss is {float(loss)}",
                                fix="lower --lr or use --amp off")
            optimizer.zero_grad(set_to_none=True)
            # DDP averages the gradients: weighted by its share, each adds its part of the global mean's gradient
            (local * (share * distributed.world_size())).backward()
            if config.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            step += 1
            loss_value = loss.item()
            elapsed = time.perf_counter() - started
            progress.set_postfix(epoch=epoch, loss=f"{loss_value:.3f}", lr=f"{group['lr']:.2e}", refresh=False)
            progress.update(1)
            epoch_done = step % steps_per_epoch == 0
            if epoch_done and config.eval_every_epoch:
                model.eval()
                result = held_out_accuracy(model, eval_set, input_spec, device)
                model.train()
                history.append({"epoch": epoch + 1, "step": step, "loss": loss_value,
                                "eval_accuracy": result["accuracy"], "elapsed_s": round(elapsed, 1)})
                log(f"epoch {epoch + 1}/{config.epochs} step {step}: loss {loss_value:.4f} "
                    f"{eval_set.name} accuracy {result['accuracy']:.4f} ({elapsed / 60:.1f} min)")
            if step % config.checkpoint_every == 0 or epoch_done or step == last_step:
                save_checkpoint()

    model.eval()
    dtype = getattr(torch, config.save_dtype)
    weights_path = out / "model.safetensors"
    if distributed.is_main():
        save_safetensors({k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}, weights_path,
                         metadata={"model": config.model, "edge": __version__})
    distributed.barrier()   # the weights file is written before any process reads it
    # Accuracy of the weights as saved (e.g. float16), evaluated in float32 on the full test split.
    saved = create_model(spec, weights=weights_path)
    final = evaluate(saved, eval_set, input_spec, device=device) if not distributed.active() else \
        held_out_accuracy(saved, eval_set, input_spec, device)
    card = {
        "model": config.model,
        "architecture": spec.arch,
        "info": model_info(saved).as_dict(),
        "data_config": input_spec.as_dict(),
        "command": config.command or [sys.argv[0], *sys.argv[1:]],
        "recipe": {**recipe, "max_steps": config.max_steps},
        "seed": config.seed,
        "epochs": config.epochs,
        "steps": step,
        "train_data": train_set.name,
        "train_samples": len(train_set),
        "eval": {"data": eval_set.name, "accuracy": final["accuracy"], "samples": final["samples"],
                 "loss": final["loss"]},
        "history": history,
        "wall_time_s": round(elapsed, 1),
        "hardware": hardware(device),
        "precision": {"train_amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "float32",
                      "weights": config.save_dtype, "eval": "float32"},
        "edge": __version__,
    }
    if distributed.active():
        card["processes"] = distributed.world_size()
    if distributed.is_main():
        write_text_atomic(json.dumps(card, indent=2) + "\n", out / "card.json")
        if step >= total_steps:  # finished: nothing left to resume (a --max-steps stop keeps its checkpoint)
            checkpoint_path.unlink(missing_ok=True)
    distributed.barrier()   # the others return once the main process has written
    return card


def found_by_all(path: Path) -> bool:
    """Whether ``path`` is a file, refusing a checkpoint some processes see and others do not."""
    found = path.is_file()
    seen = distributed.all_reduce_count(int(found))
    if seen not in (0, distributed.world_size()):
        raise EdgeError(f"{path} is seen by {seen} of {distributed.world_size()} processes",
                        expected="an output folder every process sees", fix="put --out on a shared file system")
    return found
