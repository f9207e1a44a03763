"""The token-layout depthwise convolution in numpy: the maths of ``tokenDepthwiseConvKernel.cu``.

Needs numpy only (no torch), so that it can serve as an ONNX Runtime custom op where the plugin has
no CUDA build. Layouts as in the kernel's header:

* ``tokens``          ``[B, P + H*W, C]``: P prefix tokens, then the patches row by row;
* ``weight``          ``[C, k, k]`` (or PyTorch's ``[C, 1, k, k]``), cross-correlation as ``Conv2d``;
* ``bias``            ``[C]`` or None, added to patch outputs only;
* ``prefix_weights``  ``[P, P + H*W, C]`` for ``prefix_mode="pool"``.

Prefix outputs: ``mean`` gives every prefix token the mean of the patch tokens; ``pool`` gives prefix
token p the sum over all tokens n of ``prefix_weights[p, n] * tokens[n]`` (edge's ``prefix=mean`` and
``prefix=pool`` of :class:`DepthwiseAttention`; ``prefix=drop`` is ``P = 0``).
"""

from __future__ import annotations

import numpy as np

# The kernel's prefix modes; a mode's index is its value in the C ABI (TokenDepthwisePrefixMode).
PREFIX_MODES = ("mean", "pool")


def check_arguments(tokens: np.ndarray, weight: np.ndarray, grid: tuple[int, int], prefix_tokens: int,
                    prefix_mode: str, prefix_weights: np.ndarray | None) -> None:
    """Refuse shapes the kernel refuses (cudaErrorInvalidValue there), naming what was expected."""
    rows, cols = grid
    if tokens.ndim != 3 or tokens.shape[1] != prefix_tokens + rows * cols:
        raise ValueError(f"tokens of shape {tokens.shape}: expected [B, {prefix_tokens} + {rows}*{cols}, C]")
    channels, k = tokens.shape[2], weight.shape[-1]
    if weight.reshape(-1, k, k).shape[0] != channels or k % 2 == 0 or k > min(rows, cols):
        raise ValueError(f"weight of shape {weight.shape}: expected [{channels}, k, k] with odd k <= {min(rows, cols)}")
    if prefix_mode not in PREFIX_MODES:
        raise ValueError(f"prefix_mode={prefix_mode!r}: expected one of {PREFIX_MODES}")
    wanted = (prefix_tokens, tokens.shape[1], channels)
    if prefix_tokens and prefix_mode == "pool" and (prefix_weights is None or prefix_weights.shape != wanted):
        found = None if prefix_weights is None else prefix_weights.shape
        raise ValueError(f"prefix_weights of shape {found}: prefix_mode='pool' expects {list(wanted)}")


def depthwise_on_grid(patches: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``[B, H, W, C]`` -> ``[B, H, W, C]``: each channel cross-correlated with its k x k kernel, zero padding k//2."""
    _, rows, cols, channels = patches.shape
    k = weight.shape[-1]
    half = k // 2
    padded = np.pad(patches, ((0, 0), (half, half), (half, half), (0, 0)))
    out = np.zeros_like(patches)
    for i in range(k):
        for j in range(k):   # tap (i, j) reads the neighbour (y + i - k//2, x + j - k//2)
            out += weight[:, i, j] * padded[:, i:i + rows, j:j + cols, :]
    return out


def prefix_outputs(tokens: np.ndarray, prefix_tokens: int, prefix_mode: str,
                   prefix_weights: np.ndarray | None) -> np.ndarray:
    """``[B, P, C]``: the prefix tokens' outputs (mean of the patch tokens, or the pooled sum of all tokens)."""
    if prefix_mode == "mean":
        mean = tokens[:, prefix_tokens:].mean(axis=1, keepdims=True)
        return np.repeat(mean, prefix_tokens, axis=1)
    return (tokens[:, None] * prefix_weights[None]).sum(axis=2)


def token_depthwise_conv(tokens: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, *,
                         grid: tuple[int, int], prefix_tokens: int = 0, prefix_mode: str = "mean",
                         prefix_weights: np.ndarray | None = None) -> np.ndarray:
    """The mixer's output ``[B, P + H*W, C]`` in the dtype of ``tokens``, computed in float64."""
    check_arguments(tokens, weight, grid, prefix_tokens, prefix_mode, prefix_weights)
    batch, _, channels = tokens.shape
    k = weight.shape[-1]
    x = tokens.astype(np.float64)
    w = weight.reshape(channels, k, k).astype(np.float64)
    patches = x[:, prefix_tokens:].reshape(batch, grid[0], grid[1], channels)
    out = depthwise_on_grid(patches, w).reshape(batch, grid[0] * grid[1], channels)
    if bias is not None:
        out = out + bias.astype(np.float64)
    if prefix_tokens:
        pooled = None if prefix_weights is None else prefix_weights.astype(np.float64)
        out = np.concatenate([prefix_outputs(x, prefix_tokens, prefix_mode, pooled), out], axis=1)
    return out.astype(tokens.dtype)
