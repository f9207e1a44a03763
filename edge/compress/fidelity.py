"""Fidelity of a compressed model to its original on held-out images: how plans are scored.

The block-approximation planner (``auto-linear:K``) and the latency planner (``edge plan``) both
score a candidate against the original model's outputs on the same held-out images: the KL
divergence of the class probabilities (primary), top-1 agreement, and the relative error of the
final pooled representation (the only one for a headless model).

A candidate shares its first blocks with the original more often than not (a plan changes a few
blocks, often late ones). For a plain timm ``VisionTransformer`` the reference keeps the tokens that
enter every block, per batch (:class:`BlockInputs`), and a candidate is run from its first changed
block on (:func:`shared_blocks`). Why this gives the very bits the full forward gives: the cached
tokens were computed by the same modules (same types, plain attributes, bitwise-equal parameters and
buffers of the same shape, dtype and strides) on the same batch of the same inputs, with the same
kernels, in the same order (timm's ``forward_features``: embedding, then the blocks one after the
other, then the norm), so the candidate would compute exactly them again. Anything else (another
``forward_features``, gradient checkpointing, a changed embedding, forward hooks, a reference in
other batches than :data:`BATCH`) runs the full forward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from itertools import chain

import torch
import torch.nn.functional as F
from torch import nn

from edge._compat import ensure_torchvision_importable
from edge.data.preprocess import InputSpec
from edge.runtime import computing_on

BATCH = 64   # the batch candidates are scored in
EMBEDDING = ("patch_embed", "pos_drop", "patch_drop", "norm_pre")   # what runs before the blocks, with the tokens
BOOKKEEPING = ("edge_original_index",)   # attributes edge.models.info reads and no forward: a kept block carries one


@dataclass(frozen=True)
class BlockInputs:
    """The tokens entering each block of the original, per batch of :data:`BATCH` held-out images."""
    original: nn.Module   # a copy of the original: what a candidate's first blocks are compared with
    tokens: tuple[tuple[torch.Tensor, ...], ...]   # [batch][k]: entering block k; k = num_blocks: the norm


@dataclass(frozen=True)
class Reference:
    logits: torch.Tensor | None
    features: torch.Tensor
    inputs: torch.Tensor
    blocks: BlockInputs | None = None   # None: candidates are run whole


def _head(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pre = model.forward_head(tokens, pre_logits=True)
    return (model.forward_head(tokens) if model.num_classes else pre), pre


def _joined(model: nn.Module, heads: list) -> tuple[torch.Tensor | None, torch.Tensor]:
    logits, features = zip(*heads)
    return (torch.cat(logits) if model.num_classes else None), torch.cat(features)


@torch.no_grad()
def outputs(model: nn.Module, inputs: torch.Tensor,
            batch_size: int = BATCH) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(logits or None for a headless model, pooled pre-logit features)."""
    return _joined(model, [_head(model, model.forward_features(batch)) for batch in inputs.split(batch_size)])


def plain_vit(model: nn.Module) -> bool:
    """A timm VisionTransformer whose forward_features is timm's own, its blocks run one after the other."""
    ensure_torchvision_importable()
    from timm.models.vision_transformer import VisionTransformer

    return (isinstance(model, VisionTransformer) and type(model).forward_features is VisionTransformer.forward_features
            and type(model.blocks) is nn.Sequential and not model.grad_checkpointing)


@torch.no_grad()
def reference(model: nn.Module, inputs: torch.Tensor, batch_size: int = BATCH,
              device: torch.device | None = None) -> Reference:
    """The original's outputs on ``inputs``; for a plain timm ViT in batches of :data:`BATCH` (those candidates are
    scored in) also the tokens entering each block. Computed and kept on ``device`` (None: the model's), where
    every candidate is then scored."""
    with computing_on(model, device) as put:
        return _reference(model, put(inputs), batch_size)


def _reference(model: nn.Module, inputs: torch.Tensor, batch_size: int) -> Reference:
    if batch_size != BATCH or not plain_vit(model):
        return Reference(*outputs(model, inputs, batch_size), inputs)
    heads, tokens = [], []
    for i, batch in enumerate(inputs.split(batch_size)):   # timm's forward_features, stage by stage
        x = [model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(batch))))]
        for block in model.blocks:
            x.append(block(x[-1]))
        features = model.norm(x[-1])
        if i == 0 and not torch.equal(features, model.forward_features(batch)):
            # a timm whose forward_features does more than these stages: no cache, candidates run whole
            return Reference(*outputs(model, inputs, batch_size), inputs)
        tokens.append(tuple(x))
        heads.append(_head(model, features))
    return Reference(*_joined(model, heads), inputs, BlockInputs(copy.deepcopy(model), tuple(tokens)))


def reference_outputs(model: nn.Module, holdout, spec: InputSpec, device: torch.device | None = None) -> Reference:
    return reference(model, holdout.inputs(spec), device=device)


def _same_tensor(a, b) -> bool:
    return (a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a, b))


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _same_tensor(a, b)
    return type(a) is type(b) and a == b


def _same_own(a: nn.Module, b: nn.Module) -> bool:
    """Same type, plain attributes, parameters and buffers (not those of submodules); no forward hooks."""
    def own(m: nn.Module) -> dict:
        return {**{k: v for k, v in vars(m).items() if not k.startswith("_") and k not in BOOKKEEPING},
                **dict(chain(m.named_parameters(recurse=False), m.named_buffers(recurse=False)))}

    mine, theirs = own(a), own(b)
    hooks = [h for m in (a, b) for h in (m._forward_hooks, m._forward_pre_hooks)]
    return (type(a) is type(b) and not any(hooks) and mine.keys() == theirs.keys()
            and all(_same_value(v, theirs[k]) for k, v in mine.items()))


def _same_module(a: nn.Module, b: nn.Module) -> bool:
    """:func:`_same_own` for the module and every submodule, at the same names."""
    mine, theirs = dict(a.named_modules()), dict(b.named_modules())
    return mine.keys() == theirs.keys() and all(_same_own(m, theirs[name]) for name, m in mine.items())


def shared_blocks(model: nn.Module, original: nn.Module) -> int:
    """The largest k such that ``model`` computes what ``original`` does up to block k (0: nothing shared)."""
    if not (plain_vit(model) and _same_own(model, original)
            and all(_same_module(getattr(model, n), getattr(original, n)) for n in EMBEDDING)):
        return 0
    k = 0
    while k < min(len(model.blocks), len(original.blocks)) and _same_module(model.blocks[k], original.blocks[k]):
        k += 1
    return k


@torch.no_grad()
def candidate_outputs(model: nn.Module, ref: Reference) -> tuple[tuple[torch.Tensor | None, torch.Tensor], int]:
    """(:func:`outputs` of ``model`` on the reference's inputs, how many blocks the cache spared: 0 for none),
    computed where the reference is."""
    with computing_on(model, ref.inputs.device):
        return _candidate_outputs(model, ref)


def _candidate_outputs(model: nn.Module, ref: Reference) -> tuple[tuple[torch.Tensor | None, torch.Tensor], int]:
    cache = ref.blocks
    k = shared_blocks(model, cache.original) if cache is not None else 0
    if k == 0:
        return outputs(model, ref.inputs), 0
    heads = []
    for tokens in cache.tokens:
        x = tokens[k].clone()   # a block that writes to its input must not change the cache
        for block in model.blocks[k:]:
            x = block(x)
        heads.append(_head(model, model.norm(x)))
    return _joined(model, heads), k


def fidelity(model: nn.Module, reference: Reference) -> dict:
    (logits, features), _ = candidate_outputs(model, reference)
    rel = float(((features - reference.features) ** 2).sum() / (reference.features ** 2).sum())
    result = {"feature_rel_error": rel}
    if reference.logits is not None and logits is not None:
        p = F.log_softmax(reference.logits.double(), -1)
        q = F.log_softmax(logits.double(), -1)
        result["kl"] = float(F.kl_div(q, p, log_target=True, reduction="batchmean"))
        result["agreement"] = float((logits.argmax(-1) == reference.logits.argmax(-1)).double().mean())
    return result
