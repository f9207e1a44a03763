"""Order, rotate and truncate the attention and MLP of the blocks a ``wpac`` step names; put them at the seams.

Everything is measured and computed on the model as it is before any replacement (the
compressor's build phase); the model itself is not changed until :func:`place_wpac`. Per block:
the criterion's bases (:mod:`edge.compress.methods.wpac.statistics`) are folded into copies of the attention's
weights, the leading ``qk`` rows of each head's Q and K, the leading ``v`` rows of its V and the
matching columns of the output projection are kept in a :class:`~edge.compress.methods.wpac.module.NarrowAttention`
(scale of the original head dim), and the MLP becomes timm's ``Mlp`` with its ``mlp`` most
important hidden units (rows of fc1, columns of fc2).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from edge.compress.methods.wpac.module import NarrowAttention, WpacStep, aligned_width
from edge.compress.methods.wpac.statistics import (
    Bases,
    BlockStatistics,
    collect_statistics,
    magnitude_bases,
    random_bases,
    rotate_attention,
    taylor_bases,
    wpac_bases,
)
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError, InternalError
from edge.models.info import model_info, original_block_indices

DATA_CRITERIA = ("wpac", "taylor")   # criteria that measure on the calibration images


def positions(model: nn.Module) -> dict[int, int]:
    """Original block index -> position in ``model.blocks`` (blocks a span replaced are absent)."""
    return {entry[0]: i for i, entry in enumerate(original_block_indices(model.blocks)) if len(entry) == 1}


def check_block(block: nn.Module, index: int) -> None:
    """Refuse what the rotation does not commute with: anything but timm's Block, Attention and Mlp as plain linears.

    ``qk_norm`` (a LayerNorm over each head's Q and K) is refused: normalising ``R q`` is not ``R``
    applied to normalised ``q``, so no rotation of Q/K keeps the function. ``scale_norm`` (a norm
    over the attention output) and a gated attention are refused for V the same way.
    """
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.layers import Mlp
    from timm.models.vision_transformer import Attention, Block

    fix = "leave this block out of the wpac step (blocks=...)"
    if type(block).forward is not Block.forward:
        raise EdgeError(f"blocks[{index}] is a {type(block).__name__}",
                        expected="timm's pre-norm Block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))", fix=fix)
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    if type(attn).forward is not Attention.forward:
        raise EdgeError(f"blocks[{index}].attn is a {type(attn).__name__}",
                        expected="timm's Attention (no other step may replace it)", fix=fix)
    if not isinstance(attn.q_norm, nn.Identity) or not isinstance(attn.k_norm, nn.Identity):
        raise EdgeError(f"blocks[{index}].attn normalises Q and K (qk_norm): a rotation of Q and K does not "
                        "commute with that norm, so WPAC cannot keep the function",
                        expected="an attention without q_norm/k_norm", fix=fix)
    if not isinstance(attn.norm, nn.Identity) or getattr(attn, "gate", None) is not None:
        raise EdgeError(f"blocks[{index}].attn normalises or gates its output (scale_norm / gated): a rotation "
                        "of V does not commute with that", expected="timm's plain Attention", fix=fix)
    if type(mlp).forward is not Mlp.forward or not isinstance(mlp.fc1, nn.Linear) \
            or not isinstance(mlp.fc2, nn.Linear) or not isinstance(mlp.norm, nn.Identity):
        raise EdgeError(f"blocks[{index}].mlp is a {type(mlp).__name__} that is not fc1 -> act -> fc2",
                        expected="timm's Mlp with Linear layers and no hidden norm (no GLU/SwiGLU)", fix=fix)


def step_blocks(step: WpacStep, num_blocks: int) -> tuple[int, ...]:
    """The original blocks ``step`` touches (every block when it names none)."""
    return step.blocks or tuple(range(num_blocks))


def widths(step: WpacStep, attn: nn.Module, mlp: nn.Module, index: int) -> tuple[int, int, int]:
    """``(qk, v, mlp)`` kept widths of one block, aligned (per head for qk and v)."""
    keep = step.keep()
    head_dim, hidden = attn.head_dim, mlp.fc1.out_features
    where = f"blocks[{index}]"
    qk = aligned_width(head_dim, keep["qk"], step.option("align"), f"{where} Q/K head dim")
    v = aligned_width(head_dim, keep["v"], step.option("align"), f"{where} V head dim")
    m = aligned_width(hidden, keep["mlp"], step.option("mlp_align"), f"{where} MLP width")
    return qk, v, m


def block_bases(step: WpacStep, block: int, attn: nn.Module, mlp: nn.Module,
                stats: dict[int, BlockStatistics]) -> Bases:
    criterion = step.option("criterion")
    if criterion == "wpac":
        return wpac_bases(stats[block])
    if criterion == "taylor":
        return taylor_bases(stats[block])
    if criterion == "magnitude":
        return magnitude_bases(attn, mlp)
    if criterion == "random":
        return random_bases(attn.num_heads, attn.head_dim, mlp.fc1.out_features, int(step.option("seed")), block)
    raise InternalError(f"criterion={criterion} passed parsing")


@torch.no_grad()
def narrow_attention(attn: nn.Module, bases: Bases, qk: int, v: int, index: int) -> NarrowAttention:
    """A NarrowAttention with the rotated attention's leading ``qk`` / ``v`` dims of every head."""
    heads, dim = attn.num_heads, attn.qkv.in_features
    rotated = rotate_attention(attn, bases)
    module = NarrowAttention(dim, heads, qk, v, attn.scale, qkv_bias=attn.qkv.bias is not None,
                             proj_bias=attn.proj.bias is not None, index=index).to(attn.qkv.weight.dtype)
    w = rotated["qkv_weight"]
    module.qkv.weight.copy_(torch.cat([w[0, :, :qk].reshape(heads * qk, dim), w[1, :, :qk].reshape(heads * qk, dim),
                                       w[2, :, :v].reshape(heads * v, dim)]))
    if "qkv_bias" in rotated:
        b = rotated["qkv_bias"]
        module.qkv.bias.copy_(torch.cat([b[0, :, :qk].reshape(-1), b[1, :, :qk].reshape(-1), b[2, :, :v].reshape(-1)]))
    module.proj.weight.copy_(rotated["proj_weight"][:, :, :v].reshape(-1, heads * v))
    if "proj_bias" in rotated:
        module.proj.bias.copy_(rotated["proj_bias"])
    return module


def narrow_mlp(mlp: nn.Module, order: torch.Tensor | None, width: int) -> nn.Module:
    """A copy of timm's ``Mlp`` keeping hidden units ``order[:width]`` (or the first ``width``); shapes only
    when ``order`` is None (restore: the weights are loaded afterwards)."""
    new = copy.deepcopy(mlp)
    fc1, fc2 = mlp.fc1, mlp.fc2
    new.fc1 = nn.Linear(fc1.in_features, width, bias=fc1.bias is not None).to(fc1.weight.dtype)
    new.fc2 = nn.Linear(width, fc2.out_features, bias=fc2.bias is not None).to(fc2.weight.dtype)
    if order is not None:
        kept = order[:width]
        with torch.no_grad():
            new.fc1.weight.copy_(fc1.weight[kept])
            if fc1.bias is not None:
                new.fc1.bias.copy_(fc1.bias[kept])
            new.fc2.weight.copy_(fc2.weight[:, kept])
            if fc2.bias is not None:
                new.fc2.bias.copy_(fc2.bias)
    return new


def _kept_share(values: torch.Tensor | None, width: int) -> list[float] | None:
    """Per head: the share of the (weighted) variance in the leading ``width`` principal axes."""
    if values is None:
        return None
    values = values.clamp_min(0.0)
    total = values.sum(-1).clamp_min(torch.finfo(torch.float64).tiny)
    return [round(float(s), 6) for s in values[:, :width].sum(-1) / total]


def build_wpac(model: nn.Module, steps: tuple[WpacStep, ...], images, spec: InputSpec, *,
               batch_size: int = 64, statistics: dict[int, BlockStatistics] | None = None,
               device: torch.device | None = None) -> tuple[dict[int, tuple[NarrowAttention, nn.Module]], dict]:
    """The modules of every block the steps touch, and what was measured to decide them (for the manifest).

    ``statistics``: every block's statistics measured before on these ``images`` (edge plan's cache),
    else those of the blocks the steps need are measured here.
    """
    place = positions(model)
    num_blocks = model_info(model).num_blocks
    targets: dict[int, WpacStep] = {}
    for step in steps:
        for block in step_blocks(step, num_blocks):
            if block not in place:
                raise EdgeError(f"plan step {step}: block {block} is not in the model any more (a span replaced it)",
                                fix="leave it out of the wpac step (blocks=...)")
            check_block(model.blocks[place[block]], block)
            targets[block] = step
    planned = {b: widths(s, model.blocks[place[b]].attn, model.blocks[place[b]].mlp, b) for b, s in targets.items()}
    measured = sorted(b for b, s in targets.items() if s.option("criterion") in DATA_CRITERIA)
    if statistics is not None and measured:
        stats = {b: statistics[b] for b in measured}
    else:
        stats = collect_statistics(model, {b: place[b] for b in measured}, images, spec,
                                   batch_size=batch_size, device=device) if measured else {}
    modules, report = {}, {}
    for block, step in sorted(targets.items()):
        attn, mlp = model.blocks[place[block]].attn, model.blocks[place[block]].mlp
        qk, v, m = planned[block]
        bases = block_bases(step, block, attn, mlp, stats)
        modules[block] = (narrow_attention(attn, bases, qk, v, block), narrow_mlp(mlp, bases.mlp, m))
        entry: dict = {"criterion": step.option("criterion"), "qk": qk, "v": v, "mlp": m}
        if block in stats:
            taylor = stats[block].taylor_mlp
            entry["mlp_taylor_kept"] = round(float(taylor[bases.mlp[:m]].sum() / taylor.sum().clamp_min(1e-300)), 6)
            entry["tokens"] = stats[block].q.rows
        if bases.qk_spectrum is not None:
            entry["qk_variance_kept"] = _kept_share(bases.qk_spectrum, qk)
            entry["v_variance_kept"] = _kept_share(bases.v_spectrum, v)
        report[str(block)] = entry
    images_seen = next(iter(stats.values())).images if stats else 0
    return modules, {"blocks": report, "images": images_seen}


def cut_by_macs(model: nn.Module, modules: dict[int, tuple[NarrowAttention, nn.Module]], fit: dict, step: WpacStep,
                images, spec: InputSpec, batch_size: int,
                device: torch.device | None = None) -> tuple[dict[int, tuple[NarrowAttention, nn.Module]], dict]:
    """Rank the units of the whole-width ``modules`` (placed in a copy of ``model``) and cut them to ``step.macs``.

    Returns the cut modules and the ``supernet`` record of what is left; ``fit`` (build_wpac's report)
    gains the widths chosen and the selection's figures.
    """
    from edge.compress.methods.wpac.importance import rank_supernet
    from edge.compress.methods.wpac.supernet import remaining_record, select

    trial = place_wpac(copy.deepcopy(model), modules)
    record = rank_supernet(trial, images, spec, align=int(step.option("align")),
                           mlp_align=int(step.option("mlp_align")), batch_size=batch_size, device=device)
    chosen = select(record, float(step.options["macs"]), "this model")
    cut = cut_widths(trial, chosen.widths)
    out = {block: (cut.blocks[position].attn, cut.blocks[position].mlp) for block, position in positions(cut).items()
           if block in modules}
    fit["macs"] = {"fraction": chosen.fraction, "flops": chosen.flops, "full_flops": chosen.full_flops,
                   "drops": chosen.drops, "smallest_flops": chosen.smallest_flops, "ranking": record.get("ranking")}
    for block, (attn, mlp) in out.items():
        fit["blocks"][str(block)].update(qk=attn.qk_dim, v=attn.v_dim, mlp=mlp.fc1.out_features)
    return out, remaining_record(record, chosen, chosen.flops)


@torch.no_grad()
def cut_attention(attn: NarrowAttention, qk: int, v: int) -> NarrowAttention:
    """A NarrowAttention with the leading ``qk`` / ``v`` dims of every head of ``attn`` (scale kept)."""
    heads, dim, dq, dv = attn.num_heads, attn.qkv.in_features, attn.qk_dim, attn.v_dim
    module = NarrowAttention(dim, heads, qk, v, attn.scale, qkv_bias=attn.qkv.bias is not None,
                             proj_bias=attn.proj.bias is not None, index=attn.index).to(attn.qkv.weight.dtype)
    w = attn.qkv.weight
    module.qkv.weight.copy_(torch.cat([w[:heads * dq].view(heads, dq, dim)[:, :qk].reshape(-1, dim),
                                       w[heads * dq:2 * heads * dq].view(heads, dq, dim)[:, :qk].reshape(-1, dim),
                                       w[2 * heads * dq:].view(heads, dv, dim)[:, :v].reshape(-1, dim)]))
    if attn.qkv.bias is not None:
        b = attn.qkv.bias
        module.qkv.bias.copy_(torch.cat([b[:heads * dq].view(heads, dq)[:, :qk].reshape(-1),
                                         b[heads * dq:2 * heads * dq].view(heads, dq)[:, :qk].reshape(-1),
                                         b[2 * heads * dq:].view(heads, dv)[:, :v].reshape(-1)]))
    module.proj.weight.copy_(attn.proj.weight.view(-1, heads, dv)[:, :, :v].reshape(-1, heads * v))
    if attn.proj.bias is not None:
        module.proj.bias.copy_(attn.proj.bias)
    return module


def cut_widths(model: nn.Module, widths: dict[str, int]) -> nn.Module:
    """``model`` (changed in place) with its wpac blocks cut to ``widths`` (``{"3.qk": 32, "3.mlp": 256, ...}``)."""
    for block, position in positions(model).items():
        seat = model.blocks[position]
        if not isinstance(getattr(seat, "attn", None), NarrowAttention) or f"{block}.qk" not in widths:
            continue
        attn, mlp = seat.attn, seat.mlp
        qk, v, hidden = widths[f"{block}.qk"], widths[f"{block}.v"], widths[f"{block}.mlp"]
        if (qk, v) != (attn.qk_dim, attn.v_dim):
            seat.attn = cut_attention(attn, qk, v)
        if hidden != mlp.fc1.out_features:
            seat.mlp = narrow_mlp(mlp, torch.arange(mlp.fc1.out_features), hidden)
    return model


def place_wpac(model: nn.Module, modules: dict[int, tuple[nn.Module, nn.Module]]) -> nn.Module:
    """Each block's NarrowAttention at ``blocks[i].attn`` and narrower Mlp at ``blocks[i].mlp``."""
    place = positions(model)
    for block, (attn, mlp) in modules.items():
        model.blocks[place[block]].attn = attn
        model.blocks[place[block]].mlp = mlp
    return model


def wpac_records(model: nn.Module, blocks: tuple[int, ...]) -> list[dict]:
    """The shapes at each block's seams, enough to rebuild them without data."""
    place = positions(model)
    out = []
    for block in blocks:
        attn, mlp = model.blocks[place[block]].attn, model.blocks[place[block]].mlp
        if not isinstance(attn, NarrowAttention):
            raise InternalError(f"wpac block {block} holds a {type(attn).__name__} attention")
        out.append({"block": block, "attention": attn.record(), "mlp": mlp.fc1.out_features})
    return out


def restore_wpac(model: nn.Module, records: list[dict]) -> nn.Module:
    """Rebuild the recorded modules at their seams (weights are loaded afterwards)."""
    place = positions(model)
    dim = model_info(model).embed_dim
    modules = {}
    for record in records:
        block = record["block"]
        mlp = model.blocks[place[block]].mlp
        modules[block] = (NarrowAttention.from_record(dim, record["attention"], index=block),
                          narrow_mlp(mlp, None, int(record["mlp"])))
    return place_wpac(model, modules)
