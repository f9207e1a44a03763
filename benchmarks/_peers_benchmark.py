"""plan_peers' three stages over ``--work``: speed matching, distillation, the final timing (each resumable)."""

from __future__ import annotations

import torch
from _peers_distil import DistilStage
from _peers_final import TimeStage
from _peers_matching import MatchStage

from edge.compress.load import load_model
from edge.progress import log


class Benchmark(MatchStage, DistilStage, TimeStage):
    """The stages of ``--stage`` in order; a stage that needs an earlier one's results finds them in ``--work``."""

    def run(self, items: list[dict]) -> dict | None:
        """The result of ``--stage all`` or ``time``; None after ``match`` or ``distil`` (their files written)."""
        stage, self.items = self.args.stage, items
        torch.set_num_threads(self.args.train_threads or 1)
        if self.args.reuse_matches:
            self.reuse_matches(items, self.args.reuse_matches)
        if stage in ("match", "all"):
            self.match_all(items)
            if stage == "match":
                log(f"matches: {self.state_path}; next: the same command with --stage distil, then --stage time")
                return None
        groups = self.matched(items)
        if stage in ("distil", "all"):
            self.distil_all(groups)
            if stage == "distil":
                return None
        distilled = self.read_distilled(groups)
        original = load_model(self.args.model)
        teacher_accuracy = self.original_accuracy(original)
        final, original_check = self.final_timing(groups, original)
        return {"original": {"accuracy": teacher_accuracy, "check": original_check}, "groups": groups,
                "distilled": distilled["budgets"],
                "distillation": {"sources": distilled["sources"], "skipped": distilled["skipped"],
                                 **{k: distilled["sources"][0].get(k) for k in ("command", "jobs", "seconds")}},
                "final_timing": final}
