"""PIAD (SKD's Progressive Importance-Aware Dropout): a wpac model trained into a super-network.

``edge finetune ARTIFACT --piad`` runs this :class:`~edge.compress.method.TrainingPhase` inside the
fine-tune (distillation from the original model, the fine-tuner's loss, which the reference code
lacks). At the start the wpac blocks' attention and MLP become droppable modules
(:mod:`edge.compress.methods.wpac.droppable`: the same weights, computed with the leading dims only; no shape
changes). Then:

* **the dropout list grows** at the start of each of the first ``piad_epochs`` epochs ``e``
  (``0 .. E_p - 1``): the units are ranked on the proxy set (``piad_samples`` seeded,
  class-balanced training images) on the smallest sub-network, every unit of the list dropped
  (:func:`edge.compress.methods.wpac.importance.unit_importance`: module sensitivity x normalised Taylor
  importance, per FLOP, pooled from each part's tail), and the lowest-ranked units are appended
  until the list's FLOPs reach ``(e + 1) / E_p x target`` of the whole model's. A unit once
  listed stays, in its place: the list only grows. An "epoch" is ``steps / epochs`` of the
  schedule (exactly the data epochs unless ``--steps`` sets another length);
* **every step trains one sampled sub-network**: ``k`` uniform in ``0 .. len(list)`` from a
  generator seeded by ``(seed, step)`` (the same on every process, and again on resume), and the
  first ``k`` units of the list are dropped. ``k = 0`` is the whole network and ``k = len(list)``
  the smallest, so both ends train (the paper samples ``1 .. len``; which end it leaves out is
  not clear from the text);
* evaluations in between score the whole network (the droppable modules use every dim in eval).

At the end the modules go back (the trained weights are theirs) and the artifact keeps the full
widths plus its ``supernet`` record (:mod:`edge.compress.methods.wpac.supernet`): the dropout list, then the
last ranking's order of the units left, from which ``edge compress ARTIFACT --plan wpac:macs=F``
cuts any sub-network without data. Sub-networks below ``1 - target`` of the MACs were never trained.
"""

from __future__ import annotations

import math
import random

from torch import nn

from edge.compress.cost import analytic_flops
from edge.compress.methods.wpac.droppable import DroppableAttention, DroppableMlp, Droppables
from edge.compress.methods.wpac.importance import unit_importance
from edge.compress.methods.wpac.module import NarrowAttention, WpacOptions
from edge.compress.methods.wpac.supernet import (
    Part,
    block_parts,
    dropped_flops,
    greedy_order,
    supernet_record,
    widths_after,
)
from edge.compress.options import option_defaults
from edge.errors import EdgeError
from edge.models.info import model_info, original_block_indices
from edge.progress import log


def growth_steps(total_steps: int, epochs: int, piad_epochs: int) -> list[int]:
    """The steps at which the dropout list grows: the first step of each of the first ``piad_epochs`` epochs."""
    length = total_steps / epochs
    return [math.floor(e * length + 1e-9) for e in range(piad_epochs)]


def sampled_drops(seed: int, step: int, listed: int) -> int:
    """``k`` of training step ``step``: uniform in ``0 .. listed``, seeded by ``(seed, step)`` alone."""
    return random.Random(f"piad:{seed}:{step}").randint(0, listed)


def wpac_parts(model: nn.Module, align: int, mlp_align: int) -> dict[str, Part]:
    """The droppable parts of every wpac block of ``model`` (NarrowAttention + Mlp), by name."""
    tokens = model_info(model).num_tokens
    parts: dict[str, Part] = {}
    for position, entry in enumerate(original_block_indices(model.blocks)):
        block = model.blocks[position]
        if len(entry) == 1 and isinstance(getattr(block, "attn", None), NarrowAttention):
            parts.update({p.name: p for p in block_parts(entry[0], block.attn, block.mlp, tokens, align, mlp_align)})
    return parts


class PiadPhase:
    """Progressive importance-aware dropout of a wpac student, as a :class:`~edge.compress.method.TrainingPhase`."""

    name = "piad"
    module_types = (DroppableAttention, DroppableMlp)

    def __init__(self, student: nn.Module, config, *, align: int, mlp_align: int) -> None:
        self.student = student
        self.target = float(config.piad_target)
        self.epochs = int(config.piad_epochs)
        self.samples = int(config.piad_samples)
        self.data, self.seed = config.data, int(config.seed)
        self.total_steps = int(config.steps)
        self.growth = growth_steps(self.total_steps, int(config.epochs), self.epochs)
        self.align, self.mlp_align = align, mlp_align
        self.parts = wpac_parts(student, align, mlp_align)
        self.flops = analytic_flops(student)
        self.listed: list[str] = []
        self.scores: list[float] = []
        self.rest: list[str] = []
        self.rest_scores: list[float] = []
        self.history: list[dict] = []
        self.macs = 1.0
        self.modules: Droppables | None = None
        self._proxy: object = None
        reachable = dropped_flops(self.parts, widths_after(self.parts, self._every_unit())) / self.flops
        if reachable < self.target:
            most = math.floor(reachable * 1e4) / 1e4
            raise EdgeError(f"--piad-target {self.target:g}: dropping every droppable unit of this model saves "
                            f"{reachable:.4f} of its MACs", expected=f"--piad-target <= {most:.4f} "
                            "(each part keeps one aligned unit; embedding, head and blocks outside wpac stay)",
                            fix=f"pass --piad-target {math.floor(reachable * 100) / 100:g} or less")

    def _every_unit(self) -> list[str]:
        return [name for name, part in self.parts.items() for _ in range(part.units())]

    def start(self) -> None:
        self.modules = Droppables.put(self.student, self.align, self.mlp_align)

    def listed_fraction(self) -> float:
        return dropped_flops(self.parts, widths_after(self.parts, self.listed)) / self.flops

    def grow(self, step: int) -> None:
        """Rank the units left on the smallest sub-network; append the lowest until the list reaches its target."""
        from edge.data import calibration_set, load_dataset
        from edge.data.preprocess import InputSpec
        from edge.models import data_config

        assert self.modules is not None
        if self._proxy is None:   # at most the training split (a small data set gives all its images)
            self._proxy = calibration_set(self.data, min(self.samples, len(load_dataset(self.data, "train"))),
                                          self.seed)
        epoch = len(self.history)
        goal = (epoch + 1) / self.epochs * self.target
        smallest = widths_after(self.parts, self.listed)
        spec = InputSpec.from_data_config(data_config(self.student))
        scores, report = unit_importance(self.modules, smallest, self._proxy, spec)
        order, values = greedy_order(self.parts, smallest, scores)
        added = 0
        while order and self.listed_fraction() < goal - 1e-12:
            self.listed.append(order.pop(0))
            self.scores.append(values.pop(0))
            added += 1
        self.rest, self.rest_scores = order, values
        entry = {"epoch": epoch, "step": step, "added": added, "listed": len(self.listed),
                 "listed_macs_saved": round(self.listed_fraction(), 6), "goal": round(goal, 6), **report}
        self.history.append(entry)
        log(f"piad: dropout list grown at step {step} by {added} to {len(self.listed)} units, "
            f"{entry['listed_macs_saved']:.3f} of the MACs (goal {goal:.3f}); proxy loss {report['loss']:.4f} "
            f"on the smallest sub-network")

    def step(self, step: int, total: int) -> dict[str, float]:
        """Grow the list when an epoch of the progressive phase starts; set this step's sampled sub-network."""
        while len(self.history) < self.epochs and step >= self.growth[len(self.history)]:
            self.grow(step)
        assert self.modules is not None
        drops = sampled_drops(self.seed, step, len(self.listed))
        widths = widths_after(self.parts, self.listed[:drops])
        self.modules.set_widths(widths)
        self.macs = 1.0 - dropped_flops(self.parts, widths) / self.flops
        return {"sampled_macs": self.macs}   # the step's sub-network (evaluations score the whole)

    @property
    def final(self) -> bool:
        """The whole network (eval mode) is the structure kept: a run may stop at any step."""
        return True

    def finish(self) -> None:
        """The NarrowAttention and Mlp modules back in their blocks, holding the trained weights."""
        if self.modules is not None:
            self.modules.restore()
            self.modules = None

    def state_dict(self) -> dict:
        return {"sampled_macs": self.macs, "listed": list(self.listed), "scores": list(self.scores),
                "rest": list(self.rest), "rest_scores": list(self.rest_scores),
                "history": [dict(h) for h in self.history]}

    def load_state_dict(self, state: dict) -> None:
        self.macs = float(state["sampled_macs"])
        self.listed, self.scores = list(state["listed"]), [float(s) for s in state["scores"]]
        self.rest, self.rest_scores = list(state["rest"]), [float(s) for s in state["rest_scores"]]
        self.history = [dict(h) for h in state["history"]]

    def record(self) -> dict:
        """What the fine-tune record keeps of PIAD (the order itself is the manifest's ``supernet``)."""
        return {"target": self.target, "epochs": self.epochs, "proxy_samples": self.samples,
                "growth_steps": self.growth[:self.epochs], "align": self.align, "mlp_align": self.mlp_align,
                "units": len(self._every_unit()), "listed": len(self.listed),
                "listed_macs_saved": round(self.listed_fraction(), 6), "sampling": "k uniform in 0..len(list), "
                "seeded by (seed, step); the first k units of the list dropped",
                "growth": [dict(h) for h in self.history]}

    def manifest(self, manifest: dict) -> dict:
        """The artifact's manifest with this super-network's ``supernet`` record (list, then the rest)."""
        rest = self.rest if self.history else self._unranked()
        scores = self.rest_scores if self.history else [0.0] * len(rest)
        record = supernet_record(self.parts, [*self.listed, *rest], [*self.scores, *scores], flops=self.flops,
                                 by="piad", trained=len(self.listed), target=self.target,
                                 align=self.align, mlp_align=self.mlp_align)
        return {**manifest, "supernet": record}

    def _unranked(self) -> list[str]:
        """Never ranked (no step ran): the parts cut in turn, the tail first (a placeholder order)."""
        left = {name: part.units() for name, part in self.parts.items()}
        order = []
        while any(left.values()):
            for name in self.parts:
                if left[name]:
                    order.append(name)
                    left[name] -= 1
        return order


def piad_phase(student: nn.Module, config, options: dict) -> PiadPhase:
    """PIAD of ``student``'s wpac blocks (``options``: the wpac step's, for the alignments), or a clear refusal."""
    defaults = option_defaults(WpacOptions)
    if not any(isinstance(getattr(b, "attn", None), NarrowAttention) for b in student.blocks):
        raise EdgeError("--piad: the model has no width-compressed (wpac) blocks",
                        expected="an artifact of `edge compress MODEL --plan wpac:keep=1` (or wpac:macs=1)",
                        fix="compress with a wpac step first, or fine-tune without --piad")
    if config.piad_epochs > config.epochs:
        raise EdgeError(f"--piad-epochs {config.piad_epochs} is more than the {config.epochs} epoch(s) of the "
                        "schedule: the dropout list would not reach its target", fix="pass --piad-epochs <= --epochs")
    return PiadPhase(student, config, align=int(options.get("align", defaults["align"])),
                     mlp_align=int(options.get("mlp_align", defaults["mlp_align"])))


__all__ = ["PiadPhase", "growth_steps", "piad_phase", "sampled_drops", "wpac_parts"]
