"""Stage 3 of plan_peers: the distillation records read and checked, the original scored, the final timing."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from _peers_names import budget_text
from _peers_report import budgets_of
from _peers_timing import ORIGINAL, export_graphs, time_models
from _peers_work import Work
from torch import nn

from edge.compress.load import load_model
from edge.errors import EdgeError
from edge.progress import log


class TimeStage(Work):
    """Stage 3: the models of ``--distilled`` checked against what is timed here, then one side-by-side run."""

    def read_distilled(self, groups: list[dict]) -> dict:
        """``--distilled``'s records merged and checked: every model at every budget (or skipped at a
        deadline), one teacher, the shapes timed here. A later file fills only what the earlier ones lack,
        and may be an earlier results file of this benchmark (its distillations of the same plans and
        peers, each entry saying where it came from)."""
        sources = [self.read_source(Path(path)) for path in self.distilled_paths]
        record = {"budgets": {b: {} for b in self.budgets()}, "skipped": [],
                  "sources": [{k: src.get(k) for k in ("file", "command", "jobs", "seconds")} for src in sources]}
        for job in self.jobs(groups):
            found = next(((src, src["budgets"][job["budget"]][job["key"]]) for src in sources
                          if job["key"] in src["budgets"].get(job["budget"], {})), None)
            if found is None and {"budget": job["budget"], "key": job["key"]} in sources[0].get("skipped", []):
                record["skipped"].append({"budget": job["budget"], "key": job["key"]})
                continue                        # not started before --deadline: the report says "not run"
            if found is None:
                raise EdgeError(f"{', '.join(map(str, self.distilled_paths))} hold no {budget_text(job['budget'])} "
                                f"distillation of {job['key']}", expected="every model at every budget of this command",
                                fix="run --stage distil again with the same command (it resumes)")
            src, summary = found
            self.check_rates_tried(job, summary, src["file"])
            record["budgets"][job["budget"]][job["key"]] = summary
            if job["family"] == "edge":
                params = sum(p.numel() for p in load_model(job["item"]["path"]).parameters())
                theirs = summary.get("params")
                if theirs is None and summary.get("plan"):          # an earlier results file: the same plan
                    params, theirs = job["item"]["plan"], summary["plan"]
            elif job["family"] == "tome":
                continue
            else:
                model, pruned = self.pruned_module(self.candidate(job["family"], job["parameter"]))
                params, theirs = pruned.get("widths"), summary.get("widths")
            if params != theirs:
                raise EdgeError(f"{job['key']} was distilled with other shapes than the model timed here",
                                expected=f"{params}", found=f"{theirs} in {src['file']}",
                                fix="distil and time models built by the same code and settings")
        return record

    def check_rates_tried(self, job: dict, summary: dict, file: str) -> None:
        """Refuse a distillation whose rate was chosen among other rates than this command's ``--lrs``. One of a
        record without a selection (a fixed rate, before it) passes: the tables mark its rate as fixed."""
        tried = (summary.get("selection") or {}).get("lrs")
        if tried is not None and self.selecting and tried != self.lrs():
            raise EdgeError(f"{job['key']} ({budget_text(job['budget'])}) in {file} chose its learning rate among "
                            "other rates than this command's", expected=f"--lrs {' '.join(map(str, self.lrs()))}",
                            found=f"{' '.join(map(str, tried))}",
                            fix="pass the --lrs the distillation ran with, or run --stage distil again with these")

    def read_source(self, path: Path) -> dict:
        """A distillation record (``--stage distil``), or an earlier results file turned into one."""
        if not path.is_file():
            raise EdgeError(f"no distillation records at {path}", expected="the file `--stage distil` writes",
                            fix="run --stage distil (on the machine that trains), or pass --distilled FILE")
        record = json.loads(path.read_text())
        if "budgets" in record:
            return {**record, "file": str(path)}
        if "final_timing" not in record:
            raise EdgeError(f"{path} is neither a distillation record nor a results file of plan_peers.py",
                            expected="the --distilled file of --stage distil, or a --json-out of this benchmark")
        here = {item["plan"]: item["key"] for item in self.items}
        keys, widths, plans = {}, {}, {}
        for group in record["groups"]:              # an edge model's key names where it lay: map it by its plan
            edge = group["edge"]
            if edge["plan"] in here:
                keys[edge["key"]], plans[edge["key"]] = here[edge["plan"]], edge["plan"]
            for peer in group["peers"].values():
                widths[peer["key"]] = peer["check"]["record"].get("widths")
        origin = {"file": str(path), "command": record.get("command")}
        budgets = {}
        for budget, entries in budgets_of(record).items():
            budgets[budget] = {}
            for key, summary in entries.items():
                if key.startswith("edge-") and key not in keys:
                    continue                        # a plan this command does not compare
                budgets[budget][keys.get(key, key)] = {
                    **summary, "from": origin, "hardware": summary.get("hardware") or record.get("hardware"),
                    "plan": plans.get(key), "widths": summary.get("widths", widths.get(key))}
        return {"budgets": budgets, "skipped": [], "file": str(path), "command": record.get("command")}


    def original_accuracy(self, original: nn.Module) -> dict:
        """The original's accuracy on the test split (on the CPU)."""
        return self.test_accuracy(original, device="cpu")

    def final_timing(self, groups: list[dict], original: nn.Module) -> tuple[dict, dict]:
        """Every model and the original, one interleaved side-by-side run per batch."""
        with tempfile.TemporaryDirectory(prefix="edge-plan-peers-final-") as tmp:
            folder = Path(tmp)
            original_graphs, check = export_graphs(original, ORIGINAL, folder, self.timing.batches,
                                                   self.args.model, None)
            graphs = {ORIGINAL: original_graphs}
            for group in groups:
                for family, key, parameter, item in self.models_of(group):
                    if key not in graphs:
                        plan = item["plan"] if item else None
                        graphs[key] = export_graphs(self.final_model(family, key, parameter, item), key, folder,
                                                    self.timing.batches, self.args.model, plan, data=self.args.data,
                                                    ranks_tokens=family == "tome")[0]
            log(f"final timing: {len(graphs)} models side by side at batch " +
                " and ".join(map(str, self.timing.batches)))
            return {str(b): t for b, t in time_models(graphs, self.timing).items()}, check

