"""A LayerNorm written out in elementary ops becomes one ``LayerNormalization`` node (opset 17).

The forms exporters write for ``(x - mean(x)) / sqrt(var(x) + eps) [* gamma] [+ beta]`` over the
last axis (torch.onnx of hand-written code, ``torch.var``, timm-style ``x * rsqrt(var + eps)``):

* the centred input ``d = Sub(x, ReduceMean(x))`` (``torch.var`` writes a second copy of it for
  the variance: both copies are accepted when they centre the same ``x``);
* the variance ``ReduceMean(Pow(d, 2))`` or ``ReduceMean(Mul(d, d))``;
* the normalisation ``Div(d, Sqrt(var + eps))``, or ``Mul(d, r)`` with ``r`` one of
  ``Reciprocal(Sqrt(var + eps))``, ``Div(1, Sqrt(var + eps))``, ``Pow(var + eps, -0.5)``;
* then, optionally, ``Mul`` by a constant ``gamma`` and ``Add`` of a constant ``beta``, each a
  vector over the last axis (without them the node gets a scale of ones and no bias).

Every ReduceMean must reduce the last axis only, with ``keepdims=1``; its axes may be an
attribute (opset < 18) or a constant input (opset >= 18). ``eps`` must be a constant scalar. The
intermediate tensors must be read by the pattern only (and not be graph outputs). Anything else,
for example a norm over several axes or over channels, is left as it is.

Why: ``Pow(x - mean, 2)`` overflows float16 once |x - mean| passes 256 (a ViT-B whose residual
stream reached 1418 fell to 18.96 % top-1 in TensorRT fp16 on an Orin Nano, 85.27 % with the
native op), and one node is what TensorRT's and ONNX Runtime's normalisation kernels take.

RMSNorm (``x * rsqrt(mean(x^2) + eps)``: timm's RmsNorm, in the aimv2_* and vit_*_xp_* ViTs) has
no single ONNX op before ``RMSNormalization`` (opset 23), which TensorRT 10.3 (JetPack 6) does not
parse, so a written-out RMSNorm is left as it is (edge's float16 conversion keeps its square in
float32 where the ranges need it). timm's own RmsNorm calls ``F.rms_norm``, which torch.onnx with
``dynamo=False`` (edge export's exporter; torch 2.13) refuses at opsets 17-20.

``LayerNormalization`` exists from opset 17; the pass manager upgrades an older graph to 17 first
(``edge.graph.upgrade``), so the pass declares ``min_opset=17``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import constant_value, infer_shapes, is_graph_output

LAYER_NORM_OPSET = 17


@dataclass
class NormMatch:
    """A decomposed LayerNorm found in the graph: its input, eps, affine constants and the nodes it replaces."""

    x: gs.Variable
    eps: float
    nodes: list[gs.Node] = field(default_factory=list)
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None

    @property
    def last(self) -> gs.Node:
        """The node whose output the LayerNormalization writes."""
        return self.nodes[-1]


def _producer(tensor, op: str | tuple[str, ...]) -> gs.Node | None:
    """The node writing ``tensor`` if its op is ``op`` (or one of them), else None."""
    ops = (op,) if isinstance(op, str) else op
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1 and tensor.inputs[0].op in ops:
        return tensor.inputs[0]
    return None


def _scalar(tensor) -> float | None:
    """The value of a constant holding one finite number (float or integer: Pow's exponent may be int64)."""
    value = constant_value(tensor)
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.number) or \
            not np.isfinite(value).all():
        return None
    return float(value.reshape(()))


def _reduce_axes(node: gs.Node) -> list[int] | None:
    """The axes of a ReduceMean: its attribute (opset < 18) or its constant second input (opset >= 18)."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1:
        value = constant_value(node.inputs[1])
        return None if value is None else [int(a) for a in value.reshape(-1)]
    return None  # no axes: every axis


def _rank(graph: gs.Graph, tensor) -> int | None:
    if getattr(tensor, "shape", None) is None:
        infer_shapes(graph)
    shape = getattr(tensor, "shape", None)
    return None if shape is None else len(shape)


def _means_last_axis(graph: gs.Graph, node: gs.Node) -> bool:
    """A ReduceMean over the last axis of its input only, keeping the reduced axis."""
    if node.op != "ReduceMean" or node.attrs.get("keepdims", 1) != 1:
        return False
    axes = _reduce_axes(node)
    if axes is None or len(axes) != 1:
        return False
    if axes[0] == -1:
        return True
    rank = _rank(graph, node.inputs[0])
    return rank is not None and axes[0] == rank - 1


def _centred(graph: gs.Graph, tensor) -> tuple[gs.Variable, list[gs.Node]] | None:
    """(x, [ReduceMean, Sub]) for ``tensor = x - mean(x, last axis)``."""
    sub = _producer(tensor, "Sub")
    mean = _producer(sub.inputs[1], "ReduceMean") if sub is not None else None
    if mean is None or mean.inputs[0] is not sub.inputs[0] or not _means_last_axis(graph, mean):
        return None
    return sub.inputs[0], [mean, sub]


def _squared(tensor) -> tuple[gs.Variable, gs.Node] | None:
    """(d, node) for ``tensor = Pow(d, 2)`` or ``Mul(d, d)``."""
    node = _producer(tensor, ("Pow", "Mul"))
    if node is None:
        return None
    if node.op == "Pow" and _scalar(node.inputs[1]) == 2.0:
        return node.inputs[0], node
    if node.op == "Mul" and node.inputs[0] is node.inputs[1]:
        return node.inputs[0], node
    return None


def _stabilised_variance(graph: gs.Graph, tensor) -> tuple[gs.Variable, float, list[gs.Node]] | None:
    """(x, eps, nodes) for ``tensor = mean((x - mean(x))^2, last axis) + eps``."""
    add = _producer(tensor, "Add")
    if add is None:
        return None
    for var_index in (0, 1):
        eps = _scalar(add.inputs[1 - var_index])
        mean = _producer(add.inputs[var_index], "ReduceMean")
        if eps is None or eps < 0 or mean is None or not _means_last_axis(graph, mean):
            continue
        square = _squared(mean.inputs[0])
        centred = _centred(graph, square[0]) if square is not None else None
        if centred is not None:
            x, centring = centred
            return x, eps, [*centring, square[1], mean, add]
    return None


def _std(graph: gs.Graph, tensor):
    """(x, eps, nodes) for ``tensor = Sqrt(var + eps)``."""
    sqrt = _producer(tensor, "Sqrt")
    found = _stabilised_variance(graph, sqrt.inputs[0]) if sqrt is not None else None
    return None if found is None else (found[0], found[1], [*found[2], sqrt])


def _inverse_std(graph: gs.Graph, tensor):
    """(x, eps, nodes) for ``tensor`` = Reciprocal(Sqrt(v)), Div(1, Sqrt(v)) or Pow(v, -0.5), v = var + eps."""
    node = _producer(tensor, ("Reciprocal", "Div", "Pow"))
    if node is None:
        return None
    if node.op == "Pow":
        found = _stabilised_variance(graph, node.inputs[0]) if _scalar(node.inputs[1]) == -0.5 else None
    elif node.op == "Div":
        found = _std(graph, node.inputs[1]) if _scalar(node.inputs[0]) == 1.0 else None
    else:
        found = _std(graph, node.inputs[0])
    return None if found is None else (found[0], found[1], [*found[2], node])


def _normalised(graph: gs.Graph, node: gs.Node) -> NormMatch | None:
    """The decomposed LayerNorm (without affine) whose last node is ``node``, or None."""
    candidates = []
    if node.op == "Div":
        candidates.append((node.inputs[0], _std(graph, node.inputs[1])))
    elif node.op == "Mul":
        candidates += [(node.inputs[d], _inverse_std(graph, node.inputs[1 - d])) for d in (0, 1)]
    for centred_tensor, scale in candidates:
        centred = _centred(graph, centred_tensor) if scale is not None else None
        if centred is None or centred[0] is not scale[0]:
            continue
        nodes = list({id(n): n for n in (*centred[1], *scale[2])}.values())  # one Sub or two
        return NormMatch(x=scale[0], eps=scale[1], nodes=[*nodes, node])
    return None


def _reader(graph: gs.Graph, node: gs.Node, op: str) -> gs.Node | None:
    """The only reader of ``node``'s output if it is an ``op``, and that output is not a graph output."""
    out = node.outputs[0]
    if len(out.outputs) != 1 or is_graph_output(graph, out) or out.outputs[0].op != op:
        return None
    return out.outputs[0]


def _channel_vector(graph: gs.Graph, node: gs.Node, data, width: int | None) -> np.ndarray | None:
    """The other input of ``node`` (Mul or Add) as a vector over the last axis, if it is one."""
    other = node.inputs[1] if node.inputs[0] is data else node.inputs[0]
    value = constant_value(other)
    if value is None or value.ndim == 0 or any(d != 1 for d in value.shape[:-1]):
        return None
    rank = _rank(graph, data)
    if rank is None or value.ndim > rank or (width is not None and value.shape[-1] != width):
        return None
    return value.reshape(-1)


def _take_affine(graph: gs.Graph, match: NormMatch) -> None:
    """Add the Mul(gamma) and Add(beta) that follow the norm to ``match``, where they are there."""
    mul = _reader(graph, match.last, "Mul")
    if mul is not None:
        gamma = _channel_vector(graph, mul, match.last.outputs[0], _width(match.x))
        if gamma is not None:
            match.gamma = gamma
            match.nodes.append(mul)
    add = _reader(graph, match.last, "Add")
    if add is not None:
        beta = _channel_vector(graph, add, match.last.outputs[0],
                               len(match.gamma) if match.gamma is not None else _width(match.x))
        if beta is not None:
            match.beta = beta
            match.nodes.append(add)


def _width(tensor) -> int | None:
    """The static size of ``tensor``'s last axis, or None."""
    dims = getattr(tensor, "shape", None)
    return int(dims[-1]) if dims and isinstance(dims[-1], (int, np.integer)) and dims[-1] > 0 else None


def _self_contained(graph: gs.Graph, match: NormMatch) -> bool:
    """Every tensor inside the pattern is read by pattern nodes only and is no graph output."""
    inside = {id(n) for n in match.nodes}
    for node in match.nodes[:-1]:
        for out in node.outputs:
            if is_graph_output(graph, out) or any(id(reader) not in inside for reader in out.outputs):
                return False
    return True


def _dtype(match: NormMatch) -> np.dtype:
    for value in (match.gamma, match.beta):
        if value is not None:
            return value.dtype
    dtype = getattr(match.x, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.dtype(np.float32)


def _replace(graph: gs.Graph, match: NormMatch, index: int) -> bool:
    """Write the match's output with one LayerNormalization; False (graph untouched) if the width is unknown."""
    width = len(match.gamma) if match.gamma is not None else _width(match.x)
    if width is None:
        return False
    dtype = _dtype(match)
    name = f"{match.last.name or 'layer_norm'}_fused_{index}"
    scale = match.gamma if match.gamma is not None else np.ones(width, dtype)
    inputs = [match.x, gs.Constant(f"{name}_scale", np.ascontiguousarray(scale.astype(dtype)))]
    if match.beta is not None:
        inputs.append(gs.Constant(f"{name}_bias", np.ascontiguousarray(match.beta.astype(dtype))))
    out = match.last.outputs[0]
    match.last.outputs.clear()
    graph.nodes.append(gs.Node("LayerNormalization", name, {"axis": -1, "epsilon": match.eps}, inputs, [out]))
    for node in match.nodes:
        node.inputs.clear()
        node.outputs.clear()
    return True


def run(graph: gs.Graph) -> bool:
    changed = False
    for index, node in enumerate(list(graph.nodes)):
        if node.op not in ("Div", "Mul") or not node.outputs:
            continue
        match = _normalised(graph, node)
        if match is None:
            continue
        _take_affine(graph, match)
        if _self_contained(graph, match) and _replace(graph, match, index):
            changed = True
    return changed


PASS = InPlacePass("fuse-layer-norm", "a LayerNorm written out (ReduceMean/Sub/Pow/Sqrt/Div) -> LayerNormalization",
                   run, min_opset=LAYER_NORM_OPSET)
