"""Parameters and FLOPs of a (compressed) ViT, counted two ways that must agree.

``measured_flops`` runs one forward pass under ``torch.utils.flop_counter.FlopCounterMode``
(matrix products, convolutions and attention; element-wise work such as LayerNorm, GELU and
softmax is not counted). ``analytic_flops`` adds up the same operations from the geometry:
2 FLOPs per multiply-accumulate. A module a compression method puts at a seam (``blocks[i]``,
``blocks[i].attn``, ``blocks[i].mlp``) counts its own: ``flops(tokens)`` for one image.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edge.models.attention import explicit_attention
from edge.models.info import model_info


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def measured_flops(model: nn.Module, input_size: tuple[int, int, int], batch: int = 1) -> int:
    x = torch.zeros(batch, *input_size)
    model.eval()
    with explicit_attention(model), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


def linear_flops(module: nn.Module, tokens: int) -> int:
    """FLOPs of every ``nn.Linear`` inside ``module`` applied to ``tokens`` tokens."""
    return sum(2 * tokens * m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def _counts_itself(module) -> bool:
    return callable(getattr(module, "flops", None))


def block_flops(block: nn.Module, tokens: int) -> int:
    """FLOPs of one entry of ``model.blocks``: a timm block, a block with replaced parts, or a replacement."""
    if _counts_itself(block):
        return block.flops(tokens)
    total = linear_flops(block, tokens)
    for seam in ("attn", "mlp"):
        part = getattr(block, seam, None)
        if _counts_itself(part):  # e.g. its projections see different token counts
            total += part.flops(tokens) - linear_flops(part, tokens)
    attn = getattr(block, "attn", None)
    if attn is not None and hasattr(attn, "num_heads") and not _counts_itself(attn):
        inner = attn.qkv.out_features // 3
        total += 2 * 2 * tokens * tokens * inner  # q k^T and attn v
    return total


def analytic_flops(model: nn.Module, batch: int = 1) -> int:
    """FLOPs of matrix products and attention, from the module geometry (batch ``batch``)."""
    info = model_info(model)
    tokens = info.num_tokens
    patch = model.patch_embed.proj
    kh, kw = patch.kernel_size
    total = 2 * info.num_patches * patch.in_channels * kh * kw * patch.out_channels
    total += sum(block_flops(block, tokens) for block in model.blocks)
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        total += 2 * head.in_features * head.out_features
    return total * batch
