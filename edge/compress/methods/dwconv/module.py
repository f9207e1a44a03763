"""Drop-in depthwise convolution (Scribano et al.): attention heads become a k x k conv over V.

:class:`DepthwiseAttention` takes the place of timm's ``blocks[i].attn``. It keeps the value
projection (the V slice of ``qkv``) and the output projection, lays the patch tokens out on
the model's patch grid (rows x cols, non-square grids too) and aggregates each channel over its
k x k neighbourhood (zero padding), instead of ``softmax(q k^T) v``:

* ``unensembled`` (Eq. 11): ``Conv_DW(X W^V_h, K^h)`` per replaced head, one filter per channel;
* ``ensembled``  (Eq. 12-13): the replaced heads share one head, ``V^e = X sum_h s_h W^V_h`` and
  ``W^Oe = sum_h s_h W^O_h`` with ``s = softmax(gamma)`` (gamma = 0 at the start: uniform), one
  depthwise conv of ``head_dim`` channels; the weights are stored folded;
* ``full``       (Eq. 9-10): one dense k x k convolution of X with ``K^h (x) W^V_h`` (one kernel
  per head, shared by its channels), for comparison; the V bias seen through the zero-padded
  kernel is a constant map, so it equals ``unensembled`` with per-head-shared kernels exactly.

Layout: V ``[B, rows*cols, C]`` is reshaped to ``[B, rows, cols, C]`` and permuted to NCHW for the
convolution, and back the same way (NCHW -> NHWC, then reshape). That 4-D NHWC<->NCHW pair is what
runtimes fold into the convolution's own layout change (ONNX Runtime turns it into
ReorderInput/ReorderOutput with ``channels_last``; TensorRT into the conv's reformat), so the
replaced block runs with no separate Transpose; a 3-D ``[B, N, C] -> [B, C, N]`` Transpose plus
Reshape would stay a copy of its own on each side.

Heads not listed in ``conv_heads`` keep their attention (scattered selection); the output
projection's input columns are permuted once, at build time, so that the kept heads come first.

Prefix tokens ([CLS], registers) have no place on the grid; ``prefix`` says what they get:

* ``mean``   every prefix token's output is the mean of V over the patch tokens
  (exported as ReduceMean -> MatMul beside the Slice/Concat pair);
* ``pool``   (default) every prefix token's output is a fixed weighted sum of V over all tokens,
  the weights being that prefix query's mean attention row over the calibration images (the
  input-invariant part of its attention; Mul -> ReduceSum beside the Slice/Concat pair);
* ``attend`` prefix queries keep full attention over all tokens with the head's own q and k
  (computed without layout Transposes: per-head sums are MatMuls with a 0/1 channel-to-head
  matrix); it keeps the k projection of every token, so it saves the least;
* ``drop``   the paper's choice: the model loses its prefix tokens and pools the mean of the
  patch tokens (done to the whole model by :func:`drop_prefix_tokens`; the module sees none).

Measured without fine-tuning on the reference model (fmnist-deit-tiny, least-squares kernels,
blocks by lowest Sigma_b, 2000 test images; benchmarks/dwconv_prefix.py), original 0.8825:

    blocks  attend  pool    mean    drop
    3/12    0.8195  0.7500  0.6035  0.4960
    6/12    0.7940  0.5900  0.4765  0.3445

After one epoch of distillation (shipped model at 0.9000, 6/12 lowest-Sigma_b blocks, lsq, lr 5e-4,
the full test split; benchmarks/dwconv_ablation.py): ``attend`` 0.8308 -> 0.8872, ``pool``
0.5043 -> 0.8784. ``attend`` is the more accurate; it keeps the k projection of every token and a
small Softmax per block (FLOPs -5.7 % at 6/12 against -9.9 %) and adds a second Slice.
``pool`` is the default: it costs what ``mean`` costs and exports within one Slice/Concat pair.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import nn

from edge.compress.options import format_options, option_defaults, plan_option
from edge.errors import EdgeError, InternalError

Variant = Literal["unensembled", "ensembled", "full"]
PrefixMode = Literal["mean", "pool", "attend", "drop"]
VARIANTS: tuple[str, ...] = get_args(Variant)
PREFIX_MODES: tuple[str, ...] = get_args(PrefixMode)
DWCONV = "dwconv"


@dataclass(frozen=True)
class DWConvOptions:
    """The options of a ``dwconv`` step (``dwconv:auto=6:init=lsq:k=3``)."""

    init: Literal["gaussian", "mean", "lsq"] = plan_option("lsq")   # initial kernels (kernels.py)
    k: int = plan_option(3, minimum=1)                               # kernel size, odd
    variant: Variant = plan_option("unensembled")
    prefix: PrefixMode = plan_option("pool")                         # what the [CLS]/register tokens get
    order: Literal["lowest", "highest"] = plan_option("lowest")      # auto: lowest Sigma first, or highest
    ridge: float = plan_option(1e-4, minimum=0)                      # relative ridge of init=lsq


@dataclass(frozen=True)
class DWConvStep:
    """Replace attention heads by a depthwise convolution over V (original block indices).

    Exactly one of: ``blocks`` (every head of these blocks), ``heads`` ((block, head) pairs),
    ``auto`` > 0 (chosen by the Sigma criterion; ``scattered`` picks heads, else blocks).
    """

    blocks: tuple[int, ...] = ()
    heads: tuple[tuple[int, int], ...] = ()
    auto: int = 0
    scattered: bool = False
    options: dict = field(default_factory=dict, hash=False)

    def option(self, key: str):
        """The option's value, or its default (defaults are resolved here only)."""
        return self.options.get(key, option_defaults(DWConvOptions)[key])

    @property
    def is_resolved(self) -> bool:
        return self.auto == 0

    @property
    def touched_blocks(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.blocks) | {b for b, _ in self.heads}))

    def __str__(self) -> str:
        if self.auto:
            where = f"heads=auto={self.auto}" if self.scattered else f"auto={self.auto}"
        elif self.heads:
            where = "heads=" + "+".join(f"{b}.{h}" for b, h in self.heads)
        else:
            where = "blocks=" + "+".join(map(str, self.blocks))
        return f"{DWCONV}:{where}{format_options(self.options)}"


def check_kernel_size(k: int, grid: tuple[int, int], where: str = "k") -> None:
    if k < 1 or k % 2 == 0:
        raise EdgeError(f"{where}={k}: the depthwise kernel size must be odd",
                        expected="an odd kernel size such as 3 or 5 (centred, zero padding k//2)",
                        fix="use k=3 (the paper's choice)")
    if k > min(grid):
        raise EdgeError(f"{where}={k} is larger than the patch grid {grid[0]}x{grid[1]}",
                        expected=f"k <= {min(grid)}", fix="use a smaller kernel, e.g. k=3")


def check_attention(attn: nn.Module, block: int) -> None:
    """Refuse attention modules this replacement cannot stand for (it reads qkv and proj)."""
    if not (hasattr(attn, "qkv") and hasattr(attn, "proj") and hasattr(attn, "num_heads")):
        raise EdgeError(f"blocks[{block}].attn is a {type(attn).__name__}",
                        expected="timm's Attention (qkv, proj, num_heads) at blocks[i].attn")
    if getattr(attn, "gate", None) is not None or not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
        raise EdgeError(f"blocks[{block}].attn uses a gated or normalised attention output",
                        expected="plain timm Attention (no gate, no scale_norm)",
                        fix="leave this block out of the dwconv step")


class DepthwiseAttention(nn.Module):
    """Stands at ``blocks[i].attn``; replaces the heads ``conv_heads`` by a k x k convolution over V."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, conv_heads: tuple[int, ...],
                 grid: tuple[int, int], num_prefix_tokens: int = 0, k: int = 3, variant: str = "unensembled",
                 prefix: str = "mean", qkv_bias: bool = True, proj_bias: bool = True) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise EdgeError(f"variant={variant}", expected=f"one of {', '.join(VARIANTS)}")
        if prefix not in PREFIX_MODES:
            raise EdgeError(f"prefix={prefix}", expected=f"one of {', '.join(PREFIX_MODES)}")
        if prefix == "attend" and variant != "unensembled":
            raise EdgeError(f"prefix=attend with variant={variant}",
                            expected="prefix=attend only with variant=unensembled (it needs each head's q and k)",
                            fix="use prefix=mean")
        check_kernel_size(k, grid)
        conv_heads = tuple(sorted(int(h) for h in conv_heads))
        if not conv_heads or len(set(conv_heads)) != len(conv_heads) or not 0 <= conv_heads[0] <= conv_heads[-1] \
                < num_heads:
            raise ValueError(f"conv_heads {conv_heads} for {num_heads} heads")
        self.dim, self.num_heads, self.head_dim = int(dim), int(num_heads), int(head_dim)
        self.conv_heads = conv_heads
        self.attn_heads = tuple(h for h in range(num_heads) if h not in conv_heads)
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_prefix_tokens = 0 if prefix == "drop" else int(num_prefix_tokens)
        self.k, self.variant, self.prefix = int(k), variant, prefix
        self.scale = head_dim ** -0.5
        conv_width = head_dim if variant == "ensembled" else len(conv_heads) * head_dim
        attn_width = len(self.attn_heads) * head_dim
        self.conv_width = conv_width
        # kept heads: their own q, k, v (scattered selection)
        self.qkv = nn.Linear(dim, 3 * attn_width, bias=qkv_bias) if self.attn_heads else None
        self.q_norm: nn.Module = nn.Identity()
        self.k_norm: nn.Module = nn.Identity()
        self.value = nn.Linear(dim, conv_width, bias=qkv_bias)
        if variant == "full":
            self.conv = nn.Conv2d(dim, conv_width, k, padding=k // 2, bias=False)
            self.register_buffer("bias_map", torch.zeros(1, conv_width, *self.grid))
        else:
            self.conv = nn.Conv2d(conv_width, conv_width, k, padding=k // 2, groups=conv_width, bias=True)
        self.prefix_q = self.prefix_k = None
        p = self.num_prefix_tokens
        if prefix == "attend" and p:
            self.prefix_q = nn.Linear(dim, conv_width, bias=qkv_bias)
            self.prefix_k = nn.Linear(dim, conv_width, bias=qkv_bias)
            heads = len(conv_heads)
            self.register_buffer("head_sum", torch.eye(heads).repeat_interleave(head_dim, 0))   # [C, heads]
        if prefix == "pool" and p:
            self.register_buffer("prefix_weights", torch.zeros(p, p + self.grid[0] * self.grid[1], conv_width))
        self.proj = nn.Linear(attn_width + conv_width, dim, bias=proj_bias)

    # ---- forward ----------------------------------------------------------------------------
    def _grid_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, rows*cols, C]`` -> ``[B, C, rows, cols]``: Reshape to NHWC, then one NHWC->NCHW Transpose."""
        rows, cols = self.grid
        if tokens.shape[1] != rows * cols:
            raise EdgeError(f"DepthwiseAttention got {tokens.shape[1]} patch tokens",
                            expected=f"{rows}x{cols} = {rows * cols} (the grid it was built for)",
                            fix="run the model at the input size it was compressed for")
        return tokens.reshape(-1, rows, cols, tokens.shape[2]).permute(0, 3, 1, 2)

    def _spatial(self, x_patch: torch.Tensor, v_patch: torch.Tensor | None) -> torch.Tensor:
        if self.variant == "full":
            out = self.conv(self._grid_tokens(x_patch)) + self.bias_map
        else:
            out = self.conv(self._grid_tokens(self.value(x_patch) if v_patch is None else v_patch))
        return out.permute(0, 2, 3, 1).flatten(1, 2)

    @property
    def _values_of_all_tokens(self) -> bool:
        return bool(self.num_prefix_tokens) and self.prefix in ("pool", "attend")

    def _per_head_norm(self, norm: nn.Module, t: torch.Tensor) -> torch.Tensor:
        if isinstance(norm, nn.Identity):
            return t
        return norm(t.reshape(*t.shape[:-1], -1, self.head_dim)).reshape(t.shape)

    def _prefix_out(self, x: torch.Tensor, x_patch: torch.Tensor, v_all: torch.Tensor | None) -> torch.Tensor:
        p = self.num_prefix_tokens
        if self.prefix == "pool":
            return (v_all[:, None] * self.prefix_weights).sum(2)                     # [B, P, C]
        if self.prefix_q is None:  # mean of V over the patch tokens (V is affine: V(mean x) = mean V(x))
            pooled = self.value(x_patch.mean(1, keepdim=True))
            return pooled if p == 1 else pooled.expand(-1, p, -1)
        q = self._per_head_norm(self.q_norm, self.prefix_q(x[:, :p]))                # [B, P, C]
        k = self._per_head_norm(self.k_norm, self.prefix_k(x))                       # [B, N, C]
        scores = ((q[:, :, None] * k[:, None]) @ self.head_sum) * self.scale          # [B, P, N, heads]
        weights = scores.softmax(dim=2) @ self.head_sum.T                            # [B, P, N, C]
        return (weights * v_all[:, None]).sum(2)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, len(self.attn_heads), self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q) * self.scale, self.k_norm(k)
        out = (q @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return out.transpose(1, 2).reshape(b, n, -1)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise EdgeError("DepthwiseAttention got an attention mask", expected="no mask (image tokens)")
        p = self.num_prefix_tokens
        v_all = self.value(x) if self._values_of_all_tokens else None
        x_patch = x[:, p:] if p and (v_all is None or self.variant == "full") else x
        v_patch = v_all[:, p:] if v_all is not None and self.variant != "full" else None
        out = self._spatial(x_patch, v_patch)
        if p:
            out = torch.cat([self._prefix_out(x, x_patch, v_all), out], dim=1)
        if self.qkv is not None:
            out = torch.cat([self._attention(x), out], dim=-1)
        return self.proj(out)

    # ---- cost -------------------------------------------------------------------------------
    def flops(self, tokens: int) -> int:
        """Matrix-product and convolution FLOPs of one image with ``tokens`` tokens (2 per MAC)."""
        p, dim, width = self.num_prefix_tokens, self.dim, self.conv_width
        patches = tokens - p
        k2 = self.k * self.k
        total = 2 * tokens * self.proj.in_features * self.proj.out_features
        all_values = self._values_of_all_tokens
        if self.variant == "full":
            total += 2 * patches * width * dim * k2 + (2 * tokens * dim * width if all_values else 0)
        else:
            total += 2 * (tokens if all_values else patches) * dim * width + 2 * patches * width * k2
        if p and self.prefix == "mean":
            total += 2 * dim * width
        elif p and self.prefix == "attend":
            heads = self.head_sum.shape[1]
            total += 2 * p * dim * width + 2 * tokens * dim * width                # q of the prefix, k of all
            total += 2 * 2 * p * tokens * width * heads                            # the two channel/head MatMuls
        if self.qkv is not None:
            total += 2 * tokens * self.qkv.in_features * self.qkv.out_features
            total += 2 * 2 * tokens * tokens * len(self.attn_heads) * self.head_dim
        return total

    def record(self) -> dict:
        """What :func:`from_record` needs to rebuild the module's shapes (weights come from the state dict)."""
        return {"dim": self.dim, "num_heads": self.num_heads, "head_dim": self.head_dim,
                "conv_heads": list(self.conv_heads), "grid": list(self.grid),
                "num_prefix_tokens": self.num_prefix_tokens, "k": self.k, "variant": self.variant,
                "prefix": self.prefix, "qkv_bias": self.value.bias is not None,
                "proj_bias": self.proj.bias is not None,
                "q_norm": type(self.q_norm).__name__, "k_norm": type(self.k_norm).__name__}

    def extra_repr(self) -> str:
        heads = "all heads" if not self.attn_heads else f"heads {list(self.conv_heads)}"
        return (f"{heads} of {self.num_heads} -> {self.k}x{self.k} {self.variant} conv on a "
                f"{self.grid[0]}x{self.grid[1]} grid, prefix={self.prefix}")


def from_record(record: dict, norms: tuple[nn.Module, nn.Module] | None = None) -> DepthwiseAttention:
    module = DepthwiseAttention(record["dim"], record["num_heads"], record["head_dim"], tuple(record["conv_heads"]),
                                tuple(record["grid"]), record["num_prefix_tokens"], record["k"], record["variant"],
                                record["prefix"], record["qkv_bias"], record["proj_bias"])
    if norms is not None:
        module.q_norm, module.k_norm = copy.deepcopy(norms[0]), copy.deepcopy(norms[1])
    return module


def head_channels(heads: tuple[int, ...], head_dim: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads]) if heads \
        else torch.zeros(0, dtype=torch.long)


def ensemble_weights(num_heads: int, gamma: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(gamma)`` over the replaced heads (Eq. 12); gamma = 0 gives uniform weights."""
    gamma = torch.zeros(num_heads, dtype=torch.float64) if gamma is None else gamma.to(torch.float64)
    return gamma.softmax(0)


def ensembled_projections(attn: nn.Module, conv_heads: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                                    torch.Tensor]:
    """``W^Ve`` ``[head_dim, dim]``, its bias, and ``W^Oe`` ``[dim, head_dim]`` of Eq. 12 (float64)."""
    hd, dim = attn.head_dim, attn.qkv.in_features
    s = ensemble_weights(len(conv_heads))
    inner = attn.qkv.out_features // 3
    wv = attn.qkv.weight.detach().double()[2 * inner:].reshape(attn.num_heads, hd, dim)[list(conv_heads)]
    wo = attn.proj.weight.detach().double().reshape(-1, attn.num_heads, hd)[:, list(conv_heads)]
    bias = attn.qkv.bias
    bv = None if bias is None else bias.detach().double()[2 * inner:].reshape(attn.num_heads, hd)[list(conv_heads)]
    return (torch.einsum("h,hcd->cd", s, wv), None if bv is None else torch.einsum("h,hc->c", s, bv),
            torch.einsum("h,ohc->oc", s, wo))


@torch.no_grad()
def depthwise_from_attention(attn: nn.Module, *, block: int, conv_heads: tuple[int, ...], grid: tuple[int, int],
                             num_prefix_tokens: int, k: int, variant: str, prefix: str,
                             kernels: torch.Tensor, bias: torch.Tensor | None = None,
                             prefix_weights: torch.Tensor | None = None) -> DepthwiseAttention:
    """Build the replacement of timm ``attn`` from its own weights and the given kernels.

    ``kernels``: ``[conv_width, k, k]`` per channel (unensembled: the replaced heads' V channels
    in head order; ensembled: ``head_dim`` channels) or ``[len(conv_heads), k, k]`` per head
    (full). ``bias`` (``[conv_width]``) is added after the convolution; None means zero.
    ``prefix_weights`` (``prefix=pool``): ``[P, N, conv_width]``, each prefix token's weights over
    all tokens' V.
    """
    check_attention(attn, block)
    dim, heads, hd = attn.qkv.in_features, int(attn.num_heads), int(attn.head_dim)
    inner = heads * hd
    module = DepthwiseAttention(dim, heads, hd, conv_heads, grid, num_prefix_tokens, k, variant, prefix,
                                qkv_bias=attn.qkv.bias is not None, proj_bias=attn.proj.bias is not None)
    module.q_norm, module.k_norm = copy.deepcopy(attn.q_norm), copy.deepcopy(attn.k_norm)
    conv_ch, attn_ch = head_channels(module.conv_heads, hd), head_channels(module.attn_heads, hd)
    w, b = attn.qkv.weight.detach(), attn.qkv.bias
    if module.qkv is not None:
        rows = torch.cat([attn_ch, attn_ch + inner, attn_ch + 2 * inner])
        module.qkv.weight.copy_(w[rows])
        if b is not None:
            module.qkv.bias.copy_(b.detach()[rows])
    if module.prefix_q is not None:
        module.prefix_q.weight.copy_(w[conv_ch])
        module.prefix_k.weight.copy_(w[conv_ch + inner])
        if b is not None:
            module.prefix_q.bias.copy_(b.detach()[conv_ch])
            module.prefix_k.bias.copy_(b.detach()[conv_ch + inner])
    wp = attn.proj.weight.detach()
    if variant == "ensembled":
        wve, bve, woe = ensembled_projections(attn, module.conv_heads)
        module.value.weight.copy_(wve)
        if bve is not None:
            module.value.bias.copy_(bve)
        module.proj.weight.copy_(torch.cat([wp[:, attn_ch].double(), woe], 1))
    else:
        module.value.weight.copy_(w[conv_ch + 2 * inner])
        if b is not None:
            module.value.bias.copy_(b.detach()[conv_ch + 2 * inner])
        module.proj.weight.copy_(torch.cat([wp[:, attn_ch], wp[:, conv_ch]], 1))
    if module.proj.bias is not None:
        module.proj.bias.copy_(attn.proj.bias.detach())
    bias = torch.zeros(module.conv_width, dtype=torch.float64) if bias is None else bias.detach().double()
    if getattr(module, "prefix_weights", None) is not None:
        if prefix_weights is None:
            raise InternalError("prefix=pool needs prefix_weights (the prefix queries' mean attention rows)")
        module.prefix_weights.copy_(prefix_weights)
    if variant == "full":
        _set_full_conv(module, kernels.double(), bias)
    else:
        module.conv.weight.copy_(kernels.reshape(module.conv_width, 1, k, k))
        module.conv.bias.copy_(bias)
    return module


def _set_full_conv(module: DepthwiseAttention, head_kernels: torch.Tensor, bias: torch.Tensor) -> None:
    """Eq. 10: ``W^Vh_{r,s} = K^h_{r,s} W^V_h``; the V bias through the zero-padded kernel is a constant map."""
    hd, k = module.head_dim, module.k
    per_channel = head_kernels.repeat_interleave(hd, 0)                       # [C, k, k]
    wv = module.value.weight.detach().double()                                # [C, dim]
    module.conv.weight.copy_(wv[:, :, None, None] * per_channel[:, None])     # [C, dim, k, k]
    bv = module.value.bias.detach().double() if module.value.bias is not None else torch.zeros_like(bias)
    ones = torch.ones(1, module.conv_width, *module.grid, dtype=torch.float64) * bv[None, :, None, None]
    smeared = nn.functional.conv2d(ones, per_channel[:, None], padding=k // 2, groups=module.conv_width)
    module.bias_map.copy_(smeared + bias[None, :, None, None])


def drop_prefix_tokens(model: nn.Module) -> nn.Module:
    """The paper's handling of [CLS]: the model loses its class/register tokens and mean-pools patches.

    In place: ``cls_token``/``reg_token`` become None, the position embedding loses its prefix
    rows and ``global_pool`` becomes ``avg``. The final ``norm`` (per token, before pooling) and
    the head are kept as they are; without fine-tuning the head sees mean-pooled patch tokens
    instead of the class token it was trained on.
    """
    p = int(model.num_prefix_tokens)
    if p == 0:
        return model
    if getattr(model, "pos_embed", None) is not None and not getattr(model, "no_embed_class", False):
        model.pos_embed = nn.Parameter(model.pos_embed.detach()[:, p:].clone())
    model.cls_token = None
    if getattr(model, "reg_token", None) is not None:
        model.reg_token = None
    model.num_reg_tokens = 0
    model.num_prefix_tokens = 0
    model.has_class_token = False
    model.global_pool = "avg"
    if hasattr(model, "attn_pool"):
        model.attn_pool = None
    return model
