"""Each part as a small torch module of the real token count and width, built from its key alone.

The modules compute what the model's own modules compute, with the same operations in the same
order (random weights: latency does not depend on them), so one part's exported graph has the
nodes that part has inside the whole model's graph:

* ``attention``: LayerNorm -> qkv Linear -> (timm's reshape/permute when q, k and v are equally
  wide; a split when they are not, as a width-compressed attention does) -> scaled ``q k^T`` ->
  Softmax -> ``@ v`` -> proj -> LayerScale -> residual Add;
* ``dwconv``: the depthwise mixer of the drop-in convolution (V of the patch tokens laid out on the
  patch grid NHWC -> NCHW, a k x k depthwise or dense Conv, back to tokens; the prefix tokens by
  mean, pool or attend; the kept heads' attention beside it; one proj);
* ``mlp``: LayerNorm -> fc1 -> GELU -> fc2 -> LayerScale -> residual Add (``scaled``: the residual
  doubled, the LayerNorm's epsilon folded as the MLP-only block does);
* ``attn_map``, ``span``: one Linear (a span with ``prefix_map``: two, on the prefix and patch tokens);
* ``embed``, ``head``: timm's patch embedding and head as ``VisionTransformer`` runs them;
* ``overhead``: the identity.

A test checks the structure against the real modules: the parts of a compressed model have the
model's FLOPs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edge.latency.parts import Part


class _Scale(nn.Module):
    """LayerScale: a per-channel multiply (present or not)."""

    def __init__(self, dim: int, present: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 0.5)) if present else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.gamma is None else x * self.gamma


class AttentionPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        dim = part.dim
        self.heads, self.qk, self.v = part.size("heads"), part.size("qk"), part.size("v")
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, self.heads * (2 * self.qk + self.v), bias=bool(part.size("qkv_bias")))
        self.proj = nn.Linear(self.heads * self.v, dim, bias=bool(part.size("proj_bias")))
        self.scale = self.qk ** -0.5
        self.ls = _Scale(dim, part.size("ls"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        h = self.heads
        y = self.qkv(self.norm(x))
        if self.qk == self.v:
            q, k, v = y.reshape(b, n, 3, h, self.qk).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = y.split([h * self.qk, h * self.qk, h * self.v], dim=-1)
            q = q.reshape(b, n, h, self.qk).transpose(1, 2)
            k = k.reshape(b, n, h, self.qk).transpose(1, 2)
            v = v.reshape(b, n, h, self.v).transpose(1, 2)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, h * self.v)
        return x + self.ls(self.proj(out))


class DepthwiseMixerPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        dim = part.dim
        self.width, self.k, self.dense = part.size("width"), part.size("k"), bool(part.size("dense"))
        self.kept, self.head_dim = part.size("kept"), part.size("head_dim")
        self.prefix, self.p = str(part.get("prefix")), part.size("prefix_tokens")
        self.grid = (part.size("rows"), part.size("cols"))
        bias = bool(part.size("qkv_bias"))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * self.kept * self.head_dim, bias=bias) if self.kept else None
        self.value = nn.Linear(dim, self.width, bias=bias)
        if self.dense:
            self.conv = nn.Conv2d(dim, self.width, self.k, padding=self.k // 2, bias=False)
            self.bias_map = nn.Parameter(torch.zeros(1, self.width, *self.grid))
        else:
            self.conv = nn.Conv2d(self.width, self.width, self.k, padding=self.k // 2, groups=self.width)
        self.prefix_q = self.prefix_k = None
        if self.prefix == "attend":
            self.prefix_q = nn.Linear(dim, self.width, bias=bias)
            self.prefix_k = nn.Linear(dim, self.width, bias=bias)
            heads = max(1, self.width // max(1, self.head_dim))
            self.head_sum = nn.Parameter(torch.eye(heads).repeat_interleave(self.width // heads, 0))
        if self.prefix == "pool":
            self.prefix_weights = nn.Parameter(torch.rand(self.p, self.p + self.grid[0] * self.grid[1], self.width))
        self.proj = nn.Linear(self.kept * self.head_dim + self.width, dim)
        self.ls = _Scale(dim, part.size("ls"))

    def _grid(self, tokens: torch.Tensor) -> torch.Tensor:
        rows, cols = self.grid
        return tokens.reshape(-1, rows, cols, tokens.shape[2]).permute(0, 3, 1, 2)

    def _spatial(self, x_patch: torch.Tensor, v_patch: torch.Tensor | None) -> torch.Tensor:
        if self.dense:
            out = self.conv(self._grid(x_patch)) + self.bias_map
        else:
            out = self.conv(self._grid(self.value(x_patch) if v_patch is None else v_patch))
        return out.permute(0, 2, 3, 1).flatten(1, 2)

    def _prefix_out(self, y: torch.Tensor, y_patch: torch.Tensor, v_all: torch.Tensor | None) -> torch.Tensor:
        if self.prefix == "pool":
            assert v_all is not None
            return (v_all[:, None] * self.prefix_weights).sum(2)
        if self.prefix_q is None:   # mean
            pooled = self.value(y_patch.mean(1, keepdim=True))
            return pooled if self.p == 1 else pooled.expand(-1, self.p, -1)
        assert self.prefix_k is not None and v_all is not None
        q, k = self.prefix_q(y[:, :self.p]), self.prefix_k(y)
        scores = ((q[:, :, None] * k[:, None]) @ self.head_sum) * self.head_dim ** -0.5
        return ((scores.softmax(dim=2) @ self.head_sum.T) * v_all[:, None]).sum(2)

    def _attention(self, y: torch.Tensor) -> torch.Tensor:
        assert self.qkv is not None
        b, n, _ = y.shape
        q, k, v = self.qkv(y).reshape(b, n, 3, self.kept, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = ((q * self.head_dim ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return out.transpose(1, 2).reshape(b, n, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        p = self.p
        all_values = bool(p) and self.prefix in ("pool", "attend")
        v_all = self.value(y) if all_values else None
        y_patch = y[:, p:] if p and (v_all is None or self.dense) else y
        v_patch = v_all[:, p:] if v_all is not None and not self.dense else None
        out = self._spatial(y_patch, v_patch)
        if p:
            out = torch.cat([self._prefix_out(y, y_patch, v_all), out], dim=1)
        if self.qkv is not None:
            out = torch.cat([self._attention(y), out], dim=-1)
        return x + self.ls(self.proj(out))


class AttentionMapPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(part.dim, eps=1e-6)
        self.map = nn.Linear(part.dim, part.dim, bias=bool(part.size("bias")))
        self.ls = _Scale(part.dim, part.size("ls"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ls(self.map(self.norm(x)))


class MlpPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        dim, hidden, bias = part.dim, part.size("hidden"), bool(part.size("bias"))
        self.scaled = bool(part.size("scaled"))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, dim, bias=bias)
        self.ls = _Scale(dim, part.size("ls"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scaled:   # x = 2x; x = x + MLP(LN(x)), the factor folded into the LayerNorm's epsilon
            y = F.layer_norm(x, self.norm.normalized_shape, self.norm.weight, self.norm.bias, self.norm.eps / 4)
            return x * 2.0 + self.ls(self.fc2(self.act(self.fc1(y))))
        return x + self.ls(self.fc2(self.act(self.fc1(self.norm(x)))))


class SpanPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        bias = bool(part.size("bias"))
        self.p = part.size("prefix_map")
        self.map = nn.Linear(part.dim, part.dim, bias=bias)
        self.prefix_map = nn.Linear(part.dim, part.dim, bias=bias) if self.p else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prefix_map is None:
            return self.map(x)
        return torch.cat([self.prefix_map(x[:, :self.p]), self.map(x[:, self.p:])], dim=1)


class EmbedPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        dim = part.dim
        patch = (part.size("patch_h"), part.size("patch_w"))
        self.proj = nn.Conv2d(part.size("in_chans"), dim, patch, stride=patch)
        self.p = part.size("prefix")
        self.pos = str(part.get("pos"))
        self.prefix = nn.Parameter(torch.randn(1, self.p, dim) * 0.02) if self.p else None
        rows, cols = part.size("height") // patch[0], part.size("width") // patch[1]
        positions = rows * cols + (self.p if self.pos == "all" else 0)
        self.pos_embed = nn.Parameter(torch.randn(1, positions, dim) * 0.02) if self.pos != "none" else None
        self.norm_pre = nn.LayerNorm(dim, eps=1e-6) if part.size("norm_pre") else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).flatten(2).transpose(1, 2)
        if self.pos_embed is not None and self.pos == "patches":
            x = x + self.pos_embed
        if self.prefix is not None:
            x = torch.cat([self.prefix.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None and self.pos == "all":
            x = x + self.pos_embed
        return self.norm_pre(x)


class HeadPart(nn.Module):
    def __init__(self, part: Part) -> None:
        super().__init__()
        dim = part.dim
        self.pool, self.p = str(part.get("pool")), part.size("prefix")
        self.norm = nn.LayerNorm(dim, eps=1e-6) if part.size("norm") else nn.Identity()
        self.fc_norm = nn.LayerNorm(dim, eps=1e-6) if part.size("fc_norm") else nn.Identity()
        classes = part.size("classes")
        self.head = nn.Linear(dim, classes) if classes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        x = x[:, self.p:].mean(dim=1) if self.pool == "avg" else x[:, 0]
        return self.head(self.fc_norm(x))


class OverheadPart(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


BUILDERS: dict[str, type[nn.Module]] = {
    "attention": AttentionPart, "dwconv": DepthwiseMixerPart, "attn_map": AttentionMapPart, "mlp": MlpPart,
    "span": SpanPart, "embed": EmbedPart, "head": HeadPart,
}


def part_module(part: Part, seed: int = 0) -> nn.Module:
    """The part as a module in eval mode, with seeded random weights."""
    torch.manual_seed(seed)
    module = OverheadPart() if part.kind == "overhead" else BUILDERS[part.kind](part)
    return module.eval()


def input_shape(part: Part) -> tuple[int, ...]:
    """The shape of one sample's input (without the batch): an image for ``embed``, else the token stream."""
    if part.kind == "embed":
        return (part.size("in_chans"), part.size("height"), part.size("width"))
    return (part.tokens, part.dim)
