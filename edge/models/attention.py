"""timm's fused-attention switch, turned off where attention must be plain matrix products."""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn


@contextmanager
def explicit_attention(model: nn.Module):
    """Turn off timm's fused attention (its ``fused_attn`` switch) while inside, then restore it.

    The fused CPU kernel is invisible to the FLOP counter; the explicit path (q @ k^T, softmax,
    @ v) computes the same thing with countable matrix products. Export uses the same switch.
    """
    switched = [m for m in model.modules() if getattr(m, "fused_attn", False) is True]
    for module in switched:
        module.fused_attn = False
    try:
        yield model
    finally:
        for module in switched:
            module.fused_attn = True
