"""The token-layout mixer as PyTorch runs it today: a layout round trip around a grouped Conv2d.

``tokens[:, P:]`` ``[B, H*W, C]`` -> ``[B, H, W, C]`` -> NCHW -> ``F.conv2d(groups=C)`` -> NHWC ->
``[B, H*W, C]``, the prefix outputs beside it, then one Concat: what edge's ONNX export of
:class:`DepthwiseAttention` computes between its value and output projections. It is the baseline
of ``benchmarks/token_depthwise.py`` and the truth of the kernel's GPU test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def patch_convolution(patches: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      grid: tuple[int, int]) -> torch.Tensor:
    """``[B, H*W, C]`` -> ``[B, H*W, C]`` through NCHW and a depthwise ``conv2d`` (zero padding k//2)."""
    batch, _, channels = patches.shape
    k = weight.shape[-1]
    nchw = patches.reshape(batch, grid[0], grid[1], channels).permute(0, 3, 1, 2)
    weight = weight.reshape(channels, 1, k, k).to(patches.dtype)
    bias = None if bias is None else bias.to(patches.dtype)
    out = F.conv2d(nchw, weight, bias, padding=k // 2, groups=channels)
    return out.permute(0, 2, 3, 1).reshape(batch, grid[0] * grid[1], channels)


def prefix_outputs(tokens: torch.Tensor, prefix_tokens: int, prefix_mode: str,
                   prefix_weights: torch.Tensor | None) -> torch.Tensor:
    """``[B, P, C]``: mean of the patch tokens for every prefix token, or the ``pool`` weighted sum of all tokens."""
    if prefix_mode == "mean":
        return tokens[:, prefix_tokens:].mean(1, keepdim=True).expand(-1, prefix_tokens, -1)
    return (tokens[:, None] * prefix_weights.to(tokens.dtype)).sum(2)


def token_depthwise_conv_torch(tokens: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                               grid: tuple[int, int], prefix_tokens: int = 0, prefix_mode: str = "mean",
                               prefix_weights: torch.Tensor | None = None) -> torch.Tensor:
    """The mixer's output ``[B, P + H*W, C]`` in the dtype of ``tokens`` (layouts as in ``reference.py``)."""
    out = patch_convolution(tokens[:, prefix_tokens:], weight, bias, grid)
    if not prefix_tokens:
        return out
    return torch.cat([prefix_outputs(tokens, prefix_tokens, prefix_mode, prefix_weights), out], dim=1)
