"""Fidelity of a compressed model to its original on held-out images: how plans are scored.

The block-approximation planner (``auto-linear:K``) and the latency planner (``edge plan``) both
score a candidate against the original model's outputs on the same held-out images: the KL
divergence of the class probabilities (primary), top-1 agreement, and the relative error of the
final pooled representation (the only one for a headless model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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
