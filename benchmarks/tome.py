"""Token merging (ToMe), the training-free peer of issue 20, written from the paper.

Bolya et al., "Token Merging: Your ViT But Faster", ICLR 2023. In every block, between the
attention and the MLP, ``r`` tokens are merged away by *bipartite soft matching*:

1. the tokens are split alternately into two sets A (even positions) and B (odd positions);
2. each token of A is joined to its most similar token of B, similarity being the cosine of
   the attention keys averaged over the heads (Sec. 3, "Token Similarity");
3. the ``r`` joins of highest similarity are kept and each kept A token is averaged into its B
   token, weighted by the number of patches each already stands for (its *size* ``s``);
4. the unmerged A tokens (in their original order) and the B tokens are concatenated.

The class token is never merged (its similarities are set to -inf) and stays first. Attention
is *proportional* (Eq. 1): ``softmax(q k^T / sqrt(d) + log s)``, so a token standing for ``s``
patches is attended to as if it were ``s`` tokens. With a fixed ``r`` per block every shape is
static: the graph exports to ONNX as ordinary TopK / Gather / MatMul nodes (the merge itself is
a one-hot matrix product, no scatter).

The blocks are swapped at timm's seam ``model.blocks`` for a :class:`ToMeBlocks` sequence that
carries the sizes from block to block; each :class:`ToMeBlock` reuses the original block's
modules (weights shared, nothing retrained). ``r = 0`` is the original model exactly.
"""

from __future__ import annotations

import torch
from torch import nn


def merge_plan(metric: torch.Tensor, r: int, protect_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bipartite soft matching on ``metric`` [B, N, C]: (kept A indices, merged A indices, their B targets)."""
    metric = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    a, b = metric[:, 0::2], metric[:, 1::2]
    scores = a @ b.transpose(1, 2)                                    # [B, Na, Nb]
    if protect_first:
        scores = torch.cat([torch.full_like(scores[:, :1], float("-inf")), scores[:, 1:]], dim=1)  # class token
    best, target = scores.max(dim=-1)                                 # [B, Na]
    order = best.argsort(dim=-1, descending=True)                     # A tokens, most similar first
    merged = order[:, :r]                                             # [B, r]
    kept = order[:, r:].sort(dim=-1).values                           # [B, Na - r], original order
    return kept, merged, target.gather(1, merged)


def merge_tokens(x: torch.Tensor, size: torch.Tensor, metric: torch.Tensor, r: int,
                 protect_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [B, N, C] and ``size`` [B, N, 1] after merging ``r`` tokens; size-weighted averages."""
    if r <= 0:
        return x, size
    kept, merged, target = merge_plan(metric, r, protect_first)
    weighted = torch.cat([x * size, size], dim=-1)                   # [B, N, C + 1]: merge both at once
    a, b = weighted[:, 0::2], weighted[:, 1::2]
    width = weighted.shape[-1]
    a_kept = a.gather(1, kept[..., None].expand(-1, -1, width))
    a_merged = a.gather(1, merged[..., None].expand(-1, -1, width))   # [B, r, C + 1]
    one_hot = (target[..., None] == torch.arange(b.shape[1], device=x.device)).to(x.dtype)  # [B, r, Nb]
    b = b + one_hot.transpose(1, 2) @ a_merged                        # sums into the B targets
    out = torch.cat([a_kept, b], dim=1)
    total = out[..., -1:]
    return out[..., :-1] / total, total


class ToMeBlock(nn.Module):
    """One timm ``Block`` with proportional attention and ``r`` tokens merged after its attention."""

    def __init__(self, block: nn.Module, r: int, protect_first: bool):
        super().__init__()
        attn = block.attn
        if getattr(attn, "gate", None) is not None or not isinstance(getattr(attn, "qkv", None), nn.Linear):
            raise ValueError("ToMe here needs timm's plain Attention (one qkv Linear, no gate)")
        self.block, self.r, self.protect_first = block, r, protect_first

    def attention(self, x: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.block.attn
        batch, tokens, _ = x.shape
        qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        logits = (q * attn.scale) @ k.transpose(-2, -1) + size.log().transpose(1, 2)[:, None]  # Eq. 1
        out = (logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, tokens, attn.attn_dim)
        return attn.proj(attn.norm(out)), k.mean(dim=1)

    def forward(self, x: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        block = self.block
        mixed, keys = self.attention(block.norm1(x), size)
        x = x + block.drop_path1(block.ls1(mixed))
        x, size = merge_tokens(x, size, keys, self.r, self.protect_first)
        x = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
        return x, size


class ToMeBlocks(nn.Sequential):
    """``model.blocks`` for ToMe: runs the blocks in order, carrying every token's size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        size = torch.ones_like(x[..., :1])
        for block in self:
            x, size = block(x, size)
        return x


def token_counts(tokens: int, blocks: int, r: int, prefix: int = 1) -> list[int]:
    """Tokens entering each block and leaving the last, for ``r`` merges per block (or ValueError)."""
    counts = [tokens]
    for i in range(blocks):
        n = counts[-1]
        limit = (n + 1) // 2 - (1 if prefix else 0)                  # mergeable A tokens
        if r > limit:
            raise ValueError(f"r={r} merges more tokens than block {i} has to merge ({limit} of {n})")
        counts.append(n - r)
    return counts


def apply_tome(model: nn.Module, r: int) -> nn.Module:
    """Put ToMe into a timm VisionTransformer in place (``r`` merges in every block); returns it."""
    prefix = int(getattr(model, "num_prefix_tokens", 1))
    if prefix > 1:
        raise ValueError("ToMe here protects one class token; this model has register tokens")
    if getattr(model, "global_pool", "token") != "token" and prefix:
        raise ValueError("ToMe here needs a class-token head (global_pool='token')")
    tokens = model.patch_embed.num_patches + prefix
    token_counts(tokens, len(model.blocks), r, prefix)
    model.blocks = ToMeBlocks(*[ToMeBlock(b, r, protect_first=bool(prefix)) for b in model.blocks])
    return model
