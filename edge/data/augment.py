"""Light, seeded training augmentation on uint8 batches: random shift (pad + crop) and flip."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shift_flip(images: torch.Tensor, generator: torch.Generator, pad: int = 2,
                      flip: bool = True) -> torch.Tensor:
    """Shift each image by up to ``pad`` pixels (zero fill) and flip half of them horizontally."""
    n, h, w = images.shape[0], images.shape[-2], images.shape[-1]
    x = images if images.ndim == 4 else images.unsqueeze(1)
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    out = _crop(padded, dy, dx, h, w)
    if flip:
        flip_mask = torch.rand(n, generator=generator) < 0.5
        out = torch.where(flip_mask[:, None, None, None], out.flip(-1), out)
    return out if images.ndim == 4 else out.squeeze(1)


def _crop(padded: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, h: int, w: int) -> torch.Tensor:
    n, c = padded.shape[:2]
    rows = (dy[:, None] + torch.arange(h)[None, :])  # [n, h]
    cols = (dx[:, None] + torch.arange(w)[None, :])  # [n, w]
    batch = torch.arange(n)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [n, h, w, c]
    return out.permute(0, 3, 1, 2).contiguous()
