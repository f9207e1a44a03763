"""Attention removal (Lambda-ViT: NOSE selection, dilution learning) as a plan step.

``attnrm:blocks=0+1+3`` removes the attention sub-layer of blocks 0, 1 and 3; ``attnrm:auto=K``
lets NOSE (greedy transfer entropy to the output, :mod:`edge.analysis.entropy`) choose K blocks;
``select=first`` (the K lowest free blocks) and ``select=random:seed=S`` (a seeded sample of the
free blocks) are the paper's baselines. ``init=identity`` (default) puts an
:class:`~edge.compress.methods.attnrm.module.MLPOnlyBlock` (scale 1: the residual only) at ``blocks[i]``;
``init=affine`` (ours, training-free) puts a closed-form affine map of the attention input,
fitted on the calibration tokens (``ridge=F``, relative, default 1e-4), at ``blocks[i].attn``.
Dilution learning (scale 2) is ``edge finetune --dilute``.

A free block is one no span removes and whose attention no other step replaces; at least one
block keeps its attention. In a plan the method comes after block spans and before dwconv
(``order`` 15), so ``attnrm:auto`` leaves out the blocks that spans and explicit dwconv steps
take, and ``dwconv:auto`` leaves out the blocks attnrm took.
"""

from __future__ import annotations

from torch import nn

from edge.compress.method import BuildContext, Built, Method, PlanCheck, check_block_index, parse_count
from edge.compress.methods.attnrm.build import (
    attnrm_records,
    check_block,
    collect_attention_moments,
    fit_affine_attention,
    place_modules,
    positions,
    removable_blocks,
    restore_attnrm,
    select_blocks,
)
from edge.compress.methods.attnrm.module import ATTNRM, AffineAttention, AttnRmOptions, AttnRmStep, MLPOnlyBlock
from edge.compress.moves import BlockSetSearch
from edge.compress.options import option_defaults, parse_options
from edge.compress.registry import method_of, methods, register_method
from edge.errors import EdgeError

USAGE = "attnrm:blocks=0+1+3 or attnrm:auto=K (select=nose|first|random, seed=S for random)"


def _options(parts: list[str], text: str, auto: bool) -> dict:
    options = parse_options(parts, text, AttnRmOptions)
    if "ridge" in options and options.get("init", option_defaults(AttnRmOptions)["init"]) != "affine":
        raise EdgeError(f"ridge= in plan step {text!r} applies to init=affine only",
                        fix="add :init=affine or drop ridge")
    if not auto and ("select" in options or "seed" in options):
        raise EdgeError(f"select=/seed= in plan step {text!r}: the blocks are listed, nothing is selected",
                        expected="select and seed with attnrm:auto=K only")
    if "seed" in options and options.get("select") != "random":
        raise EdgeError(f"seed= in plan step {text!r} applies to select=random only",
                        fix="add :select=random or drop seed")
    return options


def _blocks(value: str, text: str) -> tuple[int, ...]:
    try:
        blocks = tuple(sorted({int(b) for b in value.split("+")}))
    except ValueError as e:
        raise EdgeError(f"plan step {text!r} does not list blocks", expected=USAGE) from e
    return blocks


class AttentionRemoval(Method):
    name = ATTNRM
    keywords = (ATTNRM,)
    step_types = (AttnRmStep,)
    module_types = (MLPOnlyBlock, AffineAttention)
    order = 15
    options = AttnRmOptions
    grammar = ("Attention removal: attnrm:blocks=0+1+3, attnrm:auto=K (NOSE; select=first or "
               "select=random:seed=S for the baselines); ridge with init=affine.")

    def parse(self, keyword: str, rest: str, text: str) -> AttnRmStep:
        where, *option_parts = rest.split(":") if rest else [""]
        key, _, value = where.partition("=")
        if key == "auto":
            count = parse_count(value, text, "block", expected="attnrm:auto=K, e.g. attnrm:auto=4")
            return AttnRmStep(auto=count, options=_options(option_parts, text, auto=True))
        if key == "blocks" and value:
            return AttnRmStep(blocks=_blocks(value, text), options=_options(option_parts, text, auto=False))
        raise EdgeError(f"plan step {text!r} does not say which attention to remove", expected=USAGE)

    def sort_key(self, step: AttnRmStep) -> tuple:
        return (not step.is_resolved, str(step))

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        """Blocks within the model, not removed by a span, not claimed twice; one automatic step that fits."""
        n = check.num_blocks
        autos = [s for s in steps if not s.is_resolved]
        if len(autos) > 1:
            raise EdgeError(f"plan has {len(autos)} automatic attnrm steps ({', '.join(map(str, autos))})",
                            expected="at most one attnrm:auto=K step", fix="merge them into one step")
        mine: set[int] = set()
        for step in (s for s in steps if s.is_resolved):
            for block in step.blocks:
                check_block_index(step, block, n)
                if block in check.removed:
                    raise EdgeError(f"plan step {step} removes the attention of block {block}, which "
                                    f"{check.removed[block]} replaces as a whole",
                                    fix="leave that block out of one of the two steps")
                other = check.attention.get(block)
                if other is not None and other is not step:
                    raise EdgeError(f"plan steps {other} and {step} both replace the attention of block {block}",
                                    fix="give each block's attention to one step")
                check.attention[block] = step
                mine.add(block)
        if mine and len(mine | set(check.removed)) >= n:
            raise EdgeError(f"plan removes the attention of every block it keeps ({'+'.join(map(str, sorted(mine)))})",
                            expected="at least one block that keeps its attention",
                            fix="leave one block out of the attnrm steps")
        free = n - len(check.removed) - len(set(check.attention) - set(check.removed))
        for step in autos:
            if step.auto >= free:
                raise EdgeError(f"plan step {step} asks for {step.auto} attention layers, {free} blocks are free "
                                "(not removed by a span, attention not replaced by another step)",
                                expected=f"K < {free}: at least one block keeps its attention",
                                fix=f"ask for at most {free - 1}")

    def prepare(self, model: nn.Module, steps: tuple, plan) -> dict:
        """Note the blocks whose attention steps of methods after this one replace (``attnrm:auto`` skips them)."""
        if all(s.is_resolved for s in steps):
            return {}      # nothing to choose (and the record stays the same whatever else the plan holds)
        later = [m for m in methods() if m.order > self.order]
        claimed = sorted({b for s in plan.steps if s.is_resolved and method_of(s) in later
                          for b in getattr(s, "touched_blocks", getattr(s, "blocks", ()))})
        return {"claimed_by_later_steps": claimed}

    def search_space(self, info) -> BlockSetSearch:
        return BlockSetSearch(self.name, info.num_blocks,
                              "attnrm:blocks={blocks}:init=affine",
                              "attention removed (affine map in its place)")

    def build(self, steps: tuple, context: BuildContext) -> Built:
        model = context.model
        place = positions(model)
        claimed = set(context.prepared.get(self.name, {}).get("claimed_by_later_steps", ()))
        fixed = {b for s in steps if s.is_resolved for b in s.blocks}
        excluded = set(context.removed) | claimed | fixed
        free = [b for b in sorted(place) if b not in excluded]
        resolved, planner, selection = [], [], {}
        for step in steps:
            if step.is_resolved:
                resolved.append(step)
                continue
            chosen, rows, decided = select_blocks(step, free, model, context.calibration, context.spec, excluded,
                                                  context.batch_size, context.device)
            resolved.append(chosen)
            planner += rows
            selection[str(step)] = {**decided, "chosen": str(chosen)}
        targets = {b: s for s in resolved for b in s.blocks}
        for block in targets:
            if block not in place:
                raise EdgeError(f"block {block} is not in the model any more (a span replaced it)",
                                fix="leave it out of the attnrm step")
            check_block(model.blocks[place[block]], block)
        ridges = {b: float(s.option("ridge")) for b, s in targets.items() if s.option("init") == "affine"}
        moments = None
        if ridges and context.cache is not None:   # edge plan: every block's moments in one pass, for every plan
            blocks = removable_blocks(model)
            moments = context.memo(f"{self.name}:moments", lambda: collect_attention_moments(
                model, blocks, context.calibration, context.spec, batch_size=context.batch_size,
                device=context.device))
        affine, fits = fit_affine_attention(model, ridges, context.calibration, context.spec,
                                            batch_size=context.batch_size, moments=moments,
                                            device=context.device) if ridges else ({}, {})
        modules = {b: affine.get(b) for b in targets}
        report = {k: v for k, v in (("selection", selection), ("affine", fits)) if v}
        # every block whose attention goes is "removed" for the methods built later (dwconv:auto skips it)
        return Built(tuple(resolved), modules, {ATTNRM: report} if report else {}, planner, set(targets))

    def place(self, model: nn.Module, built: Built) -> None:
        place_modules(model, built.modules)

    def record(self, model: nn.Module, step: AttnRmStep, prepared: dict) -> dict:
        return {"blocks": attnrm_records(model, step.blocks)}

    def restore(self, model: nn.Module, records: list[dict]) -> None:
        restore_attnrm(model, [b for r in records for b in r["blocks"]])

    def training_phase(self, student: nn.Module, teacher: nn.Module, config, steps: tuple[dict, ...] = ()):
        """Dilution learning (Eq. 9) of the MLP-only blocks when the fine-tune asks for it (``--dilute``)."""
        if not getattr(config, "dilute", False):
            return None
        from edge.compress.methods.attnrm.dilution import dilution_phase

        return dilution_phase(student, teacher, config)


register_method(AttentionRemoval())
