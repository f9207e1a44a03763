"""Spread the post-LayerNorm channels of a ViT exactly: the inter-channel variation of pretrained ViTs.

RepQ-ViT (Li et al. 2023) observes that in pretrained ViTs a few post-LayerNorm channels span ranges
tens of times wider than the rest, because LayerNorm's learned per-channel affine (gamma, beta) varies
that much, and removes it by folding per-channel scales into the next Linear. This is the inverse:
channel ``c`` of a LayerNorm's affine is multiplied by ``s_c`` and the input column ``c`` of the Linear
that reads it (``attn.qkv`` after ``norm1``, ``mlp.fc1`` after ``norm2``, ``head`` after ``norm`` for a
class-token head) divided by it. The function is unchanged (up to float rounding); the activations
between the two are not.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def layernorm_consumers(model: nn.Module) -> list[tuple[str, nn.LayerNorm, nn.Linear]]:
    """``(name, LayerNorm, the Linear that alone reads it)`` pairs of a timm ViT."""
    pairs = []
    for b, block in enumerate(model.blocks):
        pairs.append((f"blocks.{b}.norm1", block.norm1, block.attn.qkv))
        pairs.append((f"blocks.{b}.norm2", block.norm2, block.mlp.fc1))
    if isinstance(model.fc_norm, nn.Identity) and model.global_pool == "token" and isinstance(model.head, nn.Linear):
        pairs.append(("norm", model.norm, model.head))
    return pairs


def channel_scales(embed_dim: int, count: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """Ones, but ``count`` channels (drawn with ``generator``) scaled geometrically from ``low`` to ``high``."""
    scales = torch.ones(embed_dim)
    picked = torch.randperm(embed_dim, generator=generator)[:count]
    steps = torch.linspace(math.log(low), math.log(high), count) if count > 1 else torch.tensor([math.log(high)])
    scales[picked] = steps.exp()
    return scales


def spread_layernorm_channels(model: nn.Module, count: int, low: float, high: float, seed: int) -> dict:
    """Scale ``count`` channels of every LayerNorm -> Linear pair by ``low``..``high`` (exactly compensated);
    returns the channels and factors per LayerNorm."""
    generator = torch.Generator().manual_seed(seed)
    record = {}
    with torch.no_grad():
        for name, norm, linear in layernorm_consumers(model):
            scales = channel_scales(norm.normalized_shape[0], count, low, high, generator)
            norm.weight.mul_(scales.to(norm.weight))
            norm.bias.mul_(scales.to(norm.bias))
            linear.weight.div_(scales.to(linear.weight))
            picked = torch.nonzero(scales != 1).flatten()
            record[name] = {int(c): round(float(scales[c]), 4) for c in picked}
    return record
