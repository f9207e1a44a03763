"""Block approximation (TOAST / RBA): blocks S+1..E become one closed-form (or trained) map.

Plan steps ``METHOD:S-E[:key=value...]``: ``linear:2-3`` replaces blocks S+1..E (here block 3) by
one map from the output of block S to the output of block E; ``S = -1`` starts from the
embedding output. Methods: identity, linear, affine (closed form, float64 from streamed sums),
skip (blocks removed, the papers' baseline), mlp and resmlp (trained translators, the papers'
comparison baselines). Options: ``ridge=FLOAT`` (relative ridge term), ``prefix=own`` (fit the
class/register tokens with their own map), ``steps=N`` and ``lr=FLOAT`` for the trained
translators. ``auto-linear:K`` / ``auto-affine:K`` let the planner choose K blocks by held-out
fidelity (:mod:`edge.compress.methods.block_approximation.span_search`).

The modules (:class:`~edge.compress.methods.block_approximation.module.ApproximatedSpan`) stand in ``model.blocks``.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.analysis.collect import collect_block_moments
from edge.compress.method import BuildContext, Built, Method, PlanCheck, parse_count
from edge.compress.methods.block_approximation.fit import fit_spans
from edge.compress.methods.block_approximation.module import (
    AUTO_METHODS,
    SPAN_METHODS,
    ApproximatedSpan,
    AutoStep,
    SpanOptions,
    SpanStep,
    replace_spans,
)
from edge.compress.methods.block_approximation.span_search import search_spans
from edge.compress.options import parse_options
from edge.compress.plan import parse_plan
from edge.compress.registry import register_method
from edge.compress.moves import Move
from edge.errors import EdgeError
from edge.models.info import model_info
from edge.progress import log


class BlockApproximation(Method):
    name = "block-approximation"
    keywords = (*SPAN_METHODS, *AUTO_METHODS)
    step_types = (SpanStep, AutoStep)
    module_types = (ApproximatedSpan,)
    order = 10
    options = SpanOptions
    grammar = ("Block approximation: METHOD:S-E[:key=value] replaces blocks S+1..E (S=-1: from the embedding). "
               "Methods: identity, linear, affine, skip, mlp, resmlp; auto-linear:K, auto-affine:K; "
               "steps and lr train mlp and resmlp.")

    def parse(self, keyword: str, rest: str, text: str) -> SpanStep | AutoStep:
        where, *option_parts = rest.split(":") if rest else [""]
        options = parse_options(option_parts, text, SpanOptions)
        if keyword in AUTO_METHODS:
            count = parse_count(where, text, "block", expected=f"{keyword}:K, e.g. {keyword}:3")
            return AutoStep(keyword.removeprefix("auto-"), count, options)
        try:
            start_text, end_text = where.rsplit("-", 1) if not where.startswith("-") or where.count("-") > 1 \
                else ("", "")
            start, end = int(start_text), int(end_text)
        except ValueError as e:
            raise EdgeError(f"plan step {text!r} has no span", expected=f"{keyword}:S-E, e.g. {keyword}:2-3 "
                            "(blocks S+1..E replaced; S = -1 starts from the embedding output)") from e
        if start >= end:
            raise EdgeError(f"plan step {text!r} has S >= E", expected="S < E: the span S-E replaces blocks S+1..E")
        return SpanStep(keyword, start, end, options)

    def sort_key(self, step) -> tuple:
        return (0, step.start) if isinstance(step, SpanStep) else (1, 0)

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        """Every index within the model; no two spans replace the same block; one auto step that fits."""
        n = check.num_blocks
        for step in (s for s in steps if isinstance(s, SpanStep)):
            if not -1 <= step.start < n or not 0 <= step.end < n:
                raise EdgeError(f"plan step {step} is out of range for a model with {n} blocks",
                                expected=f"-1 <= S < E <= {n - 1} (S = -1: from the embedding output)",
                                fix="`edge models MODEL` lists the model's blocks")
            for block in step.blocks:
                if block in check.removed:
                    raise EdgeError(f"plan steps {check.removed[block]} and {step} overlap (both replace block "
                                    f"{block})", expected="non-overlapping spans, e.g. linear:2-4,linear:4-6",
                                    fix="merge them into one span or separate them")
                check.removed[block] = step
        autos = [s for s in steps if isinstance(s, AutoStep)]
        if len(autos) > 1:
            raise EdgeError(f"plan has {len(autos)} auto steps ({', '.join(map(str, autos))})",
                            expected="at most one auto-METHOD:K step (beside any fixed spans)",
                            fix="merge them into one auto step, e.g. auto-linear:3")
        budget = n - len(check.removed)
        for step in autos:
            if step.count > budget:
                raise EdgeError(f"plan step {step} asks for {step.count} blocks, {budget} are left to replace",
                                expected=f"K <= {budget}", fix=f"ask for at most {budget} blocks")

    def search_space(self, info) -> SpanSearch:
        return SpanSearch(self.name, info.num_blocks)

    def build(self, steps: tuple, context: BuildContext) -> Built:
        spans = tuple(s for s in steps if isinstance(s, SpanStep))
        auto = next((s for s in steps if isinstance(s, AutoStep)), None)
        model, calibration = context.model, context.calibration
        table: list[dict] = []
        if auto is not None:
            spans, table = self._plan(auto, spans, context)
        modules, fit = {}, {}
        if spans:
            # The chosen (or given) spans are fitted on all calibration samples.
            moments = context.memo(self.name, lambda: collect_block_moments(
                model, calibration, context.spec, batch_size=context.batch_size, desc="fit statistics",
                device=context.device))
            modules, fit = fit_spans(model, spans, moments, calibration, context.spec, context.seed, context.device)
        return Built(spans, modules, fit, table, {b for s in spans for b in s.blocks})

    @staticmethod
    def _plan(auto: AutoStep, fixed: tuple[SpanStep, ...], context: BuildContext) -> tuple[tuple, list[dict]]:
        samples = context.samples
        n_hold = max(1, int(round(samples * context.holdout)))
        if samples - n_hold < 2:
            raise EdgeError(f"{samples} calibration samples are too few for an auto plan",
                            expected="--samples >= 10", fix="raise --samples")
        fit_part = context.calibration.subset(torch.arange(samples - n_hold), "fit")
        holdout = context.calibration.subset(torch.arange(samples - n_hold, samples), "holdout")
        moments = collect_block_moments(context.model, fit_part, context.spec, batch_size=context.batch_size,
                                        desc="fit statistics", device=context.device)
        asked = ",".join(map(str, (*fixed, auto)))
        log(f"planning {asked}: {len(fit_part)} fit / {len(holdout)} held-out samples")
        spans, table = search_spans(context.model, auto, fixed, moments, holdout, context.spec, context.seed,
                                 context.device)
        log(f"planner chose {','.join(map(str, spans))}")
        return spans, table

    def place(self, model: nn.Module, built: Built) -> None:
        replace_spans(model, built.modules)

    def record(self, model: nn.Module, step: SpanStep, prepared: dict) -> dict:
        span = next(m for m in model.blocks if isinstance(m, ApproximatedSpan) and m.replaced == step.blocks)
        return {"replaced": list(span.replaced), "method": span.method, "own_prefix_map": span.prefix_map is not None,
                "bias": isinstance(span.map, nn.Linear) and span.map.bias is not None}

    def restore(self, model: nn.Module, records: list[dict]) -> None:
        info = model_info(model)
        spans = {}
        for record in records:
            replaced = tuple(record["replaced"])
            spans[replaced] = ApproximatedSpan(record["method"], replaced, info.embed_dim, info.num_prefix_tokens,
                                               own_prefix_map=record["own_prefix_map"], bias=record["bias"])
        replace_spans(model, spans)

    def upgrade_v1(self, manifest: dict) -> list[dict]:
        steps = {s.blocks: s for s in parse_plan(manifest["plan"]).steps_of(self)}
        return [{"method": self.name, "step": str(steps[tuple(r["replaced"])]),
                 "options": dict(steps[tuple(r["replaced"])].options), "record": r} for r in manifest["spans"]]


class SpanSearch:
    """``edge plan``'s walk: one block more replaced at a time; each run of adjacent blocks a..c is one
    closed-form linear map ``linear:(a-1)-c`` (the planner joins neighbours into one span)."""

    def __init__(self, method: str, num_blocks: int) -> None:
        self.method, self.num_blocks = method, num_blocks

    def initial(self) -> frozenset[int]:
        return frozenset()

    def moves(self, state) -> list[Move]:
        return [Move(f"remove:{b}", f"block {b}: replaced by a linear map", frozenset(state | {b}), (b,))
                for b in range(self.num_blocks) if b not in state]

    def release(self, state, blocks: tuple[int, ...]) -> frozenset[int]:
        return state - set(blocks)

    def steps(self, state) -> str:
        runs: list[list[int]] = []
        for block in sorted(state):
            if runs and block == runs[-1][-1] + 1:
                runs[-1].append(block)
            else:
                runs.append([block])
        return ",".join(f"linear:{run[0] - 1}-{run[-1]}" for run in runs)


register_method(BlockApproximation())
