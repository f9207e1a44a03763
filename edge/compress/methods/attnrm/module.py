"""Attention removal (NOSE + dilution learning): the modules and the plan step.

:class:`MLPOnlyBlock` stands at ``blocks[i]`` in place of a timm ``Block`` whose attention
sub-layer is gone. It computes

    x = scale * x
    x = x + drop_path2(ls2(mlp(norm2(x))))

``scale`` is 1 when the attention sub-layer is removed training-free (the residual only) and 2
after dilution learning (Eq. 9 of the paper at M = 0: ``M * Attn(x) + (2 - M) * x`` -> ``2 x``).
It is a persistent buffer, so a restored model gets it from the weights file. No attention
weight (``norm1``, ``attn``, ``ls1``) is left in the module.

What is folded for ``scale != 1``: the scale leaves the LayerNorm's input and goes into its
epsilon, ``LN_eps(s x) = LN_{eps / s^2}(x)`` (mean and deviation scale by ``s``, the variance by
``s^2``; exact in real arithmetic, and for ``s = 2`` every scaling by 4 or 2 is exact in binary
floating point too, so only the kernels' own summation order can differ). The residual keeps
``s * x`` as one Mul, which is exact for ``s = 2``. The exported block is therefore
``LayerNormalization(x, eps / 4) -> MLP`` beside ``Mul(x, 2) -> Add``: the Mul feeds only the
residual Add (an element-wise pair a runtime can run as one kernel) instead of a tensor that
both the LayerNorm and the Add read. ``scale = 1`` exports no Mul at all. A norm that is not a
``LayerNorm`` (RMSNorm, ...) gets ``norm2(s x)`` as written. The fold's tolerance against
``norm2(2 x)`` is tested at 1e-5 (float32); on this CPU the two were bit-identical for all 12
blocks of the reference model, and the exported graph passes the export tolerances.

:class:`AffineAttention` is the training-free alternative ("ours", not in the paper): the
attention sub-layer at ``blocks[i].attn`` becomes one affine map of its input (the ``norm1``
output) fitted in closed form to the attention output (``proj`` included) on the calibration
tokens; the block keeps ``norm1``, ``ls1`` and its MLP.

Plan steps (:class:`AttnRmStep`): ``attnrm:blocks=0+1+3``, ``attnrm:auto=K`` (NOSE by default,
``select=first`` or ``select=random:seed=S`` as baselines), options ``init=identity|affine`` and
``ridge=F`` (affine). Indices are the original model's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from edge.analysis.fit import FittedMap
from edge.compress.cost import linear_flops
from edge.compress.options import format_options, option_defaults, plan_option

ATTNRM = "attnrm"


@dataclass(frozen=True)
class AttnRmOptions:
    """The options of an ``attnrm`` step (``attnrm:auto=3:select=random:seed=5``)."""

    init: Literal["identity", "affine"] = plan_option("identity")   # MLP-only block, or an affine attention map
    ridge: float = plan_option(1e-4, minimum=0)                      # relative ridge of init=affine
    select: Literal["nose", "first", "random"] = plan_option("nose")  # auto: NOSE, or the paper's baselines
    seed: int = plan_option(0, minimum=0)                             # select=random


@dataclass(frozen=True)
class AttnRmStep:
    """Remove the attention of ``blocks`` (original indices), or of ``auto`` > 0 blocks chosen by ``select``."""

    blocks: tuple[int, ...] = ()
    auto: int = 0
    options: dict = field(default_factory=dict, hash=False)

    @property
    def is_resolved(self) -> bool:
        return not self.auto

    def option(self, key: str):
        return self.options.get(key, option_defaults(AttnRmOptions)[key])

    def __str__(self) -> str:
        where = f"auto={self.auto}" if self.auto else "blocks=" + "+".join(map(str, self.blocks))
        return f"{ATTNRM}:{where}{format_options(self.options)}"


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
        if index is not None:
            self.edge_original_index = int(index)   # read by edge.models.info.original_block_indices

    @classmethod
    def from_block(cls, block: nn.Module, scale: float = 1.0, index: int | None = None) -> MLPOnlyBlock:
        """The MLP half of a timm ``Block`` (its own modules, not copies)."""
        return cls(block.norm2, block.mlp, getattr(block, "ls2", None), getattr(block, "drop_path2", None),
                   scale=scale, index=index)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        # attn_mask / is_causal (timm's Block signature) have nothing to act on: no token is mixed here.
        scale = float(self.scale)
        if scale == 1.0:
            return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x * self.scale + self.drop_path2(self.ls2(self.mlp(self.norm_of_scaled(x, scale))))

    def norm_of_scaled(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """``norm2(scale * x)``, with the scale folded into a LayerNorm's epsilon (see the module notes)."""
        norm = self.norm2
        if isinstance(norm, nn.LayerNorm):
            return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps / (scale * scale))
        return norm(x * scale)

    def flops(self, tokens: int) -> int:
        return linear_flops(self, tokens)

    def extra_repr(self) -> str:
        return f"index={self.index}, scale={float(self.scale):g}"


class AffineAttention(nn.Module):
    """Stands at ``blocks[i].attn``: ``y = x W + b`` on every token, in place of the attention sub-layer."""

    def __init__(self, dim: int, bias: bool = True, index: int | None = None) -> None:
        super().__init__()
        self.map = nn.Linear(dim, dim, bias=bias)
        self.index = index

    @classmethod
    def from_fit(cls, fitted: FittedMap, index: int | None = None) -> AffineAttention:
        dim_in, dim_out = fitted.weight.shape
        if dim_in != dim_out:
            raise ValueError(f"an attention sub-layer maps the stream to itself; got a {dim_in}x{dim_out} map")
        module = cls(dim_in, bias=fitted.bias is not None, index=index)
        with torch.no_grad():
            module.map.weight.copy_(fitted.weight.T.float())
            if fitted.bias is not None:
                module.map.bias.copy_(fitted.bias.float())
        return module

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        return self.map(x)   # per token: a mask has nothing to act on

    def flops(self, tokens: int) -> int:
        return linear_flops(self, tokens)

    def record(self) -> dict:
        return {"bias": self.map.bias is not None}

    def extra_repr(self) -> str:
        return f"index={self.index}"
