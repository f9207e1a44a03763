"""Fit and apply block-approximation spans (TOAST / RBA) to a timm ViT.

Closed-form spans are solved from the streamed float64 moments of the calibration images
(:mod:`edge.analysis`). The trained translators (``mlp``, ``resmlp``) are the papers'
comparison baselines: Adam, lr 1e-3, 300 steps on the same calibration tokens.

Under torchrun the moments are those of all processes (:func:`edge.analysis.collect_block_moments`
reduces them), so every process fits the same maps. The trained translators are not split: each
process trains the same translator on all calibration tokens, seeded, so all hold the same module
(they are small baselines fitted on about 500 images; only the main process writes it).
"""

from __future__ import annotations

import torch
from torch import nn

from edge.analysis.collect import BlockMoments, block_outputs
from edge.analysis.fit import FittedMap, fit_map, fit_residual
from edge.compress.methods.block_approximation.module import (
    CLOSED_FORM,
    TRAINED,
    ApproximatedSpan,
    SpanStep,
    replace_spans,
)
from edge.data.preprocess import InputSpec
from edge.errors import InternalError
from edge.models.info import model_info
from edge.runtime import computing_on


def _fit(moments: BlockMoments, view: str, step: SpanStep) -> tuple[FittedMap, dict]:
    stats = moments.view(view)
    fitted = fit_map(stats, step.start + 1, step.end + 1, step.method, step.ridge)
    return fitted, fit_residual(stats, step.start + 1, step.end + 1, fitted)


def closed_form_span(step: SpanStep, moments: BlockMoments, num_prefix_tokens: int) -> tuple[ApproximatedSpan, dict]:
    """The span module of an identity/linear/affine step, and its in-sample fit statistics."""
    if step.prefix == "own" and num_prefix_tokens:
        fitted, stats = _fit(moments, "patch", step)
        prefix_fitted, prefix_stats = _fit(moments, "prefix", step)
        module = ApproximatedSpan.from_fit(step.blocks, fitted, prefix_fitted, num_prefix_tokens)
        return module, {"patch": stats, "prefix": prefix_stats}
    fitted, stats = _fit(moments, "all", step)
    return ApproximatedSpan.from_fit(step.blocks, fitted, None, num_prefix_tokens), {"all": stats}


@torch.no_grad()
def span_features(model: nn.Module, images, spec: InputSpec, start: int, end: int,
                  batch_size: int = 64, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All tokens of the representations ``start`` and ``end`` (plan indices; -1 = embedding), on the CPU (the
    passes on ``device``)."""
    preprocess = images.preprocess_for(spec)
    xs, ys = [], []
    with computing_on(model, device) as put, block_outputs(model) as captured:
        for x, _ in images.batches(batch_size, preprocess):
            captured.clear()
            model.forward_features(put(x))
            xs.append(captured[start + 1].reshape(-1, captured[0].shape[-1]).cpu())
            ys.append(captured[end + 1].reshape(-1, captured[0].shape[-1]).cpu())
    return torch.cat(xs), torch.cat(ys)


def trained_span(step: SpanStep, model: nn.Module, images, spec: InputSpec, seed: int,
                 device: torch.device | None = None) -> tuple[ApproximatedSpan, dict]:
    """Train the papers' MLP / Res-MLP translator on the calibration tokens (Adam, lr 1e-3, 300 steps; the
    tokens gathered on ``device``, the translator trained on the CPU)."""
    info = model_info(model)
    x, y = span_features(model, images, spec, step.start, step.end, device=device)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    module = ApproximatedSpan(step.method, step.blocks, info.embed_dim, info.num_prefix_tokens)
    optimizer = torch.optim.Adam(module.parameters(), lr=float(step.option("lr")))
    steps, batch = int(step.option("steps")), min(4096, len(x))
    module.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=generator)
        with torch.enable_grad():
            loss = nn.functional.mse_loss(module(x[idx].unsqueeze(0)), y[idx].unsqueeze(0))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    module.eval()
    mse = nn.functional.mse_loss(module(x.unsqueeze(0)), y.unsqueeze(0)).item()
    return module, {"all": {"mse": mse, "r2": 1 - mse / float(y.var(0, unbiased=False).mean())}}


def fit_spans(model: nn.Module, spans: tuple[SpanStep, ...], moments: BlockMoments, images, spec: InputSpec,
              seed: int = 0, device: torch.device | None = None) -> tuple[dict[tuple[int, ...], nn.Module], dict]:
    """The module of every span (keyed by the original blocks it replaces) and fit statistics per span.

    ``model`` is not changed.
    """
    info = model_info(model)
    modules, fit_stats = {}, {}
    for step in spans:
        if step.method in CLOSED_FORM:
            module, stats = closed_form_span(step, moments, info.num_prefix_tokens)
        elif step.method == "skip":
            module = ApproximatedSpan("skip", step.blocks, info.embed_dim, info.num_prefix_tokens)
            stats = {"all": fit_residual(moments.view("all"), step.start + 1, step.end + 1,
                                         FittedMap(torch.eye(info.embed_dim, dtype=torch.float64), None, "skip", 0))}
        elif step.method in TRAINED:
            module, stats = trained_span(step, model, images, spec, seed, device)
        else:
            raise InternalError(f"unknown span method {step.method} (plans are validated before fitting)")
        modules[step.blocks] = module
        fit_stats[str(step)] = stats
    return modules, fit_stats


def apply_spans(model: nn.Module, spans: tuple[SpanStep, ...], moments: BlockMoments, images, spec: InputSpec,
                seed: int = 0, device: torch.device | None = None) -> dict:
    """Replace every span in ``model`` (in place, after every fit); returns fit statistics per span."""
    modules, fit_stats = fit_spans(model, spans, moments, images, spec, seed, device)
    replace_spans(model, modules)
    return fit_stats
