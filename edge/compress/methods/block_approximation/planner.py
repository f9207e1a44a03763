"""``auto-linear:K`` / ``auto-affine:K``: choose K blocks to approximate, greedily, by held-out fidelity.

Maps are fitted on the calibration images' fit part; each candidate (one more block added to
the blocks already chosen, adjacent blocks merging into one span) is scored on the held-out
part against the original model: the KL divergence of its class probabilities (primary),
top-1 agreement, and the relative error of the final pooled representation. Block Redundancy
is shown beside them for reference, not used to decide.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.analysis.collect import BlockMoments
from edge.analysis.similarity import block_redundancy
from edge.compress.methods.block_approximation.fit import apply_spans
from edge.compress.methods.block_approximation.module import AutoStep, SpanStep
from edge.data.preprocess import ArrayPreprocess, InputSpec


@dataclass(frozen=True)
class Reference:
    logits: torch.Tensor | None
    features: torch.Tensor
    inputs: torch.Tensor


@torch.no_grad()
def outputs(model: nn.Module, inputs: torch.Tensor, batch_size: int = 64) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(logits or None for a headless model, pooled pre-logit features)."""
    logits, features = [], []
    for start in range(0, len(inputs), batch_size):
        tokens = model.forward_features(inputs[start:start + batch_size])
        pre = model.forward_head(tokens, pre_logits=True)
        features.append(pre)
        logits.append(model.forward_head(tokens) if model.num_classes else pre)
    return (torch.cat(logits) if model.num_classes else None), torch.cat(features)


def reference_outputs(model: nn.Module, holdout, spec: InputSpec) -> Reference:
    inputs = ArrayPreprocess(spec)(holdout.images)
    logits, features = outputs(model, inputs)
    return Reference(logits, features, inputs)


def fidelity(model: nn.Module, reference: Reference) -> dict:
    logits, features = outputs(model, reference.inputs)
    rel = float(((features - reference.features) ** 2).sum() / (reference.features ** 2).sum())
    result = {"feature_rel_error": rel}
    if reference.logits is not None and logits is not None:
        p = F.log_softmax(reference.logits.double(), -1)
        q = F.log_softmax(logits.double(), -1)
        result["kl"] = float(F.kl_div(q, p, log_target=True, reduction="batchmean"))
        result["agreement"] = float((logits.argmax(-1) == reference.logits.argmax(-1)).double().mean())
    return result


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


def plan_auto(model: nn.Module, auto: AutoStep, fixed: tuple[SpanStep, ...], moments: BlockMoments, holdout,
              spec: InputSpec, seed: int = 0) -> tuple[tuple[SpanStep, ...], list[dict]]:
    """Resolve ``auto`` greedily beside the ``fixed`` spans; returns all spans and the candidate table."""
    taken = {b for s in fixed for b in s.blocks}
    reference = reference_outputs(model, holdout, spec)
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
            apply_spans(candidate, spans, moments, holdout, spec, seed)
            candidates.append({"round": round_index + 1, "block": block, "plan": ",".join(map(str, spans)),
                               **fidelity(candidate, reference), "block_redundancy": redundancy[block]})
        best = min(candidates, key=_score)
        for row in candidates:
            row["chosen"] = row is best
        table.extend(candidates)
        chosen.add(best["block"])
    return spans_for(chosen, auto.method, auto.options, fixed), table
