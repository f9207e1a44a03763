"""Initial kernels of the depthwise convolution that replaces attention heads.

Three training-free choices:

* ``gaussian``: a normalised 2-D Gaussian (sigma 1 pixel, sums to 1), the same for every channel,
  the start the authors' code uses before fine-tuning;
* ``mean``: the mean attention map of the head (over the calibration images) folded into a
  k x k relative-position kernel: ``K^h[r, s]`` is the mean, over the query patches whose
  neighbour at offset ``(r, s)`` lies on the grid, of the attention weight to that neighbour.
  Attention mass on the prefix tokens and outside the window is not represented;
* ``lsq``: a closed-form least-squares fit, per channel, of the k x k kernel and a bias to the
  real attention output of that channel at every patch token of the calibration images, with
  the same zero padding the convolution uses. Normal equations are accumulated in float64 and
  solved with a ridge term relative to the mean diagonal of the Gram matrix (the bias is not
  penalised). Under torchrun the sums are added over the processes (:meth:`KernelFit.all_reduce`)
  before the solve.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from edge import distributed


def gaussian_kernel(k: int, sigma: float = 1.0) -> torch.Tensor:
    """``[k, k]`` float64 Gaussian centred on the middle tap, normalised to sum 1."""
    offsets = torch.arange(k, dtype=torch.float64) - k // 2
    g = torch.exp(-(offsets[:, None] ** 2 + offsets[None, :] ** 2) / (2 * sigma * sigma))
    return g / g.sum()


def mean_attention_kernel(mean_map: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int,
                          k: int) -> torch.Tensor:
    """Fold mean attention maps ``[H, N, N]`` into relative-position kernels ``[H, k, k]`` (float64)."""
    rows, cols = grid
    p = num_prefix_tokens
    patch = mean_map[:, p:, p:].to(torch.float64).reshape(-1, rows, cols, rows, cols)
    r = k // 2
    out = torch.zeros(patch.shape[0], k, k, dtype=torch.float64)
    for dr in range(-r, r + 1):
        for dc in range(-r, r + 1):
            qi = torch.arange(max(0, -dr), min(rows, rows - dr))
            qj = torch.arange(max(0, -dc), min(cols, cols - dc))
            values = patch[:, qi[:, None], qj[None, :], (qi + dr)[:, None], (qj + dc)[None, :]]
            out[:, dr + r, dc + r] = values.mean((-2, -1))
    return out


def window_columns(values: torch.Tensor, grid: tuple[int, int], k: int) -> torch.Tensor:
    """``[B, rows*cols, C]`` -> ``[B, C, k*k, rows*cols]``: each token's zero-padded k x k neighbourhood.

    Tap ``r * k + s`` is the neighbour at offset ``(r - k//2, s - k//2)``, the order of
    ``Conv2d.weight[c, 0, r, s]`` (PyTorch convolution is a cross-correlation).
    """
    b, n, c = values.shape
    image = values.transpose(1, 2).reshape(b, c, *grid)
    return F.unfold(image, k, padding=k // 2).reshape(b, c, k * k, n)


@dataclass
class KernelFit:
    """Per-channel normal equations of ``y_c = sum_taps w_c[t] v_c[t] + b_c`` over tokens, in float64."""

    gram: torch.Tensor      # [C, k*k + 1, k*k + 1]
    cross: torch.Tensor     # [C, k*k + 1]
    target_sq: torch.Tensor  # [C]
    target_sum: torch.Tensor  # [C]
    count: int
    grid: tuple[int, int]
    k: int

    @classmethod
    def zeros(cls, channels: int, grid: tuple[int, int], k: int) -> KernelFit:
        t = k * k + 1
        f64 = torch.float64
        return cls(torch.zeros(channels, t, t, dtype=f64), torch.zeros(channels, t, dtype=f64),
                   torch.zeros(channels, dtype=f64), torch.zeros(channels, dtype=f64), 0, tuple(grid), k)

    def update(self, values: torch.Tensor, target: torch.Tensor) -> None:
        """``values`` and ``target``: ``[B, rows*cols, C]`` patch tokens (V, and the attention output)."""
        z = window_columns(values.to(torch.float64), self.grid, self.k)            # [B, C, T-1, N]
        z = torch.cat([z, torch.ones_like(z[:, :, :1])], 2)                        # bias column
        y = target.to(torch.float64).transpose(1, 2)                               # [B, C, N]
        self.gram += torch.einsum("bctn,bcun->ctu", z, z).cpu()   # the sums on the CPU, the products where z is
        self.cross += torch.einsum("bctn,bcn->ct", z, y).cpu()
        self.target_sq += (y * y).sum((0, 2)).cpu()
        self.target_sum += y.sum((0, 2)).cpu()
        self.count += int(y.shape[0] * y.shape[2])

    def all_reduce(self) -> KernelFit:
        """Sum every process's normal equations into these (in place; nothing changes in one process)."""
        for tensor in (self.gram, self.cross, self.target_sq, self.target_sum):
            distributed.all_reduce_sum(tensor)
        self.count = distributed.all_reduce_count(self.count)
        return self

    def solve(self, ridge: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Kernels ``[C, k, k]``, biases ``[C]`` and in-sample fit statistics (R^2 per channel summary)."""
        t = self.k * self.k
        gram = self.gram.clone()
        scale = torch.diagonal(gram[:, :t, :t], dim1=-2, dim2=-1).mean(-1).clamp_min(1e-30)   # [C]
        idx = torch.arange(t)
        gram[:, idx, idx] += ridge * scale[:, None]
        solution = torch.linalg.lstsq(gram, self.cross.unsqueeze(-1)).solution.squeeze(-1)   # [C, T]
        w = solution
        # residual sum of squares from the sums: y'y - 2 w'Z'y + w'Z'Zw
        rss = self.target_sq - 2 * (w * self.cross).sum(-1) + torch.einsum("ct,ctu,cu->c", w, self.gram, w)
        tss = self.target_sq - self.target_sum ** 2 / max(self.count, 1)
        r2 = 1 - rss.clamp_min(0) / tss.clamp_min(1e-30)
        stats = {"tokens": self.count, "ridge": ridge, "r2_mean": float(r2.mean()), "r2_min": float(r2.min()),
                 "rel_error": float((rss.clamp_min(0).sum() / self.target_sq.sum().clamp_min(1e-30)).sqrt())}
        return w[:, :t].reshape(-1, self.k, self.k), w[:, t], stats
