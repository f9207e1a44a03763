"""Stage 2 of plan_peers: every model distilled at every budget, its learning rate chosen on validation images.

Every model (edge's through :func:`edge.compress.finetune.finetune`, what ``edge finetune ARTIFACT`` runs;
the peers through :func:`edge.compress.finetune.distil`, its entry point for any module) is distilled from
the same teacher with edge's recipe but the learning rate, once per rate of ``--lrs`` on the training split
minus the validation images, then chosen on those (:mod:`_peers_selection`); only the chosen run is scored on
the test split. ``--val-samples 0`` (one rate) trains on the whole training split and scores on the test
split, the recipe before the selection. Runs go ``--jobs`` at once; each is resumable in ``--work``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from _peers_names import budget_text, rate_key, rate_text, slug
from _peers_pruning import TAYLOR_BATCH, import_torch_pruning
from _peers_selection import RULE, Split, held_out_split, select, trial_of
from _peers_work import Work
from torch import nn

from edge.compress import is_artifact
from edge.compress.artifact import read_manifest
from edge.compress.load import load_model
from edge.errors import EdgeError
from edge.fileio import write_atomic
from edge.progress import log

PEER_RECIPE = ("epochs", "steps", "seed", "threads", "device", "lr", "eval_data")   # what distil() is given


class DistilStage(Work):
    """Stage 2: the distillations, written to ``--distilled`` as each ends (so they can run on another machine)."""

    def __init__(self, args) -> None:
        super().__init__(args)
        self._split: Split | None = None

    # ---- the recipe
    def split(self) -> Split:
        """The validation images held out of the training split, and the rest (written once in ``--work``)."""
        if self._split is None:
            calibration = max(self.args.samples, self.args.taylor_batches * TAYLOR_BATCH)
            self._split = held_out_split(self.args.data, self.args.val_samples, self.args.seed, calibration,
                                         self.work / "splits")
        return self._split

    def recipe(self, budget: str, lr: float, data: str | None = None):
        """edge finetune's recipe at ``budget`` and rate ``lr``, trained on ``data`` (default ``--data``); a
        split's folder is also what it is scored on (its ``test`` split: the validation images)."""
        from edge.compress.finetune import FinetuneConfig

        steps = self.args.steps if budget.endswith(" steps") else None
        epochs = 1 if steps else int(budget)
        data = data or self.args.data
        return FinetuneConfig(data=data, eval_data=None if data == self.args.data else data, epochs=epochs,
                              steps=steps, lr=lr, seed=self.args.seed, threads=self.args.train_threads,
                              device=self.args.train_device)

    def distilled_dir(self, budget: str, key: str) -> Path:
        return self.work / "distilled" / slug(budget) / key

    def trial_dir(self, budget: str, key: str, lr: float) -> Path:
        return self.work / "selection" / slug(budget) / key / f"lr-{rate_key(lr)}"

    def finished(self, out: Path, config) -> dict | None:
        """The fine-tune record of a finished run of this recipe at ``out``, if there is one."""
        from edge.train.checkpoint import RUN_ONLY

        if not is_artifact(out):
            return None
        stages = read_manifest(out).get("finetune") or []
        want = {k: v for k, v in asdict(config).items() if k not in RUN_ONLY}
        if stages and all(stages[-1]["recipe"].get(k) == v for k, v in want.items()):
            return stages[-1]
        return None

    # ---- one run
    def train(self, job: dict, out: Path, config) -> tuple[dict, dict]:
        """``job``'s model distilled with ``config`` at ``out`` (a finished run read, a stopped one continued):
        the fine-tune record, and the shape it was distilled in (what the time stage checks)."""
        from edge.compress.finetune import distil, finetune

        what = f"{job['key']} ({budget_text(job['budget'])}, lr {rate_text(config.lr)})"
        if job["family"] == "edge":
            item = job["item"]
            record = self.finished(out, config)
            if record is None:
                log(f"distilling {what}")
                record = finetune(item["path"], out, config)
            return record, {"params": params(load_model(item["path"]))}
        candidate = self.candidate(job["family"], job["parameter"])
        model, pruned = self.pruned_module(candidate)
        config = replace(config, teacher=self.args.model)
        record = self.finished(out, config)
        if record is None:
            log(f"distilling {what}")
            recipe = {k: v for k, v in asdict(config).items() if k in PEER_RECIPE}
            record = distil(model, out=out, teacher=self.args.model, data=config.data, name=candidate.label,
                            **recipe)
        return record, {"widths": pruned.get("widths"), "params": params(model)}

    def distil_job(self, job: dict) -> dict:
        """``job`` at the one rate, on the whole training split, scored on the test split (no selection)."""
        out = self.distilled_dir(job["budget"], job["key"])
        record, shape = self.train(job, out, self.recipe(job["budget"], self.lrs()[0]))
        return {"out": str(out), **summary_of(record), **shape}

    def distil_trial(self, trial: dict) -> dict:
        """``trial``'s model at ``trial["lr"]`` on the training split minus the validation images, scored on them."""
        out = self.trial_dir(trial["budget"], trial["key"], trial["lr"])
        record, shape = self.train(trial, out, self.recipe(trial["budget"], trial["lr"], self.split().data))
        return trial_of({"out": str(out), **summary_of(record), **shape}, trial["lr"])

    def distil_run(self, run: dict) -> dict:
        return self.distil_trial(run) if "lr" in run else self.distil_job(run)

    def trials(self, jobs: list[dict]) -> list[dict]:
        """Every job at every rate, in the jobs' order."""
        return [{**job, "lr": lr} for job in jobs for lr in self.lrs()]

    # ---- the test split, after the choice
    def distilled_model(self, job: dict, out: str | Path) -> nn.Module:
        """The distilled model of ``job`` written at ``out``."""
        from edge.compress.finetune import load_distilled

        if job["family"] == "edge":
            return load_model(str(out))
        return load_distilled(self.final_model(job["family"], job["key"], job["parameter"], None), out)

    def test_figures(self, job: dict, trial: dict) -> dict:
        """The test accuracy of ``job``'s model before distillation and after the chosen ``trial``."""
        data = self.test_set()
        log(f"{job['key']} ({budget_text(job['budget'])}): lr {rate_text(trial['lr'])} chosen; scoring it on "
            f"{data.name}")
        start = self.final_model(job["family"], job["key"], job["parameter"], job["item"])
        return {"before": self.test_accuracy(start, data),
                "after": self.test_accuracy(self.distilled_model(job, trial["out"]), data)}

    def choose(self, jobs: list[dict], record: dict) -> None:
        """Each job's rate, chosen once all of its rates' validation scores are in; then its test figures. A
        job with a rate not run (``--deadline``) is skipped whole, one with a failed rate is left out."""
        failed = {(f["budget"], f["key"]) for f in record["failed"]}
        for job in jobs:
            budget, key = job["budget"], job["key"]
            trials = record["trials"][budget].get(key, {})
            if (budget, key) in failed:
                continue
            if len(trials) < len(self.lrs()):
                record["skipped"].append({"budget": budget, "key": key})
                continue
            record["budgets"][budget][key] = select(trials, functools.partial(self.test_figures, job),
                                                    self.split().record)

    # ---- all of them
    def distil_all(self, groups: list[dict]) -> dict:
        """Every model at every budget (and rate), written to ``--distilled`` as each ends; then, selecting, each
        model's rate chosen on the validation images and only then the test split read.

        Models are distilled from what this machine builds (the plans compressed, Torch-Pruning run on
        the CPU); each record keeps its parameter count and pruned widths, so the machine that times
        them checks it times the same shapes."""
        path = self.distilled_path
        record = {"budgets": {b: {} for b in self.budgets()}, "skipped": [], "failed": [], "settings": self.settings,
                  "command": " ".join(sys.argv), "jobs": self.args.jobs, "deadline_s": self.args.deadline}
        jobs = self.jobs(groups)
        for job in jobs:                        # built once here: parallel jobs must not race to write them
            if job["family"] not in ("edge", "tome"):
                self.pruned_module(self.candidate(job["family"], job["parameter"]))
        runs = jobs
        if self.selecting:                      # the split too
            record["selection"] = {"lrs": self.lrs(), "rule": RULE, "split": self.split().record}
            record["trials"] = {b: {} for b in self.budgets()}
            runs = self.trials(jobs)
        started = time.monotonic()

        def done(run: dict, summary: dict | BaseException | None) -> None:
            what = f"{run['key']} ({budget_text(run['budget'])}" + (f", lr {rate_text(run['lr'])})" if "lr" in run
                                                                     else ")")
            if isinstance(summary, BaseException):    # one failed run does not lose the others' records
                record["failed"].append({k: run[k] for k in ("budget", "key", "lr") if k in run} |
                                        {"error": str(summary)})
                log(f"{what} failed: {summary}")
            elif summary is None:
                if "lr" not in run:
                    record["skipped"].append({k: run[k] for k in ("budget", "key")})
                log(f"{what}: not started before the deadline")
            elif "lr" in run:
                record["trials"][run["budget"]].setdefault(run["key"], {})[rate_key(run["lr"])] = summary
            else:
                record["budgets"][run["budget"]][run["key"]] = summary
            record["seconds"] = round(time.monotonic() - started, 1)
            write_atomic(json.dumps(record, indent=1).encode(), path)

        self.run_all(runs, done)
        if self.selecting:
            self.choose(jobs, record)           # every validation score is in: only now is the test split read
            write_atomic(json.dumps(record, indent=1).encode(), path)
        log(f"distillation records: {path}")
        if record["failed"]:
            raise EdgeError(f"{len(record['failed'])} of {len(runs)} distillations failed (recorded in {path})",
                            found=record["failed"][0]["error"], fix="fix the first error and run again (it resumes)")
        return record

    def run_all(self, runs: list[dict], done: Callable[[dict, dict | BaseException | None], None]) -> None:
        """``done(run, summary)`` for every run: its summary, the error it raised (``--jobs`` > 1; one process
        raises it), or None when ``--deadline`` passed before it started."""
        deadline = None if self.args.deadline is None else time.time() + self.args.deadline
        if self.args.jobs <= 1:
            for run in runs:
                done(run, None if deadline and time.time() > deadline else self.distil_run(run))   # raises
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(self.args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(distil_worker, vars(self.args), run, deadline): run for run in runs}
            for future in as_completed(futures):
                error = future.exception()
                done(futures[future], error if error is not None else future.result())


def distil_worker(args: dict, run: dict, deadline: float | None) -> dict | None:
    """One distillation in a worker process (``--jobs``); None when the deadline passed before it started."""
    if deadline is not None and time.time() > deadline:
        return None
    import_torch_pruning()              # a spawned process: the peers' folder on sys.path, timm's shim first
    return DistilStage(argparse.Namespace(**args)).distil_run(run)


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def summary_of(record: dict) -> dict:
    """What the benchmark keeps of a fine-tune record."""
    return {"before": record["eval_before"], "after": record["eval"], "steps": record["steps"],
            "epochs": record["epochs"], "teacher_sha256": record["teacher"]["sha256"],
            "recipe": {k: record["recipe"].get(k) for k in ("data", "epochs", "steps", "seed", "batch_size", "lr",
                                                            "temperature", "alpha", "augment")},
            "wall_time_s": record["wall_time_s"], "hardware": record.get("hardware")}
