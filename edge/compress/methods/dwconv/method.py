"""Drop-in depthwise convolution (Scribano et al.) in place of attention, as a plan step.

``dwconv:blocks=2+5+7`` (every head of blocks 2, 5 and 7), ``dwconv:auto=K`` (the K blocks of
lowest Sigma_b; ``order=highest`` for the paper's ablation), ``dwconv:heads=auto=K`` (the K heads
of lowest Sigma_h anywhere, scattered) or ``dwconv:heads=2.0+5.3`` (block.head). Options:
``init=gaussian|mean|lsq``, ``k=ODD``, ``variant=unensembled|ensembled|full``,
``prefix=mean|pool|attend|drop``, ``order=lowest|highest``, ``ridge=FLOAT`` (for init=lsq).

The module (:class:`~edge.compress.methods.dwconv.module.DepthwiseAttention`) stands at ``blocks[i].attn``;
selection and fits are in :mod:`edge.compress.methods.dwconv.build`, the kernels in
:mod:`edge.compress.methods.dwconv.kernels`.
"""

from __future__ import annotations

from torch import nn

from edge.compress.method import BuildContext, Built, Method, PlanCheck, check_block_index, parse_count
from edge.compress.methods.dwconv.build import build_dwconv, dwconv_records, place_dwconv, restore_dwconv
from edge.compress.methods.dwconv.module import (
    DWCONV,
    DepthwiseAttention,
    DWConvOptions,
    DWConvStep,
    drop_prefix_tokens,
)
from edge.compress.options import parse_options
from edge.compress.plan import parse_plan
from edge.compress.registry import register_method
from edge.compress.moves import BlockSetSearch
from edge.errors import EdgeError

USAGE = "dwconv:blocks=2+5+7, dwconv:auto=K, dwconv:heads=auto=K or dwconv:heads=2.0+5.3 (block.head)"


def _options(parts: list[str], text: str) -> dict:
    options = parse_options(parts, text, DWConvOptions)
    if options.get("k", 1) % 2 == 0:
        raise EdgeError(f"k={options['k']} in plan step {text!r}: the kernel size must be odd",
                        expected="an odd kernel size such as 3 or 5", fix="use k=3 (the paper's choice)")
    return options


def _count(text: str, step_text: str, what: str) -> int:
    return parse_count(text, step_text, what, expected="dwconv:auto=K or dwconv:heads=auto=K, e.g. dwconv:auto=6")


class DepthwiseConvolution(Method):
    name = DWCONV
    keywords = (DWCONV,)
    step_types = (DWConvStep,)
    module_types = (DepthwiseAttention,)
    order = 20
    options = DWConvOptions
    grammar = ("Depthwise convolution in place of attention: dwconv:blocks=2+5+7, dwconv:auto=K (lowest Sigma_b), "
               "dwconv:heads=auto=K (scattered); the kernel size k is odd.")

    def parse(self, keyword: str, rest: str, text: str) -> DWConvStep:
        where, *option_parts = rest.split(":") if rest else [""]
        options = _options(option_parts, text)
        key, _, value = where.partition("=")
        try:
            if key == "auto":
                return DWConvStep(auto=_count(value, text, "block"), options=options)
            if key == "heads" and value.startswith("auto="):
                count = _count(value.removeprefix("auto="), text, "head")
                return DWConvStep(auto=count, scattered=True, options=options)
            if key == "heads" and value:
                pairs = tuple(sorted({(int(b), int(h)) for b, h in (item.split(".") for item in value.split("+"))}))
                return DWConvStep(heads=pairs, options=options)
            if key == "blocks" and value:
                return DWConvStep(blocks=tuple(sorted({int(b) for b in value.split("+")})), options=options)
        except ValueError as e:
            raise EdgeError(f"plan step {text!r} does not say which attention to replace", expected=USAGE) from e
        raise EdgeError(f"plan step {text!r} does not say which attention to replace", expected=USAGE)

    def sort_key(self, step: DWConvStep) -> tuple:
        return (not step.is_resolved, str(step))

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        """Blocks within the model, not removed by another step, not replaced twice; one automatic step."""
        n = check.num_blocks
        removed = set(check.removed)
        if len([s for s in steps if not s.is_resolved]) > 1:
            raise EdgeError(f"plan has {len(steps)} automatic dwconv steps",
                            expected="at most one dwconv:auto=K or dwconv:heads=auto=K step",
                            fix="merge them into one step or list the blocks (dwconv:blocks=2+5+7)")
        seen: dict[int, DWConvStep] = {}
        for step in steps:
            for block in step.touched_blocks:
                check_block_index(step, block, n)
                if block in removed:
                    raise EdgeError(f"plan step {step} replaces the attention of block {block}, which a span "
                                    "removes", fix="leave that block out of one of the two steps")
                if block in check.attention and check.attention[block] is not step:
                    raise EdgeError(f"plan steps {check.attention[block]} and {step} both replace attention in "
                                    f"block {block}", fix="list each block in one dwconv step")
                seen[block] = check.attention[block] = step
        free = n - len(removed) - len(seen)
        for step in steps:
            if step.auto and not step.scattered and step.auto > free:
                raise EdgeError(f"plan step {step} asks for {step.auto} blocks, {free} are left",
                                expected=f"K <= {free}", fix=f"ask for at most {free} blocks")

    def prepare(self, model: nn.Module, steps: tuple, plan) -> dict:
        """``prefix=drop`` (the paper's [CLS] handling) changes the whole model, so all dwconv steps must agree."""
        modes = {s.option("prefix") == "drop" for s in steps}
        if len(modes) > 1:
            raise EdgeError(f"plan {plan} drops the prefix tokens in some dwconv steps only",
                            expected="prefix=drop on every dwconv step or on none (it removes [CLS] from the model)")
        if modes != {True} or not model.num_prefix_tokens:
            return {}      # the model is unchanged
        if len(plan.steps) > len(steps):
            raise EdgeError(f"plan {plan} combines prefix=drop with block spans",
                            expected="prefix=drop only in plans of dwconv steps", fix="use prefix=mean")
        drop_prefix_tokens(model)
        return {"prefix_dropped": True}

    def search_space(self, info) -> BlockSetSearch:
        return BlockSetSearch(self.name, info.num_blocks,
                              "dwconv:blocks={blocks}",
                              "attention -> 3x3 depthwise convolution over V")

    def build(self, steps: tuple, context: BuildContext) -> Built:
        resolved, modules, stats = build_dwconv(context.model, steps, context.calibration, context.spec,
                                                excluded=context.removed, batch_size=context.batch_size,
                                                memo=context.memo if context.cache is not None else None,
                                                device=context.device)
        dropped = context.prepared.get(self.name, {}).get("prefix_dropped", False)
        fit = {"dwconv": {**stats, "prefix_dropped": dropped}} if stats else {}
        return Built(resolved, modules, fit)

    def place(self, model: nn.Module, built: Built) -> None:
        place_dwconv(model, built.modules)

    def record(self, model: nn.Module, step: DWConvStep, prepared: dict) -> dict:
        modules = [r for r in dwconv_records(model) if r["block"] in step.touched_blocks]
        return {"modules": modules, "prefix_dropped": bool(prepared.get("prefix_dropped", False))}

    def restore_prepare(self, model: nn.Module, records: list[dict]) -> None:
        if any(r.get("prefix_dropped") for r in records):
            drop_prefix_tokens(model)

    def restore(self, model: nn.Module, records: list[dict]) -> None:
        restore_dwconv(model, [m for r in records for m in r["modules"]])

    def upgrade_v1(self, manifest: dict) -> list[dict]:
        modules, dropped = manifest.get("dwconv", []), bool(manifest.get("prefix_dropped", False))
        return [{"method": self.name, "step": str(step), "options": dict(step.options),
                 "record": {"modules": [m for m in modules if m["block"] in step.touched_blocks],
                            "prefix_dropped": dropped}}
                for step in parse_plan(manifest["plan"]).steps_of(self)]


register_method(DepthwiseConvolution())
