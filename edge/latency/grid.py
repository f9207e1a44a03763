"""The grid of parts a table is measured on, and each part exported once as a single-part ONNX graph.

Grids (``GRIDS``):

* ``model``: the parts of the given model (an uncompressed or compressed one), and the overhead;
* ``full``: what a plan on this model's geometry can produce: the model's own parts, attention with
  every pair of Q/K and V head widths in steps of ``align`` (16, width compression's default), MLPs
  of every hidden width in steps of ``mlp_align`` (64) with and without the doubled residual of an
  MLP-only block, the depthwise mixer (k = 3, every prefix mode, every number of heads kept), the
  affine attention map, span maps (linear, affine, with an own prefix map), and the overhead.

A part that maps the token stream to itself (attention-like sub-layers, MLPs, span maps) is timed
as a chain of ``repeat`` copies of itself, each with its own weights (default: as many as the model
has blocks), and counts for one copy's share. Timed alone and called again and again, one small
sub-layer keeps its weights in the CPU's caches, which inside the whole model they are not: on the
reference model at batch 1 (one thread, busy machine) single sub-layers predicted the whole model
24-45 % too fast, a chain of 4 still 14-28 %, a chain of 12 within 2-6 % (batch 32: within 1-5 %).
The patch embedding and the head run once per model and are timed alone.

Each graph is exported with edge's export (legacy exporter, opset 17, static batch, fused attention
off), checked with ``onnx.checker`` and against PyTorch on ONNX Runtime, and written atomically;
the graph records its part key and repeat count in the metadata (``edge.latency_part``,
``edge.latency_repeat``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import onnx
from torch import nn

from edge.check.compare import Tolerance, ort_session
from edge.check.torch_compare import compare_with_torch, verification_inputs
from edge.config import MAX_BATCH, option
from edge.errors import EdgeError
from edge.export import DEFAULT_OPSET, ExportConfig, export_bytes
from edge.fileio import write_atomic
from edge.latency.modules import input_shape, part_module
from edge.latency.parts import Part, model_parts, model_tokens, overhead_part
from edge.onnx_metadata import SOURCE_MODEL, VERSION, with_metadata

GRIDS = ("model", "full")
PART_KEY, REPEAT_KEY = "edge.latency_part", "edge.latency_repeat"
CHAINABLE = ("attention", "dwconv", "attn_map", "mlp", "span")   # token stream -> token stream
PREFIX_MODES = ("pool", "mean", "attend")


@dataclass(frozen=True)
class GridConfig:
    grid: str = "full"
    batch: int = option(1, minimum=1, maximum=MAX_BATCH)
    align: int = option(16, minimum=1, maximum=4096)        # attention head widths: multiples of this
    mlp_align: int = option(64, minimum=1, maximum=65536)   # MLP hidden widths: multiples of this
    repeat: int | None = option(None, minimum=1, maximum=1000)  # chain length of a sub-layer; None: the model's depth

    def check(self) -> None:
        if self.grid not in GRIDS:
            raise EdgeError(f"--grid {self.grid!r}", expected=f"one of {', '.join(GRIDS)}")

    def resolved_repeat(self, model: nn.Module) -> int:
        return self.repeat or max(1, len(model.blocks))


def repeats(part: Part, repeat: int) -> int:
    """How many copies of ``part`` its graph chains: ``repeat`` for token-stream parts, else 1."""
    return repeat if part.kind in CHAINABLE else 1


def _widths(full: int, step: int) -> list[int]:
    widths = list(range(step, full, step)) if step < full else []
    return sorted({*widths, full})


def full_grid(model: nn.Module, config: GridConfig) -> list[Part]:
    """Every part a plan on ``model``'s geometry can produce (see the module notes), the model's own first."""
    own = model_parts(model)
    dim, tokens = int(model.embed_dim), model_tokens(model)
    parts: list[Part] = list(own)
    blocks = [p for p in own if p.kind == "attention"]
    mlps = [p for p in own if p.kind == "mlp"]
    if blocks:
        first = blocks[0]
        heads, head_dim = first.size("heads"), first.size("qk")
        flags = {k: first.size(k) for k in ("qkv_bias", "proj_bias", "ls")}
        for qk in _widths(head_dim, config.align):
            for v in _widths(head_dim, config.align):
                parts.append(Part.make("attention", dim, tokens, heads=heads, qk=qk, v=v, **flags))
        prefix_tokens = int(model.num_prefix_tokens)
        rows, cols = (int(g) for g in model.patch_embed.grid_size)
        modes = PREFIX_MODES if prefix_tokens else ("none",)
        for prefix in modes:
            for kept in range(heads):
                if prefix == "attend" and kept:
                    continue  # attend keeps every head's own q and k: only the blockwise form is timed
                parts.append(Part.make("dwconv", dim, tokens, width=(heads - kept) * head_dim, k=3, dense=0, kept=kept,
                                       head_dim=head_dim, prefix=prefix, prefix_tokens=prefix_tokens, rows=rows,
                                       cols=cols, qkv_bias=flags["qkv_bias"], ls=flags["ls"]))
        parts += [Part.make("attn_map", dim, tokens, bias=1, ls=flags["ls"])]
    if mlps:
        first = mlps[0]
        hidden = max(p.size("hidden") for p in mlps)
        for width in _widths(hidden, config.mlp_align):
            for scaled in (0, 1):
                parts.append(Part.make("mlp", dim, tokens, hidden=width, bias=first.size("bias"), scaled=scaled,
                                       ls=first.size("ls")))
    prefix_count = int(model.num_prefix_tokens)
    for bias in (0, 1):
        parts.append(Part.make("span", dim, tokens, bias=bias, prefix_map=0))
        if prefix_count:
            parts.append(Part.make("span", dim, tokens, bias=bias, prefix_map=prefix_count))
    return _unique([*parts, overhead_part(dim, tokens)])


def _unique(parts: list[Part]) -> list[Part]:
    return list(dict.fromkeys(parts))


def grid_parts(model: nn.Module, config: GridConfig) -> list[Part]:
    config.check()
    if config.grid == "model":
        return _unique([*model_parts(model), overhead_part(int(model.embed_dim), model_tokens(model))])
    return full_grid(model, config)


def part_graph_bytes(part: Part, batch: int, source: str = "", repeat: int = 1) -> bytes:
    """The graph of ``repeats(part, repeat)`` chained copies of the part at a static ``batch``, checked and
    verified against PyTorch."""
    count = repeats(part, repeat)
    module = part_module(part) if count == 1 else nn.Sequential(*(part_module(part, seed=n) for n in range(count)))
    shape = input_shape(part)
    config = ExportConfig(batch=batch, opset=DEFAULT_OPSET)
    # export_bytes prepends the batch to any sample shape: an image, or a token stream [tokens, dim]
    proto = with_metadata(export_bytes(module, cast("tuple[int, int, int]", shape), config),
                          {VERSION: _version(), SOURCE_MODEL: source, PART_KEY: part.key, REPEAT_KEY: str(count)})
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as e:
        raise EdgeError(f"the graph of part {part.key} fails onnx.checker", found=str(e)[:400],
                        fix="report this part as a bug") from e
    data = proto.SerializeToString()
    # a chain's values grow with its copies (an MLP-only block doubles the stream): judged by relative error
    tolerance = Tolerance() if count == 1 else Tolerance(max_abs=1e6, rel_l2=1e-4)
    results = compare_with_torch(module, ort_session(data), verification_inputs(shape, batch, None), tolerance)
    failed = [r for r in results if not r.passed]
    if failed:
        raise EdgeError(f"ONNX Runtime disagrees with PyTorch on the graph of part {part.key}",
                        found=f"max abs {failed[0].max_abs:.3e}, relative L2 {failed[0].rel_l2:.3e}",
                        fix="report this part as a bug")
    return data


def _version() -> str:
    from edge import __version__

    return __version__


GRID_FILE = "grid.json"


@dataclass(frozen=True)
class GridGraph:
    """One exported graph of a grid: its part, how many copies it chains, where it is."""

    part: Part
    repeat: int
    path: Path


def export_grid(parts: list[Part], folder: Path, batch: int, repeat: int, source: str = "",
                progress=None) -> dict[str, GridGraph]:
    """Each part's graph as ``folder/NNN-KIND.onnx`` (and ``grid.json``: name -> part and repeat); name -> graph."""
    folder.mkdir(parents=True, exist_ok=True)
    graphs: dict[str, GridGraph] = {}
    for n, part in enumerate(parts):
        name = f"{n:03d}-{part.kind}"
        path = folder / f"{name}.onnx"
        write_atomic(part_graph_bytes(part, batch, source, repeat), path)
        graphs[name] = GridGraph(part, repeats(part, repeat), path)
        if progress is not None:
            progress(f"part {n + 1}/{len(parts)}: {part.key}")
    names = {name: {"part": g.part.to_json(), "repeat": g.repeat} for name, g in graphs.items()}
    (folder / GRID_FILE).write_text(json.dumps({"batch": batch, "source": source, "parts": names}, indent=1) + "\n")
    return graphs


def read_grid(path: Path) -> dict[str, tuple[Part, int]]:
    """name -> (part, repeat), from a ``grid.json`` :func:`export_grid` wrote."""
    try:
        record = json.loads(path.read_text())
        return {name: (Part.from_json(item["part"]), int(item["repeat"])) for name, item in record["parts"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EdgeError(f"{path} does not list the grid's parts", found=f"{type(e).__name__}: {e}",
                        fix="export the grid again") from e
