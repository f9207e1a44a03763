"""Choose the blocks whose attention goes, fit the affine maps, put the modules at their seams.

Everything is measured on the model before any replacement (the compressor's build phase):
NOSE (:func:`edge.analysis.nose.nose_select`) and the affine fits see the original attention
of every block. The affine fit of block ``i`` regresses the attention output (``proj``
included, before ``ls1``) on its input (the ``norm1`` output), one row per token of every
calibration image, [CLS] and register tokens included (one shared map), in float64 from
streamed sums (:mod:`edge.analysis.fit`: centred, relative ridge). Under torchrun each process
streams its share of the images and the sums are added over the processes before the fit.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from edge import distributed
from edge.analysis.fit import fit_map, fit_residual
from edge.analysis.moments import PairMoments
from edge.compress.methods.attnrm.module import AffineAttention, AttnRmStep, MLPOnlyBlock
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError, InternalError
from edge.models.info import model_info, original_block_indices
from edge.runtime import computing_on


def positions(model: nn.Module) -> dict[int, int]:
    """Original block index -> position in ``model.blocks`` (blocks a span replaced are absent)."""
    return {entry[0]: i for i, entry in enumerate(original_block_indices(model.blocks)) if len(entry) == 1}


def check_block(block: nn.Module, index: int) -> None:
    """Refuse blocks whose forward is not timm's pre-norm ``Block`` (the MLP-only block is its MLP half)."""
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import Block

    if type(block).forward is not Block.forward:
        raise EdgeError(f"blocks[{index}] is a {type(block).__name__}",
                        expected="timm's pre-norm Block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))",
                        fix="leave this block out of the attnrm step")
    attn = getattr(block, "attn", None)
    if not hasattr(attn, "qkv") or not hasattr(attn, "num_heads"):
        raise EdgeError(f"blocks[{index}].attn is a {type(attn).__name__}, not an attention layer",
                        expected="timm's Attention at blocks[i].attn (no other step may replace it)")


def select_blocks(step: AttnRmStep, free: list[int], model: nn.Module, calibration, spec: InputSpec,
                  excluded: set[int], batch_size: int,
                  device: torch.device | None = None) -> tuple[AttnRmStep, list[dict], dict]:
    """Resolve ``attnrm:auto=K``: the chosen step, the NOSE trajectory (or []), and what decided it."""
    how = step.option("select")
    count = step.auto
    if count >= len(free):
        raise EdgeError(f"plan step {step} asks for {count} attention layers, {len(free)} blocks are free "
                        f"({'+'.join(map(str, free)) or 'none'})", expected=f"K < {len(free)}: at least one "
                        "block keeps its attention", fix=f"ask for at most {len(free) - 1}")
    rows: list[dict] = []
    if how == "first":
        chosen = free[:count]
    elif how == "random":
        chosen = random.Random(step.option("seed")).sample(free, count)
    elif how == "nose":
        from edge.analysis.nose import nose_select

        chosen, rows = nose_select(model, calibration, spec, count, set(excluded), batch_size, device)
        chosen = [int(b) for b in chosen]
        if len(chosen) != count or not set(chosen) <= set(free):
            raise InternalError(f"nose_select chose {chosen} for {step}; the free blocks are {free}")
    else:
        raise InternalError(f"select={how} passed parsing")
    options = {k: v for k, v in step.options.items() if k not in ("select", "seed")}
    decided = {"select": how, "order": list(chosen), "free": list(free)}
    if how == "random":
        decided["seed"] = int(step.option("seed"))
    return AttnRmStep(blocks=tuple(sorted(chosen)), options=options), rows, decided


@torch.no_grad()
def collect_attention_moments(model: nn.Module, blocks: list[int], images, spec: InputSpec, *,
                              batch_size: int = 64, device: torch.device | None = None) -> dict[int, PairMoments]:
    """Per block: float64 moments of (attention input, attention output) over every calibration token (the
    pass on ``device``, the moments on the CPU).

    Under torchrun: this process's share of ``images``, the sums added over all processes.
    """
    place = positions(model)
    images = distributed.shard_of(images)
    dim = model_info(model).embed_dim
    moments = {b: PairMoments.zeros(2, dim) for b in blocks}
    handles = []
    for b in blocks:
        def fold(_m, args, out, b=b):
            moments[b].update([args[0].detach().reshape(-1, dim), out.detach().reshape(-1, dim)],
                              images=int(out.shape[0]))
        handles.append(model.blocks[place[b]].attn.register_forward_hook(fold))
    preprocess = images.preprocess_for(spec)
    model.eval()
    try:
        with computing_on(model, device) as put:
            for x, _ in images.batches(batch_size, preprocess):
                model.forward_features(put(x))
    finally:
        for handle in handles:
            handle.remove()
    return {b: m.all_reduce() for b, m in moments.items()}


def removable_blocks(model: nn.Module) -> list[int]:
    """The original blocks whose attention an attnrm step can take (timm's pre-norm Block)."""
    place, out = positions(model), []
    for block, i in sorted(place.items()):
        try:
            check_block(model.blocks[i], block)
        except EdgeError:
            continue
        out.append(block)
    return out


def fit_affine_attention(model: nn.Module, ridges: dict[int, float], images, spec: InputSpec, *,
                         batch_size: int = 64, moments: dict[int, PairMoments] | None = None,
                         device: torch.device | None = None) -> tuple[dict[int, AffineAttention], dict]:
    """One pass over ``images``: the closed-form affine map in place of each listed block's attention.
    ``moments``: :func:`collect_attention_moments` of these blocks (or more) already collected (read only)."""
    if moments is None:
        moments = collect_attention_moments(model, sorted(ridges), images, spec, batch_size=batch_size,
                                            device=device)
    modules, stats = {}, {}
    for block, ridge in ridges.items():
        fitted = fit_map(moments[block], 0, 1, "affine", ridge)
        modules[block] = AffineAttention.from_fit(fitted, index=block)
        stats[str(block)] = {"ridge": ridge, "tokens": moments[block].count,
                             **fit_residual(moments[block], 0, 1, fitted)}
    return modules, stats


def place_modules(model: nn.Module, modules: dict[int, nn.Module | None]) -> nn.Module:
    """``None`` -> an MLP-only block at ``blocks[i]`` (scale 1); a module -> at ``blocks[i].attn`` (in place)."""
    place = positions(model)
    for block, module in modules.items():
        if block not in place:
            raise EdgeError(f"block {block} is not in the model any more (a span replaced it)",
                            fix="leave it out of the attnrm step")
        if module is None:
            model.blocks[place[block]] = MLPOnlyBlock.from_block(model.blocks[place[block]], scale=1.0, index=block)
        else:
            model.blocks[place[block]].attn = module
    return model


def attnrm_records(model: nn.Module, blocks: tuple[int, ...]) -> list[dict]:
    """What stands at each of ``blocks``; the scale of an MLP-only block is left to its weights (a buffer)."""
    place = positions(model)
    out = []
    for block in blocks:
        module = model.blocks[place[block]]
        if isinstance(module, MLPOnlyBlock):
            out.append({"block": block, "init": "identity"})
        elif isinstance(getattr(module, "attn", None), AffineAttention):
            out.append({"block": block, "init": "affine", **module.attn.record()})
        else:
            raise InternalError(f"attnrm block {block} holds a {type(module).__name__}")
    return out


def restore_attnrm(model: nn.Module, records: list[dict]) -> nn.Module:
    """Rebuild the recorded modules at their seams; weights (and each block's scale) are loaded afterwards."""
    dim = model_info(model).embed_dim
    modules = {r["block"]: None if r["init"] == "identity" else AffineAttention(dim, r["bias"], index=r["block"])
               for r in records}
    return place_modules(model, modules)
