"""A (compressed) ViT as a sum of parts, each named by a small serialisable key.

A model's latency is predicted as the sum of its parts' latencies (:mod:`edge.latency.predict`),
so a part is the unit a latency table is measured in. The parts, in the order the model runs them:

==============  =====================================================================================
kind            what it computes (``x``: the token stream ``[B, tokens, dim]``)
==============  =====================================================================================
``embed``       patch embedding (one strided Conv), prefix tokens ([CLS], registers), position
                embedding, ``norm_pre``: image -> tokens
``attention``   ``x + ls1(attn(norm1(x)))`` with ``heads`` heads of ``qk`` query/key and ``v`` value
                dims each (narrower than the original after width compression)
``dwconv``      the same sub-layer with heads replaced by a k x k convolution over V (the depthwise
                mixer of the drop-in-convolution method): ``kept`` heads keep attention, ``width``
                channels go through the convolution, prefix tokens handled by ``prefix``
``attn_map``    the same sub-layer as one affine map of ``norm1(x)`` (attention removal, affine init)
``mlp``         ``x + ls2(mlp(norm2(x)))`` with ``hidden`` units; ``scaled=1``: ``2 x`` on the
                residual (an MLP-only block after dilution: ``x = 2x; x = x + MLP(LN(x))``)
``span``        one linear map replacing a span of blocks (block approximation); ``prefix_map``:
                the prefix tokens have their own map
``head``        final norm, pooling, ``fc_norm`` and the classifier: tokens -> logits
``overhead``    an identity graph on ``[B, tokens, dim]``: the fixed cost of one inference call
==============  =====================================================================================

A transformer block is an attention-like sub-layer part plus an ``mlp`` part; a block without
attention (MLP-only) is an ``mlp`` part alone; a removed span of blocks is one ``span`` part, or
nothing when the map is the identity. Sub-layers rather than whole blocks: a plan mixes the
attention and MLP widths of a block freely, and a table of sub-layers grows with the sum of the
choices, not their product.

:func:`model_parts` reads the parts from the modules themselves (their types and the shapes of
their Linear/Conv layers), not from a compression method's classes, so it lists any module that
has the shape of one of these: a timm ``Block``, a width-compressed attention (``qkv`` of
``heads x (2 qk + v)`` outputs and a ``proj`` of ``heads x v`` inputs), a depthwise mixer (a
``value`` Linear and a ``conv``), an MLP-only block (``norm2`` and ``mlp``, no ``attn``), a span
map (``replaced`` and ``map``). Anything else is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from edge.errors import EdgeError

KINDS = ("embed", "attention", "dwconv", "attn_map", "mlp", "span", "head", "overhead")
Value = int | str


@dataclass(frozen=True, order=True)
class Part:
    """One part: its ``kind``, the stream's ``dim`` and ``tokens``, and the kind's own sizes (``params``).

    ``params`` is a sorted tuple of (name, value) pairs, so two equal parts are equal keys
    whatever order they were made in. The batch is not part of a part: a table holds one batch.
    """

    kind: str
    dim: int
    tokens: int
    params: tuple[tuple[str, Value], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise EdgeError(f"part kind {self.kind!r}", expected=f"one of {', '.join(KINDS)}")
        if self.dim < 1 or self.tokens < 1:
            raise EdgeError(f"part {self.kind} with dim {self.dim}, tokens {self.tokens}",
                            expected="a positive dim and token count")

    @classmethod
    def make(cls, kind: str, dim: int, tokens: int, **params: Value) -> Part:
        return cls(kind, int(dim), int(tokens), tuple(sorted((k, _value(v)) for k, v in params.items())))

    def get(self, name: str, default: Value | None = None) -> Value:
        for key, value in self.params:
            if key == name:
                return value
        if default is None:
            raise KeyError(f"part {self.key} has no {name!r}")
        return default

    def size(self, name: str, default: int = 0) -> int:
        value = self.get(name, default)
        if not isinstance(value, int):
            raise KeyError(f"part {self.key}: {name!r} is {value!r}, not an integer")
        return value

    @property
    def key(self) -> str:
        """``kind:dim=D,tokens=T,name=value,...``: the part's name in tables."""
        fields = [("dim", self.dim), ("tokens", self.tokens), *self.params]
        return f"{self.kind}:" + ",".join(f"{k}={v}" for k, v in fields)

    def to_json(self) -> dict:
        return {"kind": self.kind, "dim": self.dim, "tokens": self.tokens, **dict(self.params)}

    @classmethod
    def from_json(cls, record: dict) -> Part:
        try:
            rest = {k: v for k, v in record.items() if k not in ("kind", "dim", "tokens")}
            return cls.make(record["kind"], record["dim"], record["tokens"], **rest)
        except (KeyError, TypeError, ValueError) as e:
            raise EdgeError(f"part record {record!r} is not a part", expected="kind, dim, tokens and the kind's sizes",
                            found=f"{type(e).__name__}: {e}") from e

    def __str__(self) -> str:
        return self.key


def _value(value) -> Value:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"a part's size is an integer or a name, got {value!r}")


# ---- reading the parts of a model -------------------------------------------------------------

def _refuse(where: str, module: nn.Module, what: str) -> EdgeError:
    return EdgeError(f"{where} is a {type(module).__name__}, which has no latency part: {what}",
                     expected="a timm Block, a width-compressed attention, a depthwise mixer, an MLP-only block "
                              "or a span map (edge.latency.parts)",
                     fix="time the whole model instead (edge profile), or add this module's part to "
                         "edge.latency.parts")


def _linear(module: nn.Module | None, where: str) -> nn.Linear:
    if not isinstance(module, nn.Linear):
        raise EdgeError(f"{where} is a {type(module).__name__}", expected="an nn.Linear")
    return module


def _flag(module: nn.Module | None) -> int:
    """1 where a LayerScale-like module (anything but Identity/None) stands, else 0."""
    return int(module is not None and not isinstance(module, nn.Identity))


def _check_norm(norm: nn.Module | None, where: str) -> None:
    if not isinstance(norm, nn.LayerNorm):
        raise EdgeError(f"{where} is a {type(norm).__name__}", expected="an nn.LayerNorm (the parts time LayerNorm)",
                        fix="time the whole model instead (edge profile)")


def _check_gelu(mlp: nn.Module, where: str) -> None:
    act = getattr(mlp, "act", None)
    if not isinstance(act, nn.GELU) or not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
        raise _refuse(where, mlp, "an MLP other than Linear -> GELU -> Linear")


def attention_part(attn: nn.Module, norm: nn.Module, ls: nn.Module | None, dim: int, tokens: int,
                   where: str) -> Part:
    """The attention-like sub-layer at ``blocks[i].attn``, told apart by the layers it holds."""
    _check_norm(norm, f"{where}.norm1")
    if isinstance(getattr(attn, "conv", None), nn.Conv2d) and isinstance(getattr(attn, "value", None), nn.Linear):
        return _dwconv_part(attn, ls, dim, tokens, where)
    if isinstance(getattr(attn, "qkv", None), nn.Linear) and isinstance(getattr(attn, "proj", None), nn.Linear):
        heads = int(getattr(attn, "num_heads", 0))
        qkv, proj = attn.qkv, attn.proj
        if heads < 1 or proj.in_features % heads or (qkv.out_features - proj.in_features) % (2 * heads):
            raise _refuse(where, attn, f"qkv {qkv.out_features} and proj {proj.in_features} wide for {heads} heads")
        for name in ("q_norm", "k_norm", "norm"):
            if not isinstance(getattr(attn, name, nn.Identity()), nn.Identity):
                raise _refuse(where, attn, f"attention with a {name}")
        if getattr(attn, "gate", None) is not None:
            raise _refuse(where, attn, "gated attention")
        v = proj.in_features // heads
        qk = (qkv.out_features - proj.in_features) // (2 * heads)
        return Part.make("attention", dim, tokens, heads=heads, qk=qk, v=v, qkv_bias=qkv.bias is not None,
                         proj_bias=proj.bias is not None, ls=_flag(ls))
    if isinstance(getattr(attn, "map", None), nn.Linear) and not hasattr(attn, "qkv"):
        return Part.make("attn_map", dim, tokens, bias=attn.map.bias is not None, ls=_flag(ls))
    raise _refuse(where, attn, "an attention sub-layer of unknown shape")


def _dwconv_part(attn: nn.Module, ls: nn.Module | None, dim: int, tokens: int, where: str) -> Part:
    conv: nn.Conv2d = attn.conv
    value = _linear(attn.value, f"{where}.value")
    width = value.out_features
    dense = int(conv.groups == 1 and conv.in_channels == dim)
    if not dense and conv.groups != width:
        raise _refuse(where, attn, f"a convolution of {conv.groups} groups over {width} channels")
    head_dim = int(getattr(attn, "head_dim", 0))
    qkv = getattr(attn, "qkv", None)
    kept = 0 if qkv is None else _linear(qkv, f"{where}.qkv").out_features // (3 * head_dim)
    prefix = str(getattr(attn, "prefix", "mean"))
    prefix_tokens = int(getattr(attn, "num_prefix_tokens", 0))
    rows, cols = (int(g) for g in attn.grid)
    if rows * cols + prefix_tokens != tokens:
        raise _refuse(where, attn, f"a {rows}x{cols} grid with {prefix_tokens} prefix tokens in a stream of "
                                   f"{tokens} tokens")
    return Part.make("dwconv", dim, tokens, width=width, k=int(conv.kernel_size[0]), dense=dense,
                     kept=kept, head_dim=head_dim, prefix=prefix if prefix_tokens else "none",
                     prefix_tokens=prefix_tokens, rows=rows, cols=cols, qkv_bias=value.bias is not None, ls=_flag(ls))


def mlp_part(block: nn.Module, dim: int, tokens: int, where: str) -> Part:
    _check_norm(block.norm2, f"{where}.norm2")
    mlp = block.mlp
    _check_gelu(mlp, f"{where}.mlp")
    fc1, fc2 = _linear(getattr(mlp, "fc1", None), f"{where}.mlp.fc1"), _linear(getattr(mlp, "fc2", None),
                                                                              f"{where}.mlp.fc2")
    scale = float(getattr(block, "scale", 1.0))
    if scale not in (1.0, 2.0):
        raise _refuse(where, block, f"a residual scale of {scale:g} (the parts know 1 and 2)")
    scaled = int(scale == 2.0)
    return Part.make("mlp", dim, tokens, hidden=fc1.out_features, bias=fc1.bias is not None and fc2.bias is not None,
                     scaled=scaled, ls=_flag(getattr(block, "ls2", None)))


def block_parts(block: nn.Module, dim: int, tokens: int, where: str) -> list[Part]:
    """The parts of one entry of ``model.blocks`` (none for a span replaced by the identity)."""
    if hasattr(block, "replaced") and hasattr(block, "map") and not hasattr(block, "mlp"):
        if isinstance(block.map, nn.Identity):
            return []
        layer = _linear(block.map, f"{where}.map")
        prefix_map = getattr(block, "prefix_map", None)
        return [Part.make("span", dim, tokens, bias=layer.bias is not None,
                          prefix_map=int(getattr(block, "num_prefix_tokens", 0)) if prefix_map is not None else 0)]
    if hasattr(block, "mlp") and hasattr(block, "norm2"):
        parts = []
        if hasattr(block, "attn"):
            parts.append(attention_part(block.attn, getattr(block, "norm1", None), getattr(block, "ls1", None), dim,
                                        tokens, f"{where}.attn"))
        elif not hasattr(block, "scale"):
            raise _refuse(where, block, "a block with an MLP but neither attention nor a residual scale")
        return [*parts, mlp_part(block, dim, tokens, where)]
    raise _refuse(where, block, "neither a transformer block, an MLP-only block nor a span map")


def embed_part(model: nn.Module, tokens: int) -> Part:
    pe = model.patch_embed
    proj = pe.proj
    if not isinstance(proj, nn.Conv2d) or not isinstance(getattr(pe, "norm", nn.Identity()), nn.Identity):
        raise _refuse("patch_embed", pe, "a patch embedding other than one Conv2d")
    height, width = (int(s) for s in pe.img_size)
    prefix = int(model.num_prefix_tokens)
    pos = "none" if getattr(model, "pos_embed", None) is None else (
        "patches" if getattr(model, "no_embed_class", False) else "all")
    norm_pre = getattr(model, "norm_pre", nn.Identity())
    if not isinstance(norm_pre, nn.Identity):
        _check_norm(norm_pre, "norm_pre")
    return Part.make("embed", proj.out_channels, tokens, in_chans=proj.in_channels, height=height, width=width,
                     patch_h=int(proj.kernel_size[0]), patch_w=int(proj.kernel_size[1]), prefix=prefix, pos=pos,
                     norm_pre=_flag(norm_pre))


def head_part(model: nn.Module, tokens: int) -> Part:
    dim = int(model.embed_dim)
    pool = str(model.global_pool)
    if pool not in ("token", "avg") or getattr(model, "attn_pool", None) is not None:
        raise _refuse("global_pool", model, f"global_pool={pool!r} (the parts know token and avg)")
    norm, fc_norm = getattr(model, "norm", nn.Identity()), getattr(model, "fc_norm", nn.Identity())
    for name, module in (("norm", norm), ("fc_norm", fc_norm)):
        if not isinstance(module, nn.Identity):
            _check_norm(module, name)
    head = model.head
    classes = 0 if isinstance(head, nn.Identity) else _linear(head, "head").out_features
    return Part.make("head", dim, tokens, pool=pool, prefix=int(model.num_prefix_tokens),
                     norm=_flag(norm), fc_norm=_flag(fc_norm), classes=classes)


def model_tokens(model: nn.Module) -> int:
    rows, cols = (int(g) for g in model.patch_embed.grid_size)
    return rows * cols + int(model.num_prefix_tokens)


def model_parts(model: nn.Module) -> list[Part]:
    """The parts of a (compressed) timm ``VisionTransformer``, in the order it runs them (overhead not included)."""
    if not hasattr(model, "blocks") or not hasattr(model, "patch_embed"):
        raise EdgeError(f"a {type(model).__name__} has no blocks and patch embedding",
                        expected="a timm VisionTransformer (compressed or not)")
    dim, tokens = int(model.embed_dim), model_tokens(model)
    parts = [embed_part(model, tokens)]
    for i, block in enumerate(model.blocks):
        parts += block_parts(block, dim, tokens, f"blocks[{i}]")
    return [*parts, head_part(model, tokens)]


def overhead_part(dim: int, tokens: int) -> Part:
    return Part.make("overhead", dim, tokens)
