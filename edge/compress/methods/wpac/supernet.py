"""Sub-networks of a width-compressed model: droppable units, their MACs, the order they go in, extraction.

A ``wpac`` model (:mod:`edge.compress.methods.wpac.module`) holds, per block, a :class:`NarrowAttention` whose
per-head Q/K and V dims and an MLP whose hidden units are sorted most important first. Each of
these three **parts** of a block (``qk``, ``v``, ``mlp``) can be cut at its tail. The cuts are
aligned: a part of width ``W`` with alignment ``a`` (``align`` for head dims, ``mlp_align`` for
the MLP) can keep ``a, 2a, ...`` or its whole width ``W`` (:func:`part_stops`); the dims between
two neighbouring stops are one **droppable unit** (the paper's "group"; a head-dim unit spans
the same dims of every head of the block, so all heads keep one width). The first unit of every
part is never dropped: a sub-network keeps at least ``a`` dims of each part.

FLOPs (2 per multiply-accumulate, as :mod:`edge.compress.cost` counts them) are linear in a part's
width, WITH the attention products: per head-dim index over ``H`` heads and ``N`` tokens of
width ``C``, a Q/K dim costs ``2 N H (2C + N)`` (its Q and K rows of ``qkv``, ``q k^T``) and a V
dim the same (its V row, ``attn v``, its column of ``proj``); an MLP unit costs
``2 N (C_in + C_out)`` (its row of fc1, its column of fc2). Biases and element-wise work are
not counted (the FLOP counter does not count them either).

The **order** is one sequence of part names (``"3.mlp"``); each entry drops the current tail
unit of that part. :func:`greedy_order` builds it from per-dim importance scores: a unit's score
is its dims' summed importance per FLOP; within a part the units are pooled from the tail
(pool-adjacent-violators, the paper's "merge any unit with lower importance than the highest
previously seen into that unit, and average") so that scores never fall towards the head, and
then the part whose tail has the lowest score gives up its tail, again and again. A sub-network
at a FLOP fraction ``F`` is the longest prefix needed to bring the FLOPs to ``F`` of the model's
or below (:func:`select`): no training, no data.

The record a super-network artifact carries (its manifest's ``supernet``, :func:`supernet_record`)
holds the parts, the order, the FLOPs and who ranked it (``wpac``: once on the calibration images;
``piad``: the dropout list trained by :mod:`edge.compress.methods.wpac.piad`, then the last ranking's rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from edge.errors import EdgeError

PARTS = ("qk", "v", "mlp")
FORMAT = 1


@dataclass(frozen=True)
class Part:
    """One cuttable part of one block: its name ``"{block}.{part}"``, the widths it may keep, FLOPs per dim."""

    block: int                  # original block index
    part: str                   # qk | v | mlp
    stops: tuple[int, ...]      # the widths it may keep, ascending; the last is its whole width
    flops_per_dim: int          # FLOPs of one dim (over every head for qk and v), batch 1

    @property
    def name(self) -> str:
        return f"{self.block}.{self.part}"

    @property
    def width(self) -> int:
        return self.stops[-1]

    def units(self, width: int | None = None) -> int:
        """How many droppable units a width of ``width`` (default: the whole) still has (the first one never is)."""
        return self.stops.index(self.width if width is None else width)

    def as_dict(self) -> dict:
        return {"block": self.block, "part": self.part, "stops": list(self.stops), "flops_per_dim": self.flops_per_dim}

    @classmethod
    def from_dict(cls, d: dict) -> Part:
        return cls(int(d["block"]), str(d["part"]), tuple(int(s) for s in d["stops"]), int(d["flops_per_dim"]))


def part_stops(width: int, align: int) -> tuple[int, ...]:
    """The widths a part of ``width`` may keep: multiples of ``align`` below it, and ``width`` itself."""
    if width <= align:
        return (width,)
    return (*range(align, width, align), width)


def attention_flops_per_dim(attn: nn.Module, tokens: int) -> int:
    """FLOPs of one Q/K (or V) dim index over every head: two weight rows (or a row and a column) and one product."""
    heads, width = attn.num_heads, attn.qkv.in_features
    return 2 * tokens * heads * (2 * width + tokens)


def mlp_flops_per_dim(mlp: nn.Module, tokens: int) -> int:
    return 2 * tokens * (mlp.fc1.in_features + mlp.fc2.out_features)


def block_parts(block: int, attn: nn.Module, mlp: nn.Module, tokens: int, align: int, mlp_align: int) -> list[Part]:
    """The three parts of one wpac block (``attn`` a NarrowAttention, ``mlp`` timm's Mlp)."""
    per_dim = attention_flops_per_dim(attn, tokens)
    return [Part(block, "qk", part_stops(attn.qk_dim, align), per_dim),
            Part(block, "v", part_stops(attn.v_dim, align), per_dim),
            Part(block, "mlp", part_stops(mlp.fc1.out_features, mlp_align), mlp_flops_per_dim(mlp, tokens))]


def part_widths(block: int, attn: nn.Module, mlp: nn.Module) -> dict[str, int]:
    return {f"{block}.qk": attn.qk_dim, f"{block}.v": attn.v_dim, f"{block}.mlp": mlp.fc1.out_features}


# ---- widths after dropping a prefix of an order -----------------------------------------------------

def widths_after(parts: dict[str, Part], order: list[str], start: dict[str, int] | None = None) -> dict[str, int]:
    """Every part's width once the entries of ``order`` are dropped, from ``start`` (default: whole widths)."""
    widths = dict(start) if start is not None else {name: p.width for name, p in parts.items()}
    for name in order:
        part, width = parts[name], widths[name]
        i = part.stops.index(width)
        if i == 0:
            raise EdgeError(f"the sub-network order drops part {name} below its first unit of {width}",
                            fix="re-create the super-network (its manifest's order was edited or is damaged)")
        widths[name] = part.stops[i - 1]
    return widths


def dropped_flops(parts: dict[str, Part], widths: dict[str, int]) -> int:
    """FLOPs the ``widths`` save against whole widths."""
    return sum((p.width - widths[name]) * p.flops_per_dim for name, p in parts.items())


# ---- the order ------------------------------------------------------------------------------------

@dataclass
class _Pool:
    score: float     # summed importance of its units' dims
    flops: int       # their FLOPs
    units: int

    @property
    def mean(self) -> float:
        return self.score / self.flops if self.flops else 0.0


def pooled_tail(part: Part, width: int, scores: list[float]) -> list[_Pool]:
    """The droppable units of ``part`` at ``width`` as pools from the tail, scores per FLOP non-decreasing headwards.

    ``scores``: the importance of each dim ``0 .. width-1``. Pool-adjacent-violators: a unit nearer
    the head whose score per FLOP is below that of the pool behind it joins that pool (averaged).
    """
    stops = part.stops[:part.stops.index(width) + 1]
    pools: list[_Pool] = []
    for hi, lo in zip(reversed(stops[1:]), reversed(stops[:-1])):   # tail first
        pools.append(_Pool(float(sum(scores[lo:hi])), (hi - lo) * part.flops_per_dim, 1))
        while len(pools) > 1 and pools[-1].mean < pools[-2].mean:
            head = pools.pop()
            tail = pools[-1]
            pools[-1] = _Pool(tail.score + head.score, tail.flops + head.flops, tail.units + head.units)
    return pools


def greedy_order(parts: dict[str, Part], widths: dict[str, int],
                 scores: dict[str, list[float]]) -> tuple[list[str], list[float]]:
    """Every droppable unit left at ``widths`` in the order to drop them, and each one's pooled score per FLOP.

    Repeatedly the part whose tail pool has the lowest score per FLOP gives up that pool, a unit at
    a time (ties: the part first in ``parts``' order).
    """
    queues = {name: pooled_tail(parts[name], widths[name], scores[name]) for name in parts}
    rank = {name: i for i, name in enumerate(parts)}
    order: list[str] = []
    values: list[float] = []
    while True:
        live = [name for name, q in queues.items() if q]
        if not live:
            return order, values
        name = min(live, key=lambda n: (queues[n][0].mean, rank[n]))
        pool = queues[name].pop(0)
        order += [name] * pool.units
        values += [pool.mean] * pool.units


# ---- selection -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """The sub-network at a FLOP fraction: how many entries of the order are dropped, widths and FLOPs."""

    fraction: float
    drops: int
    widths: dict[str, int]
    flops: int
    full_flops: int
    coarser_flops: int | None     # FLOPs with one entry fewer dropped (above the target), None at 0 drops
    smallest_flops: int


def select(record: dict, fraction: float, where: str = "the super-network") -> Selection:
    """The sub-network of ``record`` (a manifest's ``supernet``) whose FLOPs are at most ``fraction`` of the whole.

    Drops the order's entries one by one until the FLOPs are at or below the target: the result is
    the largest sub-network of the order within it. A target below the smallest sub-network (every
    unit dropped) is refused, naming the smallest fraction reachable.
    """
    if not 0.0 < fraction <= 1.0:
        raise EdgeError(f"macs={fraction:g} is outside (0, 1]", expected="a fraction of the MACs, 0 < macs <= 1",
                        fix="e.g. macs=0.5 keeps half of the MACs")
    parts = {p.name: p for p in map(Part.from_dict, record["parts"])}
    full = int(record["flops"])
    order = list(record["order"])
    smallest = full - dropped_flops(parts, widths_after(parts, order))
    target = fraction * full
    if smallest > target + 1e-9 * full:
        share = smallest / full
        raise EdgeError(f"macs={fraction:g} is below the smallest sub-network of {where}: every droppable unit "
                        f"dropped leaves {share:.4f} of its MACs ({smallest / 2e6:.1f} M of {full / 2e6:.1f} M)",
                        expected=f"macs >= {_ceil4(share)} (each head-dim and MLP part keeps one aligned unit)",
                        fix=f"ask for macs={_ceil4(share)} or more, or use a smaller alignment when compressing")
    widths = {name: p.width for name, p in parts.items()}
    flops, coarser, drops = full, None, 0
    for name in order:
        if flops <= target:
            break
        coarser = flops
        widths = widths_after(parts, [name], widths)
        flops = full - dropped_flops(parts, widths)
        drops += 1
    return Selection(fraction, drops, widths, flops, full, coarser, smallest)


def _ceil4(value: float) -> str:
    return f"{math.ceil(value * 10000) / 10000:.4f}"


def supernet_record(parts: dict[str, Part], order: list[str], scores: list[float], *, flops: int, by: str,
                    trained: int = 0, **extra) -> dict:
    """The ``supernet`` entry of a manifest: parts, order, FLOPs (whole model, batch 1), who ranked it."""
    return {"format": FORMAT, "by": by, "flops": int(flops), "parts": [p.as_dict() for p in parts.values()],
            "order": list(order), "scores": [float(f"{s:.6g}") for s in scores], "trained": int(trained), **extra}


def remaining_record(record: dict, selection: Selection, flops: int) -> dict:
    """The record of the sub-network ``selection`` cut from ``record``: its parts at their new widths, the rest
    of the order (a sub-network of a sub-network is the same as one cut deeper from the super-network)."""
    parts = []
    for d in record["parts"]:
        part = Part.from_dict(d)
        width = selection.widths[part.name]
        parts.append({**part.as_dict(), "stops": [s for s in part.stops if s <= width]})
    drops = selection.drops
    return {**record, "flops": int(flops), "parts": parts, "order": record["order"][drops:],
            "scores": record.get("scores", [])[drops:], "trained": max(0, int(record.get("trained", 0)) - drops)}


def check_record(record: dict | None, where: str) -> dict:
    """``record`` if it is a super-network record this version reads, else a clear refusal."""
    if not record:
        raise EdgeError(f"{where} is not a super-network: its manifest has no sub-network order",
                        expected="an artifact of `edge compress MODEL --plan wpac:macs=1` (WPAC, ranked on the "
                                 "calibration images) or of `edge finetune ARTIFACT --piad` (a WPAC artifact "
                                 "trained with progressive importance-aware dropout)",
                        fix="compress the original model with --plan wpac:macs=F instead, or make a super-network "
                            "first")
    if record.get("format") != FORMAT or not {"parts", "order", "flops"} <= set(record):
        raise EdgeError(f"{where}'s sub-network record is not one this version reads",
                        found=f"format {record.get('format')}", fix="re-create the super-network with this edge")
    return record


__all__ = ["PARTS", "Part", "Selection", "block_parts", "check_record", "dropped_flops", "greedy_order",
           "part_stops", "part_widths", "pooled_tail", "remaining_record", "select", "supernet_record",
           "widths_after"]
