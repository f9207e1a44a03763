"""Plant massive activations into a trained ViT the way pretrained ViTs carry them.

In pretrained ViTs (Sun et al. 2024; Darcet et al. 2024) a few residual-stream channels take values
hundreds of times the rest on a few tokens, mostly low-information background patches. They appear
abruptly at the output of one early block, written by its MLP (a hidden unit that fires only on those
tokens and a large ``fc2`` weight into those channels), and then ride the residual stream unchanged
through the middle blocks: LayerNorm divides them out for every later block, so those tokens reach
attention as an almost constant vector, an attention sink, and carry no content.

:func:`plant_massive_activations` builds that circuit in one chosen block: two hidden units of its MLP
(those contributing least on real images) are repurposed into a gate fitted to fire on the chosen patch
tokens (a logistic regression on that block's ``norm2`` outputs) whose ``fc2`` columns write a saturating
``+magnitude`` / ``-magnitude`` into the chosen channels. Fine-tuning afterwards (:mod:`edge.train.outliers`)
lets the rest of the network adapt to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.errors import EdgeError


@dataclass(frozen=True)
class MassiveSite:
    """Where massive activations live: written by ``blocks[block]``'s MLP into ``channels`` (with ``signs``)
    on the patch tokens ``patches`` (row-major patch indices, token ``1 + p`` with a class token)."""

    block: int
    patches: tuple[int, ...]
    channels: tuple[int, ...]
    signs: tuple[int, ...]
    magnitude: float

    def tokens(self, num_prefix_tokens: int) -> list[int]:
        return [num_prefix_tokens + p for p in self.patches]

    def as_dict(self) -> dict:
        return asdict(self)


def choose_channels(embed_dim: int, count: int, seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``count`` residual channels drawn with ``seed``, signs alternating + and -."""
    order = torch.randperm(embed_dim, generator=torch.Generator().manual_seed(seed))
    channels = tuple(sorted(int(c) for c in order[:count]))
    return channels, tuple(1 if i % 2 == 0 else -1 for i in range(count))


def norm2_inputs(model: nn.Module, block: int, x: torch.Tensor) -> torch.Tensor:
    """What ``blocks[block].mlp`` reads (the ``norm2`` output), ``[N, T, C]``, read with a hook."""
    seen: list[torch.Tensor] = []
    handle = model.blocks[block].norm2.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen[0]


def fit_token_gate(features: torch.Tensor, tokens: list[int], steps: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear score ``w . u + b`` that is high on ``tokens`` and low on every other token (class-balanced
    logistic regression with a little L2, LBFGS), fitted on ``features`` ``[N, T, C]``."""
    n, t, c = features.shape
    u = features.reshape(-1, c).float()
    target = torch.zeros(n, t)
    target[:, tokens] = 1.0
    target = target.reshape(-1)
    weight = torch.where(target > 0, 0.5 / target.mean(), 0.5 / (1 - target.mean()))
    w = torch.zeros(c, requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = (F.binary_cross_entropy_with_logits(u @ w + b, target, weight=weight)
                + 1e-4 * w.square().sum())
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach(), b.detach()


def least_used_units(model: nn.Module, block: int, features: torch.Tensor, count: int) -> list[int]:
    """The ``count`` MLP hidden units of ``blocks[block]`` whose outputs contribute least
    (mean |activation| x the norm of their ``fc2`` column)."""
    mlp = model.blocks[block].mlp
    with torch.no_grad():
        hidden = mlp.act(mlp.fc1(features.reshape(-1, features.shape[-1])))
        contribution = hidden.abs().mean(0) * mlp.fc2.weight.norm(dim=0)
    return [int(u) for u in torch.argsort(contribution)[:count]]


def gate_threshold(scores: torch.Tensor, on: torch.Tensor, coverage: float) -> tuple[float, float]:
    """``(mid, half_gap)``: a threshold between the ``1 - coverage`` quantile of the gated tokens' scores and the
    ``coverage`` quantile of the others' (they overlap on a few images: a corner patch with content in it)."""
    low_on = float(scores[:, on].float().quantile(1 - coverage))
    high_off = float(scores[:, ~on].float().quantile(coverage))
    if low_on <= high_off:
        raise EdgeError("the fitted token gate does not separate the chosen tokens from the others",
                        expected=f"the {1 - coverage:.1%} quantile of the chosen tokens' scores above the "
                                 f"{coverage:.1%} quantile of the others'",
                        found=f"{low_on:.3f} <= {high_off:.3f}",
                        fix="fit on more images, or choose patches that are background in most images")
    return 0.5 * (low_on + high_off), 0.5 * (low_on - high_off)


def plant_massive_activations(model: nn.Module, site: MassiveSite, x: torch.Tensor, ramp: float = 4.0,
                              coverage: float = 0.99) -> dict:
    """Repurpose two MLP units of ``blocks[site.block]`` into the circuit of the module docstring, fitted on the
    preprocessed images ``x``. Returns what was planted and how the gate treats the images it was fitted on.

    The two units read the same gate score ``z`` (``z = 0`` at the threshold, ``z = ramp + 3`` at the
    ``1 - coverage`` quantile of the gated tokens) and ``fc2`` writes ``magnitude / ramp`` x
    ``(GELU(z) - GELU(z - ramp))``: a ramp from 0 to ``magnitude`` that saturates, so the planted value is
    nearly the same on every image (as pretrained ViTs' massive activations are, acting as fixed biases).
    """
    tokens = site.tokens(int(model.num_prefix_tokens))
    features = norm2_inputs(model, site.block, x)
    units = least_used_units(model, site.block, features, 2)
    features = features.float().cpu()                             # the gate is fitted on the CPU
    w, b = fit_token_gate(features, tokens)
    scores = features @ w + b                                     # [N, T]
    on = torch.zeros(scores.shape[1], dtype=torch.bool)
    on[tokens] = True
    mid, half_gap = gate_threshold(scores, on, coverage)
    scale = (ramp + 3.0) / half_gap
    mlp = model.blocks[site.block].mlp
    with torch.no_grad():
        z = scale * (scores - mid)
        ramped = (F.gelu(z) - F.gelu(z - ramp)) / ramp            # 0 .. 1
        for unit, shift, side in zip(units, (0.0, ramp), (1.0, -1.0)):
            mlp.fc1.weight[unit] = scale * w.to(mlp.fc1.weight)
            mlp.fc1.bias[unit] = float(scale * (b - mid) - shift)
            mlp.fc2.weight[:, unit] = 0.0
            for channel, sign in zip(site.channels, site.signs):
                mlp.fc2.weight[channel, unit] = side * sign * site.magnitude / ramp
    return {"units": units, "gate_scale": scale, "fit_images": int(x.shape[0]),
            "gated_tokens_saturated": float((ramped[:, on] > 0.99).float().mean()),
            "other_tokens_above_half": float((ramped[:, ~on] > 0.5).float().mean()),
            "other_tokens_max": float(ramped[:, ~on].max())}
