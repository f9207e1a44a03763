"""What every stage of plan_peers shares: the options, ``--work``, the peers built from the original, the jobs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _peers_candidates import Candidate, candidate
from _peers_names import ordered
from _peers_pruning import ROUND_TO, TORCH_PRUNING, taylor_batches
from _peers_selection import check_rates
from _peers_timing import Timing
from torch import nn

from edge.compress.load import load_model
from edge.fileio import write_atomic
from edge.models import data_config
from edge.progress import log


class Work:
    """The command's options and ``--work``: the matches (``state.json``), the pruned modules, the distillations.

    The stages (:mod:`_peers_matching`, :mod:`_peers_distil`, :mod:`_peers_final`) build on it; a stopped
    run, started again with the same command, finds here what was done."""

    def __init__(self, args) -> None:
        self.args = args
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.timing = Timing(threads=args.threads, batches=tuple(args.batches), warmup=args.warmup,
                             rounds=args.rounds, sessions=args.sessions, iterations=args.iterations, seed=args.seed)
        self.match_timing = Timing(threads=args.threads, batches=tuple(args.batches), warmup=args.warmup,
                                   rounds=args.match_rounds, sessions=args.match_sessions,
                                   iterations=args.match_iterations, seed=args.seed)
        self.state_path = self.work / "state.json"
        self.settings = {"model": args.model, "data": args.data, "seed": args.seed, "batches": args.batches,
                         "threads": args.threads, "taylor_batches": args.taylor_batches, "ratios": args.ratios,
                         "refine": args.refine, "torch_pruning": TORCH_PRUNING, "round_to": ROUND_TO}
        self.state = self._load_state()
        self.items: list[dict] = []       # the edge models of this command (this machine's paths)
        self._taylor: list | None = None
        self._spec = None

    def _load_state(self) -> dict:
        if self.state_path.is_file():
            state = json.loads(self.state_path.read_text())
            if state.get("settings") == self.settings:
                return state
            log(f"{self.state_path}: other settings than this run's; its matches are not reused")
        return {"settings": self.settings, "matches": {}}

    def save_state(self) -> None:
        write_atomic(json.dumps(self.state, indent=1).encode(), self.state_path)

    # ---- the peers
    def taylor(self) -> list:
        if self._taylor is None:
            self._taylor = taylor_batches(self.args.data, self.args.taylor_batches, self.args.seed,
                                          data_config(load_model(self.args.model)))
        return self._taylor

    def candidate(self, family: str, parameter: float) -> Candidate:
        return candidate(family, parameter, model=self.args.model, data=self.args.data,
                         taylor_batches=self.args.taylor_batches, seed=self.args.seed, taylor=self.taylor)

    def pruned_module(self, candidate: Candidate) -> tuple[nn.Module, dict]:
        """The candidate's model before distillation, saved once (Torch-Pruning) so a resumed run finds it."""
        if candidate.family == "tome":
            return candidate.build()
        path = self.work / "pruned" / f"{candidate.key}.pt"
        if path.is_file():
            saved = torch.load(path, weights_only=False)
            return saved["model"], saved["record"]
        model, record = candidate.build()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model, "record": record}, tmp)
        tmp.replace(path)
        return model, record

    def final_model(self, family: str, key: str, parameter: float | None, item: dict | None) -> nn.Module:
        """The model as it is before distillation: the one whose graph is timed. Distillation changes weights,
        never shapes (the time stage checks the shapes), and an fp32 graph's speed on ONNX Runtime does not
        depend on its weights' values, so the graphs timed need no distilled weights (which may stay on the
        machine that trained)."""
        if family == "edge":
            return load_model(item["path"])
        if family == "tome":
            return self.candidate(family, parameter).build()[0]
        return self.pruned_module(self.candidate(family, parameter))[0]

    # ---- the models to distil
    def budgets(self) -> list[str]:
        """The distillation budgets, as record keys: epochs (``"1"``, ``"3"``), or ``"N steps"`` for a smoke."""
        return [f"{self.args.steps} steps"] if self.args.steps else [str(e) for e in self.args.epochs]

    def models_of(self, group: dict) -> list[tuple[str, str, float | None, dict | None]]:
        """``(family, key, parameter, edge item)`` of a matched group's models, the edge model first. Its item
        is this machine's entry of its key (``self.items``): the matches may have been made where it lay
        elsewhere."""
        here = {item["key"]: item for item in self.items}
        edge = group["edge"]
        return [("edge", edge["key"], None, here.get(edge["key"], edge))] + \
            [(f, p["key"], p["parameter"], None) for f, p in group["peers"].items()]

    def jobs(self, groups: list[dict]) -> list[dict]:
        """Every (budget, model) to distil once, the last group (the fastest edge model) and the longest budget
        first: what a run stopped by ``--deadline`` leaves undone is the least needed."""
        jobs, seen = [], set()
        for budget in reversed(ordered(self.budgets())):
            for group in reversed(groups):
                for family, key, parameter, item in self.models_of(group):
                    if (budget, key) not in seen:
                        seen.add((budget, key))
                        jobs.append({"budget": budget, "family": family, "key": key, "parameter": parameter,
                                     "item": item})
        return jobs

    @property
    def selecting(self) -> bool:
        """Whether each model's learning rate is chosen on a validation split (``--val-samples`` not 0)."""
        return self.args.val_samples != 0

    def lrs(self) -> list[float]:
        """The learning rates of ``--lrs``, increasing."""
        return check_rates(self.args.lrs)

    @property
    def distilled_paths(self) -> list[Path]:
        return [Path(p) for p in self.args.distilled] if self.args.distilled else [self.work / "distilled.json"]

    @property
    def distilled_path(self) -> Path:
        """Where ``--stage distil`` writes: the first ``--distilled``."""
        return self.distilled_paths[0]

    # ---- the test images
    def input_spec(self):
        """The inputs every model takes: the original's (a pruned, merged or compressed model keeps them)."""
        from edge.data.preprocess import InputSpec

        if self._spec is None:
            self._spec = InputSpec.from_data_config(data_config(load_model(self.args.model)))
        return self._spec

    def test_set(self):
        """The test split of ``--data``: read for the figures reported, never to choose anything."""
        from edge.data import load_dataset

        return load_dataset(self.args.data, "test")

    def test_accuracy(self, model: nn.Module, data=None, device: str | None = None) -> dict:
        """``model``'s accuracy on ``data`` (default: the test split), on ``device`` (default: the distillation's)."""
        from edge.runtime import resolve_device
        from edge.train import held_out_accuracy

        data = self.test_set() if data is None else data
        device = resolve_device(device or self.args.train_device)
        result = held_out_accuracy(model.eval(), data, self.input_spec(), device)
        return {k: result[k] for k in ("data", "samples", "accuracy", "loss")}
