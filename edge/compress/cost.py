"""Parameters and FLOPs of a (compressed) ViT, counted two ways that must agree.

``measured_flops`` runs one forward pass under ``torch.utils.flop_counter.FlopCounterMode``
(matrix products, convolutions and attention; element-wise work such as LayerNorm, GELU and
softmax is not counted). ``analytic_flops`` adds up the same operations from the geometry:
2 FLOPs per multiply-accumulate, attention-pooling heads (``global_pool='map'`` / ``'prr'``)
included. A module a compression method puts at a seam (``blocks[i]``, ``blocks[i].attn``,
``blocks[i].mlp``) counts its own: ``flops(tokens)`` for one image.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edge.models.attention import explicit_attention
from edge.models.info import model_info


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _frozen(model: nn.Module):
    """Parameters with ``requires_grad=False`` while inside, then as they were.

    The FLOP counter's module tracker hooks autograd on every module input that requires grad.
    Under ``no_grad`` a view of a parameter (the ``map`` head's latent query expanded over the
    batch) requires grad but has no gradient function, and the hook fails; with nothing that
    requires grad there is nothing to hook, whatever grad mode the caller is in.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p in trainable:
            p.requires_grad_(True)


@torch.no_grad()
def measured_flops(model: nn.Module, input_size: tuple[int, int, int], batch: int = 1) -> int:
    x = torch.zeros(batch, *input_size)
    model.eval()
    with _frozen(model), explicit_attention(model), FlopCounterMode(display=False) as counter:
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


def attention_pool_flops(pool: nn.Module, tokens: int) -> int:
    """FLOPs of timm's attention-pooling head over ``tokens`` tokens.

    ``AttentionPoolLatent`` (``map``): ``latent_len`` learned queries attend over the tokens, so
    only ``kv`` sees every token. ``AttentionPoolPrr`` (``prr``): parameter-free self-attention of
    the tokens (q = k = v).
    """
    if hasattr(pool, "latent"):
        queries = pool.latent_len
        inner = pool.kv.out_features // 2
        return (linear_flops(pool, queries) - linear_flops(pool.kv, queries) + linear_flops(pool.kv, tokens)
                + 2 * 2 * queries * tokens * inner)
    return linear_flops(pool, tokens) + 2 * 2 * tokens * tokens * pool.out_features


def analytic_flops(model: nn.Module, batch: int = 1) -> int:
    """FLOPs of matrix products and attention, from the module geometry (batch ``batch``)."""
    info = model_info(model)
    tokens = info.num_tokens
    patch = model.patch_embed.proj
    kh, kw = patch.kernel_size
    total = 2 * info.num_patches * patch.in_channels * kh * kw * patch.out_channels
    total += sum(block_flops(block, tokens) for block in model.blocks)
    pool = getattr(model, "attn_pool", None)
    if pool is not None:
        include_prefix = getattr(model, "pool_include_prefix", True)  # timm before the switch pooled every token
        total += attention_pool_flops(pool, tokens if include_prefix else info.num_patches)
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        total += 2 * head.in_features * head.out_features
    return total * batch
