"""PIAD's importance of the droppable units (SKD, Eq. 13-15), measured on a proxy set of training images.

On the sub-network of the given widths (PIAD: the smallest one, every unit of the dropout list
dropped), with ``L`` the mean cross-entropy on the proxy images:

* **module sensitivity** (Eq. 13): ``S_m = (L_skip(m) - L) / L``, the relative increase of the
  loss when module ``m`` (a wpac block's attention, or its MLP) outputs nothing and the block
  keeps only its residual; a module whose removal lowers the loss gets 0;
* **dimension importance** (Eq. 14): the first-order Taylor importance ``|g x a|`` of each kept
  dim, summed over images and tokens (and heads: a head-dim unit spans every head), ``g`` the
  gradient of the loss: a Q/K dim counts its Q and its K activation, a V dim its V activation,
  an MLP unit its hidden activation. Normalised within the module (an attention's Q/K and V dims
  together) into contribution ratios ``r_d``; the global importance is ``S_m r_d``;
* a unit's score (Eq. 15) is the sum over its dims per FLOP (:mod:`edge.compress.methods.wpac.supernet`).

The reference code measures the sensitivity as a drop of top-1 accuracy; the paper's cost, the
loss, is used here: it still moves where a small proxy set's accuracy does not. Sums are float64
and added over the processes under torchrun (each process reads its share of the proxy images),
so every process ranks the same units.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edge.compress.methods.wpac.droppable import DroppableAttention, DroppableMlp, Droppables
from edge.data.preprocess import InputSpec
from edge.distributed import all_reduce_sum, shard_of
from edge.runtime import computing_on


def _batches(images, spec: InputSpec, batch_size: int):
    """This process's share of ``images`` (all of them in one process), in batches."""
    preprocess = images.preprocess_for(spec)
    mine = shard_of(images)
    return mine.batches(batch_size, preprocess) if len(mine) else iter(())


def _loss_sum(model: nn.Module, images, spec: InputSpec, batch_size: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for x, labels in _batches(images, spec, batch_size):
            logits = model(x.to(device=device, dtype=dtype))
            total[0] += float(F.cross_entropy(logits.float(), labels.to(device), reduction="sum"))
            total[1] += len(labels)
    return total


def _taylor(modules: Droppables, widths: dict[str, int], images, spec: InputSpec, batch_size: int,
            dtype: torch.dtype, device: torch.device) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per part: ``|g x a|`` summed over images, tokens and heads for each kept dim; and the loss sum and count."""
    model = modules.model
    sums = {name: torch.zeros(widths[name], dtype=torch.float64) for name in modules.parts}
    total = torch.zeros(2, dtype=torch.float64)
    attention, mlp = modules.attention, modules.mlp
    for m in modules.modules():
        m.probe = []
    try:
        with torch.enable_grad():
            for x, labels in _batches(images, spec, batch_size):
                for m in modules.modules():
                    m.probe = []
                logits = model(x.to(device=device, dtype=dtype))
                loss = F.cross_entropy(logits.float(), labels.to(device), reduction="sum")
                seams: list[tuple[int, DroppableAttention | DroppableMlp]] = [*attention.items(), *mlp.items()]
                probes = [(block, m, m.probe or []) for block, m in seams]
                grads = iter(torch.autograd.grad(loss, [t for _, _, kept in probes for t in kept]))
                for block, m, kept in probes:
                    values = [(t.detach().double() * next(grads).double()).abs() for t in kept]
                    if isinstance(m, DroppableAttention):
                        q, k, v = (t.sum(tuple(range(t.dim() - 1))) for t in values)
                        sums[f"{block}.qk"] += (q + k).cpu()
                        sums[f"{block}.v"] += v.cpu()
                    else:
                        sums[f"{block}.mlp"] += values[0].reshape(-1, values[0].shape[-1]).sum(0).cpu()
                total[0] += float(loss.detach())
                total[1] += len(labels)
    finally:
        for m in modules.modules():
            m.probe = None
    return sums, total


def unit_importance(modules: Droppables, widths: dict[str, int], images, spec: InputSpec, *,
                    batch_size: int = 64) -> tuple[dict[str, list[float]], dict]:
    """Per part, the global importance ``S_m r_d`` of each dim kept at ``widths``; and what was measured.

    ``modules`` are the droppable modules in the model; the model is measured in eval mode with
    ``widths`` pinned, then put back as it was (training mode, widths, no probes).
    """
    from edge.check.accuracy import require_head

    model = modules.model
    require_head(model, images, "PIAD's importance (the cross-entropy on the proxy images)",
                 "train without --piad")
    parameter = next(model.parameters())
    dtype, device = parameter.dtype, parameter.device
    saved = {m: (m.training, m.pinned) for m in modules.modules()}
    was_training = model.training
    kept = {b: (a.qk, a.v, modules.mlp[b].hidden) for b, a in modules.attention.items()}
    model.eval()
    modules.set_widths(widths, pinned=True)
    try:
        sums, base = _taylor(modules, widths, images, spec, batch_size, dtype, device)
        skipped = {}
        for module in modules.modules():
            module.skip = True
            try:
                skipped[module] = _loss_sum(model, images, spec, batch_size, dtype, device)
            finally:
                module.skip = False
    finally:
        model.train(was_training)
        for module, (training, pinned) in saved.items():
            module.train(training)
            module.pinned = pinned
        for block, (qk, v, hidden) in kept.items():
            modules.attention[block].qk, modules.attention[block].v = qk, v
            modules.mlp[block].hidden = hidden
    names = sorted(sums)
    flat = torch.cat([base, *[skipped[m] for m in modules.modules()], *[sums[n] for n in names]])
    all_reduce_sum(flat)                     # one collective for every sum (identity in one process)
    base, rest = flat[:2], flat[2:]
    count = max(float(base[1]), 1.0)
    loss = float(base[0]) / count
    losses, offset = {}, 0
    for module in modules.modules():
        losses[module] = float(rest[offset]) / max(float(rest[offset + 1]), 1.0)
        offset += 2
    for name in names:
        size = sums[name].numel()
        sums[name], offset = rest[offset:offset + size], offset + size
    tiny = torch.finfo(torch.float64).tiny
    sensitivity = {m: max(0.0, (losses[m] - loss) / max(loss, tiny)) for m in modules.modules()}
    scores: dict[str, list[float]] = {}
    for block, attn in modules.attention.items():
        qk, v = sums[f"{block}.qk"], sums[f"{block}.v"]
        total = float(qk.sum() + v.sum()) or tiny
        scores[f"{block}.qk"] = (qk * (sensitivity[attn] / total)).tolist()
        scores[f"{block}.v"] = (v * (sensitivity[attn] / total)).tolist()
    for block, mlp in modules.mlp.items():
        hidden = sums[f"{block}.mlp"]
        scores[f"{block}.mlp"] = (hidden * (sensitivity[mlp] / (float(hidden.sum()) or tiny))).tolist()
    report = {"loss": round(loss, 6), "images": int(count),
              "sensitivity": {name: round(sensitivity[m], 6) for name, m in _module_names(modules).items()}}
    return scores, report


def _module_names(modules: Droppables) -> dict[str, DroppableAttention | DroppableMlp]:
    return {**{f"{b}.attn": a for b, a in modules.attention.items()}, **{f"{b}.mlp": m for b, m in modules.mlp.items()}}


def rank_supernet(model: nn.Module, images, spec: InputSpec, *, align: int, mlp_align: int,
                  batch_size: int = 64, device: torch.device | None = None) -> dict:
    """The ``supernet`` record of a wpac ``model`` at its widths, ranked once on ``images`` (WPAC alone, no training).

    The model is not changed (its modules go back after the measurement).
    """
    from edge.compress.cost import analytic_flops
    from edge.compress.methods.wpac.supernet import greedy_order, supernet_record

    flops = analytic_flops(model)
    modules = Droppables.put(model, align, mlp_align)
    try:
        widths = modules.whole()
        with computing_on(model, device):   # the passes on device (unit_importance runs where the model is)
            scores, report = unit_importance(modules, widths, images, spec, batch_size=batch_size)
        order, values = greedy_order(modules.parts, widths, scores)
        return supernet_record(modules.parts, order, values, flops=flops, by="wpac", align=align,
                               mlp_align=mlp_align, ranking=report)
    finally:
        modules.restore()


__all__ = ["rank_supernet", "unit_importance"]
