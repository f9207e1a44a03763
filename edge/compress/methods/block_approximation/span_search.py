"""``auto-linear:K`` / ``auto-affine:K``: choose K blocks to approximate, greedily, by held-out fidelity.

Maps are fitted on the calibration images' fit part; each candidate (one more block added to
the blocks already chosen, adjacent blocks merging into one span) is scored on the held-out
part against the original model: the KL divergence of its class probabilities (primary),
top-1 agreement, and the relative error of the final pooled representation. Block Redundancy
is shown beside them for reference, not used to decide.
"""

from __future__ import annotations

import copy

from torch import nn

from edge.analysis.collect import BlockMoments
from edge.analysis.similarity import block_redundancy
from edge.compress.fidelity import fidelity, reference_outputs
from edge.compress.methods.block_approximation.fit import apply_spans
from edge.compress.methods.block_approximation.module import AutoStep, SpanStep
from edge.data.preprocess import InputSpec


def spans_for(blocks: set[int], method: str, options: dict, fixed: tuple[SpanStep, ...]) -> tuple[SpanStep, ...]:
    """Contiguous runs of ``blocks`` as spans (a run a..c is the span a-1 -> c), plus fixed spans."""
    runs, ordered = [], sorted(blocks)
    for block in ordered:
        if runs and block == runs[-1][-1] + 1:
            runs[-1].append(block)
        else:
            runs.append([block])
    auto = tuple(SpanStep(method, run[0] - 1, run[-1], dict(options)) for run in runs)
    return tuple(sorted(fixed + auto, key=lambda s: s.start))


def _score(result: dict) -> tuple[float, float]:
    return (result.get("kl", result["feature_rel_error"]), result["feature_rel_error"])


def search_spans(model: nn.Module, auto: AutoStep, fixed: tuple[SpanStep, ...], moments: BlockMoments, holdout,
              spec: InputSpec, seed: int = 0, device=None) -> tuple[tuple[SpanStep, ...], list[dict]]:
    """Resolve ``auto`` greedily beside the ``fixed`` spans; returns all spans and the candidate table (the
    passes on ``device``)."""
    taken = {b for s in fixed for b in s.blocks}
    reference = reference_outputs(model, holdout, spec, device)
    redundancy = block_redundancy(moments.view("all")).tolist()
    table: list[dict] = []
    chosen: set[int] = set()
    for round_index in range(auto.count):
        candidates = []
        for block in range(len(model.blocks)):
            if block in taken or block in chosen:
                continue
            spans = spans_for(chosen | {block}, auto.method, auto.options, fixed)
            candidate = copy.deepcopy(model)
            apply_spans(candidate, spans, moments, holdout, spec, seed, device)
            candidates.append({"round": round_index + 1, "block": block, "plan": ",".join(map(str, spans)),
                               **fidelity(candidate, reference), "block_redundancy": redundancy[block]})
        best = min(candidates, key=_score)
        for row in candidates:
            row["chosen"] = row is best
        table.extend(candidates)
        chosen.add(best["block"])
    return spans_for(chosen, auto.method, auto.options, fixed), table
