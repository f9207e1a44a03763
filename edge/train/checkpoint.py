"""Resumable training: ``OUT/checkpoint.pt`` holds the model, optimizer, step, history and the recipe.

A checkpoint is continued only by the same recipe (the config's fields but those of :data:`RUN_ONLY`,
plus what a caller adds, e.g. the fine-tune's student and teacher hashes); fields added in later
versions compare as their defaults. Only the main process writes it, atomically.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from edge import distributed
from edge.errors import EdgeError
from edge.fileio import replace_atomic

CHECKPOINT = "checkpoint.pt"
# Not part of the recipe a checkpoint must match: where/how fast it runs, when it saves, where it stops.
RUN_ONLY = ("command", "checkpoint_every", "threads", "device", "eval_every_epoch", "max_steps")


@dataclass
class Progress:
    """Where a run stands: steps done, its history of evaluations, seconds spent (over all its sessions)."""

    step: int = 0
    history: list[dict] = field(default_factory=list)
    elapsed: float = 0.0


def recipe_of(config, **extra) -> dict:
    """What must match for a checkpoint of ``config`` (a dataclass) to be continued; ``max_steps`` may grow."""
    return {**{k: v for k, v in asdict(config).items() if k not in RUN_ONLY}, **extra}


def atomic_torch_save(obj, path: Path) -> None:
    replace_atomic(path, lambda tmp: torch.save(obj, tmp))


def found_by_all(path: Path) -> bool:
    """Whether ``path`` is a file, refusing a checkpoint some processes see and others do not."""
    found = path.is_file()
    seen = distributed.all_reduce_count(int(found))
    if seen not in (0, distributed.world_size()):
        raise EdgeError(f"{path} is seen by {seen} of {distributed.world_size()} processes",
                        expected="an output folder every process sees", fix="put --out on a shared file system")
    return found


def load_checkpoint(path: Path, recipe: dict, defaults: dict) -> dict:
    """The checkpoint at ``path`` if its recipe equals ``recipe`` (absent keys compare as ``defaults``)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    changed = sorted(k for k in recipe if state["recipe"].get(k, defaults.get(k)) != recipe[k])
    if changed:
        raise EdgeError(f"{path} was written by a different recipe (differs in {', '.join(changed)})",
                        fix="use the same options to resume, another --out, or --no-resume to start over")
    return state


def open_checkpoint(path: Path, recipe: dict, defaults: dict, resume: bool) -> dict | None:
    """The checkpoint to continue (``resume`` and found by every process), refusing another recipe; else None."""
    return load_checkpoint(path, recipe, defaults) if resume and found_by_all(path) else None


def restore(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Progress:
    """Load a checkpoint into ``model`` and ``optimizer``; where its run stood."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return Progress(int(state["step"]), list(json.loads(state["history"])), float(state["elapsed"]))


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, progress: Progress,
                    recipe: dict, extra: dict) -> None:
    """Write the checkpoint (main process only); ``extra``: what a task adds (training phases' state)."""
    if distributed.is_main():
        atomic_torch_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": progress.step,
                           "recipe": recipe, "history": json.dumps(progress.history),
                           "elapsed": progress.elapsed, **extra}, path)
