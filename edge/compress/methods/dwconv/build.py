"""Select attention heads by the Sigma criterion, fit their kernels, put DepthwiseAttention at the seams.

Everything is measured on the model as it is before any replacement (all fits see the original
attention), then every replaced ``blocks[i].attn`` is swapped at once. Blockwise selection takes
the K blocks of lowest ``Sigma_b`` (Eq. 16), scattered selection the K heads of lowest
``Sigma_h`` (Eq. 15) anywhere; ``order=highest`` takes the highest instead (the paper's ablation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from edge import distributed
from edge.analysis.attention import AttentionStats, collect_attention_stats
from edge.compress.methods.dwconv.kernels import KernelFit, gaussian_kernel, mean_attention_kernel
from edge.compress.methods.dwconv.module import (
    DepthwiseAttention,
    DWConvStep,
    check_attention,
    check_kernel_size,
    depthwise_from_attention,
    ensembled_projections,
    from_record,
    head_channels,
)
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.models.info import ModelInfo, model_info, original_block_indices
from edge.runtime import computing_on


def token_grid(model: nn.Module) -> tuple[int, int]:
    """The patch grid the tokens form, checked against the position embedding; refuses anything else."""
    info = model_info(model)
    if getattr(model, "dynamic_img_size", False) or getattr(model.patch_embed, "dynamic_img_pad", False):
        raise EdgeError("the model's tokens do not form a fixed grid (dynamic_img_size / dynamic_img_pad)",
                        expected="a ViT built for one input size", fix="create it without dynamic_img_size")
    pos = getattr(model, "pos_embed", None)
    if pos is not None:
        tokens = pos.shape[1] - (0 if getattr(model, "no_embed_class", False) else info.num_prefix_tokens)
        if tokens != info.num_patches:
            raise EdgeError(f"the model's {tokens} position-embedded patch tokens do not form its "
                            f"{info.grid[0]}x{info.grid[1]} patch grid",
                            expected=f"{info.num_patches} patch tokens, one per grid cell",
                            fix="dwconv needs a ViT whose patch tokens lie on the patch grid")
    return info.grid


def _check_heads(step: DWConvStep, info: ModelInfo) -> None:
    for block, head in step.heads:
        if not 0 <= block < info.num_blocks or not 0 <= head < info.num_heads[block]:
            raise EdgeError(f"plan step {step}: head {block}.{head} does not exist",
                            expected=f"block.head with block < {info.num_blocks} and head < "
                                     f"{info.num_heads[min(max(block, 0), info.num_blocks - 1)]}")


def select(step: DWConvStep, stats: AttentionStats, excluded: set[int]) -> DWConvStep:
    """Resolve ``dwconv:auto=K`` / ``dwconv:heads=auto=K`` into explicit blocks / heads."""
    highest = step.option("order") == "highest"
    options = {k: v for k, v in step.options.items() if k != "order"}
    if not step.scattered:
        scores = [(float(s), b) for s, b in zip(stats.sigma_block(), stats.blocks) if b not in excluded]
        chosen = sorted(scores, reverse=highest)[: step.auto]
        return DWConvStep(blocks=tuple(sorted(b for _, b in chosen)), options=options)
    sigma = stats.sigma_head()
    scores = [(float(sigma[i, h]), b, h) for i, b in enumerate(stats.blocks) if b not in excluded
              for h in range(sigma.shape[1])]
    if step.auto > len(scores):
        raise EdgeError(f"plan step {step} asks for {step.auto} heads, {len(scores)} are left",
                        expected=f"K <= {len(scores)}")
    chosen = sorted(scores, reverse=highest)[: step.auto]
    return DWConvStep(heads=tuple(sorted((b, h) for _, b, h in chosen)), options=options)


def targets(step: DWConvStep, info: ModelInfo) -> dict[int, tuple[int, ...]]:
    """Original block -> the heads this (resolved) step replaces there."""
    if step.blocks:
        return {b: tuple(range(info.num_heads[b])) for b in step.blocks}
    out: dict[int, list[int]] = {}
    for b, h in step.heads:
        out.setdefault(b, []).append(h)
    return {b: tuple(sorted(hs)) for b, hs in out.items()}


def _attention_by_block(model: nn.Module) -> dict[int, nn.Module]:
    return {entry[0]: block.attn for entry, block in zip(original_block_indices(model.blocks), model.blocks)
            if len(entry) == 1 and hasattr(block, "attn")}


def _fit_inputs(attn: nn.Module, heads: tuple[int, ...], variant: str):
    """Functions giving the fit's regressor source (V) and target from the attention input and output."""
    inner = attn.qkv.out_features // 3
    channels = head_channels(heads, attn.head_dim)
    w = attn.qkv.weight.detach().double()
    b = attn.qkv.bias.detach().double() if attn.qkv.bias is not None else None
    if variant == "ensembled":
        wv, bv, woe = ensembled_projections(attn, heads)
        wo = attn.proj.weight.detach().double()[:, channels]               # [dim, C]
        back = woe @ torch.linalg.pinv(woe.T @ woe)                         # Z -> least-squares ensembled target

        def target(out: torch.Tensor) -> torch.Tensor:   # the weights where the pass is (computing_on)
            return out[..., channels].double() @ wo.T.to(out.device) @ back.to(out.device)
    else:
        wv = w[channels + 2 * inner]
        bv = b[channels + 2 * inner] if b is not None else None

        def target(out: torch.Tensor) -> torch.Tensor:
            return out[..., channels].double()

    def values(x: torch.Tensor) -> torch.Tensor:
        v = x.double() @ wv.T.to(x.device)
        return v + bv.to(x.device) if bv is not None else v

    return values, target


@torch.no_grad()
def fit_kernels(model: nn.Module, plans: dict[int, tuple[tuple[int, ...], str]], images, spec: InputSpec, *,
                k: int, num_prefix_tokens: int, grid: tuple[int, int], batch_size: int = 32,
                device: torch.device | None = None) -> dict[int, KernelFit]:
    """One pass over ``images`` (on ``device``): per block, the normal equations of the least-squares kernel fit
    (summed on the CPU).

    Under torchrun: this process's share of ``images``, the sums added over all processes.
    """
    attns = _attention_by_block(model)
    images = distributed.shard_of(images)
    p = num_prefix_tokens
    fits, funcs, inputs, handles = {}, {}, {}, []
    for block, (heads, variant) in plans.items():
        attn = attns[block]
        funcs[block] = _fit_inputs(attn, heads, variant)
        width = attn.head_dim if variant == "ensembled" else len(heads) * attn.head_dim
        fits[block] = KernelFit.zeros(width, grid, k)

        def grab(_m, args, block=block):
            inputs[block] = args[0].detach()

        def fold(_m, args, block=block):
            values, target = funcs[block]
            fits[block].update(values(inputs.pop(block)[:, p:]), target(args[0].detach()[:, p:]))

        handles += [attn.register_forward_pre_hook(grab), attn.norm.register_forward_pre_hook(fold)]
    try:
        with computing_on(model, device) as put:
            for x, _ in images.batches(batch_size, images.preprocess_for(spec)):
                model.forward_features(put(x))
    finally:
        for handle in handles:
            handle.remove()
    return {block: fit.all_reduce() for block, fit in fits.items()}


def _kernels(init: str, block: int, heads: tuple[int, ...], variant: str, head_dim: int, k: int,
             stats: AttentionStats | None, fit: KernelFit | None, ridge: float, grid, prefix_tokens: int):
    """Kernels (per channel, or per head for ``full``), biases, and fit statistics of one block."""
    per_head_channels = 1 if variant == "full" else head_dim
    count = head_dim if variant == "ensembled" else len(heads) * per_head_channels
    if init == "gaussian":
        return gaussian_kernel(k).expand(count, k, k).clone(), None, {}
    if init == "mean":
        head_kernels = mean_attention_kernel(stats.mean_map(block), grid, prefix_tokens, k)[list(heads)]
        if variant == "ensembled":
            return head_kernels.mean(0).expand(head_dim, k, k).clone(), None, {}
        return head_kernels.repeat_interleave(per_head_channels, 0), None, {}
    kernels, bias, fit_stats = fit.solve(ridge)
    if variant == "full":  # one kernel per head: the mean of its channels' least-squares kernels
        kernels = kernels.reshape(len(heads), head_dim, k, k).mean(1)
    return kernels, bias, fit_stats


def prefix_pool_weights(mean_map: torch.Tensor, heads: tuple[int, ...], head_dim: int, variant: str,
                        num_prefix_tokens: int) -> torch.Tensor:
    """``prefix=pool``: the prefix queries' mean attention rows, per V channel, ``[P, N, conv_width]``."""
    rows = mean_map[list(heads), :num_prefix_tokens]                                  # [heads, P, N]
    if variant == "ensembled":  # uniform ensemble weights (Eq. 12 with gamma = 0)
        return rows.mean(0)[..., None].expand(-1, -1, head_dim).clone()
    return rows.permute(1, 2, 0).repeat_interleave(head_dim, 2)


def _replaceable(attn: nn.Module, block: int) -> bool:
    try:
        check_attention(attn, block)
    except EdgeError:
        return False
    return True


def build_dwconv(model: nn.Module, steps: tuple[DWConvStep, ...], images, spec: InputSpec, *,
                 excluded: set[int] = frozenset(), batch_size: int = 32,
                 memo: Callable[[str, Callable[[], Any]], Any] | None = None, device: torch.device | None = None,
                 ) -> tuple[tuple[DWConvStep, ...], dict[int, DepthwiseAttention], dict]:
    """Resolve, fit and build the replacement modules of ``steps`` on ``model`` (not modified).

    ``memo`` (``BuildContext.memo`` of a shared cache: ``edge plan``): the attention statistics, and the
    kernel fits of every replaceable block's whole attention in one pass, kept for every later build (each
    block's normal equations are its own: the same sums as a pass over that block alone).
    Returns the resolved steps, the modules by original block index, and statistics for the manifest.
    """
    info = model_info(model)
    grid = token_grid(model)
    attns = _attention_by_block(model)
    for step in steps:
        check_kernel_size(step.option("k"), grid)
        _check_heads(step, info)
    resolved, report, stats = [], {}, None
    needs_stats = any(not s.is_resolved or s.option("init") == "mean" or s.option("prefix") == "pool" for s in steps)
    if needs_stats:
        def collect() -> AttentionStats:
            return collect_attention_stats(model, images, spec, batch_size=batch_size, device=device)
        stats = memo("dwconv:attention", collect) if memo is not None else collect()
        report["sigma"] = stats.scores()
    fixed = {b for s in steps if s.is_resolved for b in s.touched_blocks}
    for step in steps:
        resolved.append(step if step.is_resolved else select(step, stats, set(excluded) | fixed))
    whole = {b: tuple(range(info.num_heads[b])) for b in attns}   # every head of a block: what a blocks= step takes
    modules: dict[int, DepthwiseAttention] = {}
    for step in resolved:
        chosen = targets(step, info)
        for block in chosen:
            if block not in attns:
                raise EdgeError(f"plan step {step}: block {block} has no attention to replace")
            check_attention(attns[block], block)
        k, variant, init, prefix = step.option("k"), step.option("variant"), step.option("init"), step.option("prefix")
        def fit(plans: dict[int, tuple[tuple[int, ...], str]]) -> dict[int, KernelFit]:
            return fit_kernels(model, plans, images, spec, k=k, num_prefix_tokens=info.num_prefix_tokens,
                               grid=grid, batch_size=batch_size, device=device)
        fits = {}
        if init == "lsq" and memo is not None and all(whole.get(b) == h for b, h in chosen.items()):
            every = {b: (whole[b], variant) for b, attn in attns.items() if _replaceable(attn, b)}
            shared = memo(f"dwconv:fit:k={k}:{variant}", lambda: fit(every))
            fits = {b: shared[b] for b in chosen}
        elif init == "lsq":
            fits = fit({b: (h, variant) for b, h in chosen.items()})
        step_report = {}
        for block, heads in chosen.items():
            attn = attns[block]
            kernels, bias, fit_stats = _kernels(init, block, heads, variant, attn.head_dim, k, stats,
                                                fits.get(block), float(step.option("ridge")), grid,
                                                info.num_prefix_tokens)
            weights = prefix_pool_weights(stats.mean_map(block), heads, attn.head_dim, variant,
                                          info.num_prefix_tokens) if prefix == "pool" else None
            modules[block] = depthwise_from_attention(attn, block=block, conv_heads=heads, grid=grid,
                                                      num_prefix_tokens=info.num_prefix_tokens, k=k, variant=variant,
                                                      prefix=prefix, kernels=kernels, bias=bias,
                                                      prefix_weights=weights)
            step_report[str(block)] = {"heads": list(heads), **fit_stats}
        report[str(step)] = step_report
    return tuple(resolved), modules, report


def place_dwconv(model: nn.Module, modules: dict[int, nn.Module]) -> nn.Module:
    """Put each module at ``blocks[i].attn`` of the block that was original block ``i`` (in place)."""
    positions = {entry[0]: i for i, entry in enumerate(original_block_indices(model.blocks)) if len(entry) == 1}
    for block, module in modules.items():
        if block not in positions:
            raise EdgeError(f"block {block} is not in the model any more (a span replaced it)",
                            fix="leave it out of the dwconv step")
        model.blocks[positions[block]].attn = module
    return model


def dwconv_records(model: nn.Module) -> list[dict]:
    out = []
    for entry, block in zip(original_block_indices(model.blocks), model.blocks):
        if isinstance(getattr(block, "attn", None), DepthwiseAttention):
            out.append({"block": entry[0], **block.attn.record()})
    return out


def restore_dwconv(model: nn.Module, records: list[dict]) -> nn.Module:
    """Rebuild the shapes of recorded DepthwiseAttention modules at their seams (weights loaded later)."""
    attns = _attention_by_block(model)
    place_dwconv(model, {r["block"]: from_record(r, (attns[r["block"]].q_norm, attns[r["block"]].k_norm))
                         for r in records})
    return model


def has_dwconv(model: nn.Module) -> bool:
    return any(isinstance(getattr(block, "attn", None), DepthwiseAttention) for block in model.blocks)
