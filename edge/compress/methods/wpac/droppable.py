"""Width-compressed attention and MLP that compute with the leading dims only: the masks of PIAD.

:class:`DroppableAttention` stands at ``blocks[i].attn`` in place of a
:class:`~edge.compress.methods.wpac.module.NarrowAttention` and :class:`DroppableMlp` at ``blocks[i].mlp`` in
place of timm's ``Mlp``, sharing their ``Linear`` layers (same parameters, same state-dict keys:
nothing changes shape). Each has the widths of a sub-network (``qk``, ``v`` per head; ``hidden``)
and computes with the leading rows/columns of its weights only. That is exactly the full module
with the tail dims masked to zero (a zero Q/K dim adds nothing to ``q . k``, a zero V dim and its
``proj`` column add nothing to the output, a zero hidden unit's fc2 column adds nothing), done
without the wasted products; gradients reach only the kept slices.

The widths apply while training (the PIAD step sets them per step); in ``eval()`` the modules
compute with every dim, so held-out evaluations score the whole super-network, unless ``pinned``
(the importance measurement holds a sub-network in eval mode). ``skip`` makes a module output
zeros (the block keeps only its residual: module sensitivity), and ``probe``, when a list, collects
the activations whose Taylor importance is measured (Q, K, V per head, the MLP's hidden units).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edge.compress.methods.wpac.module import NarrowAttention
from edge.compress.methods.wpac.supernet import Part, block_parts
from edge.models.info import model_info, original_block_indices


class DroppableAttention(nn.Module):
    """A NarrowAttention whose Q/K and V head dims can be cut at their tails (its ``qkv`` and ``proj`` shared)."""

    def __init__(self, attn: NarrowAttention) -> None:
        super().__init__()
        self.num_heads, self.qk_dim, self.v_dim = attn.num_heads, attn.qk_dim, attn.v_dim
        self.scale, self.index = attn.scale, attn.index
        self.qkv, self.proj = attn.qkv, attn.proj
        self.qk, self.v = self.qk_dim, self.v_dim
        self.pinned = False
        self.skip = False
        self.probe: list[torch.Tensor] | None = None

    def active(self) -> tuple[int, int]:
        return (self.qk, self.v) if self.training or self.pinned else (self.qk_dim, self.v_dim)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if self.skip:
            return torch.zeros_like(x)
        B, N, C = x.shape
        H, dq, dv = self.num_heads, self.qk_dim, self.v_dim
        qk, v = self.active()
        w = self.qkv.weight
        rows = [w[:H * dq].view(H, dq, C)[:, :qk], w[H * dq:2 * H * dq].view(H, dq, C)[:, :qk],
                w[2 * H * dq:].view(H, dv, C)[:, :v]]
        bias = None
        if self.qkv.bias is not None:
            b = self.qkv.bias
            bias = torch.cat([b[:H * dq].view(H, dq)[:, :qk].reshape(-1), b[H * dq:2 * H * dq].view(H, dq)[:, :qk]
                              .reshape(-1), b[2 * H * dq:].view(H, dv)[:, :v].reshape(-1)])
        out = F.linear(x, torch.cat([r.reshape(-1, C) for r in rows]), bias)
        q, k, value = out.split([H * qk, H * qk, H * v], dim=-1)
        q, k = q.reshape(B, N, H, qk), k.reshape(B, N, H, qk)
        value = value.reshape(B, N, H, v)
        if self.probe is not None:
            self.probe += [q, k, value]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), value.transpose(1, 2),
                                           attn_mask=attn_mask, is_causal=is_causal, scale=self.scale)
        proj = self.proj.weight.view(-1, H, dv)[:, :, :v].reshape(-1, H * v)
        return F.linear(y.transpose(1, 2).reshape(B, N, H * v), proj, self.proj.bias)

    def flops(self, tokens: int) -> int:
        """The whole module's (the super-network's) FLOPs, as NarrowAttention counts them."""
        from edge.compress.cost import linear_flops

        return linear_flops(self, tokens) + 2 * tokens * tokens * self.num_heads * (self.qk_dim + self.v_dim)

    def extra_repr(self) -> str:
        return f"index={self.index}, heads={self.num_heads}, qk={self.qk}/{self.qk_dim}, v={self.v}/{self.v_dim}"


class DroppableMlp(nn.Module):
    """timm's ``Mlp`` (fc1 -> act -> fc2, its layers shared) whose hidden units can be cut at the tail."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.drop1, self.norm = mlp.fc1, mlp.act, mlp.drop1, mlp.norm
        self.fc2, self.drop2 = mlp.fc2, mlp.drop2
        self.width = mlp.fc1.out_features
        self.hidden = self.width
        self.pinned = False
        self.skip = False
        self.probe: list[torch.Tensor] | None = None

    def active(self) -> int:
        return self.hidden if self.training or self.pinned else self.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.skip:
            return torch.zeros(*x.shape[:-1], self.fc2.out_features, dtype=x.dtype, device=x.device)
        h = self.active()
        bias = None if self.fc1.bias is None else self.fc1.bias[:h]
        hidden = self.norm(self.drop1(self.act(F.linear(x, self.fc1.weight[:h], bias))))
        if self.probe is not None:
            self.probe.append(hidden)
        return self.drop2(F.linear(hidden, self.fc2.weight[:, :h], self.fc2.bias))

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}/{self.width}"


__all__ = ["DroppableAttention", "DroppableMlp"]


class Droppables:
    """The droppable modules put into a model's wpac blocks, by part name (``"3.qk"``), and the way back.

    ``Droppables.put(model, align, mlp_align)`` replaces every NarrowAttention (and its block's MLP)
    by droppable ones sharing their layers; :meth:`restore` puts the originals back (same layers,
    so whatever was trained stays). ``parts`` are the :class:`~edge.compress.methods.wpac.supernet.Part` of each.
    """

    def __init__(self, model: nn.Module, originals: dict[int, tuple[int, nn.Module, nn.Module]],
                 align: int, mlp_align: int) -> None:
        self.model = model
        self.originals = originals             # original block -> (position, NarrowAttention, Mlp)
        tokens = model_info(model).num_tokens
        self.attention: dict[int, DroppableAttention] = {}
        self.mlp: dict[int, DroppableMlp] = {}
        self.parts: dict[str, Part] = {}
        for block, (position, attn, mlp) in originals.items():
            self.attention[block] = model.blocks[position].attn = DroppableAttention(attn)
            self.mlp[block] = model.blocks[position].mlp = DroppableMlp(mlp)
            self.parts.update({p.name: p for p in block_parts(block, attn, mlp, tokens, align, mlp_align)})

    @classmethod
    def put(cls, model: nn.Module, align: int, mlp_align: int) -> Droppables:
        found = {}
        for position, entry in enumerate(original_block_indices(model.blocks)):
            if len(entry) != 1:
                continue
            block = entry[0]
            attn = getattr(model.blocks[position], "attn", None)
            if isinstance(attn, NarrowAttention):
                found[block] = (position, attn, model.blocks[position].mlp)
        return cls(model, found, align, mlp_align)

    def restore(self) -> None:
        for position, attn, mlp in self.originals.values():
            self.model.blocks[position].attn = attn
            self.model.blocks[position].mlp = mlp

    def modules(self) -> list[DroppableAttention | DroppableMlp]:
        return [*self.attention.values(), *self.mlp.values()]

    def set_widths(self, widths: dict[str, int], pinned: bool = False) -> None:
        """The sub-network ``widths`` (every part named); ``pinned`` also in eval mode."""
        for block, attn in self.attention.items():
            attn.qk, attn.v, attn.pinned = widths[f"{block}.qk"], widths[f"{block}.v"], pinned
        for block, mlp in self.mlp.items():
            mlp.hidden, mlp.pinned = widths[f"{block}.mlp"], pinned

    def whole(self) -> dict[str, int]:
        return {name: part.width for name, part in self.parts.items()}
