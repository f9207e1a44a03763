"""Attention removal (NOSE + dilution learning): a block that keeps only its MLP.

:class:`MLPOnlyBlock` stands at ``blocks[i]`` in place of a timm ``Block`` whose attention
sub-layer is gone. It computes

    x = scale * x
    x = x + drop_path2(ls2(mlp(norm2(x))))

``scale`` is 1 when the attention sub-layer is removed training-free (the residual only) and 2
after dilution learning (Eq. 9 of the paper at M = 0: ``M * Attn(x) + (2 - M) * x`` -> ``2 x``).
It is a persistent buffer, so a restored model gets it from the weights file. No attention
weight (``norm1``, ``attn``, ``ls1``) is left in the module.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.compress.cost import linear_flops


class MLPOnlyBlock(nn.Module):
    """A transformer block without attention: ``x = scale x; x = x + MLP(LN(x))``."""

    scale: torch.Tensor

    def __init__(self, norm2: nn.Module, mlp: nn.Module, ls2: nn.Module | None = None,
                 drop_path2: nn.Module | None = None, scale: float = 1.0, index: int | None = None) -> None:
        super().__init__()
        self.norm2 = norm2
        self.mlp = mlp
        self.ls2 = ls2 if ls2 is not None else nn.Identity()
        self.drop_path2 = drop_path2 if drop_path2 is not None else nn.Identity()
        self.register_buffer("scale", torch.tensor(float(scale)))
        self.index = index    # the original block index (for records and reports)

    @classmethod
    def from_block(cls, block: nn.Module, scale: float = 1.0, index: int | None = None) -> MLPOnlyBlock:
        """The MLP half of a timm ``Block`` (its own modules, not copies)."""
        return cls(block.norm2, block.mlp, getattr(block, "ls2", None), getattr(block, "drop_path2", None),
                   scale=scale, index=index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(self.scale) != 1.0:
            x = x * self.scale
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def flops(self, tokens: int) -> int:
        return linear_flops(self, tokens)

    def extra_repr(self) -> str:
        return f"index={self.index}, scale={float(self.scale):g}"
