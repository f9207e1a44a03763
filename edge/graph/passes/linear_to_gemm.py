"""Linear layers on a static rank >= 3 activation are written as onnx-simplifier writes them, on rows:
MatMul(x, W) [-> Add(., b)] becomes Reshape(x, [d0 * ... * dn-1, K]) -> Gemm(., W, b) ->
Reshape(., [d0, ..., dn-1, M]); layers joined by element-wise ops (an MLP: fc1 -> GELU -> fc2)
share one pair of Reshapes, the element-wise ops running on the rows in between.

Why: ONNX Runtime rewrites each MatMul + Add on a 3-D input into Reshape -> Gemm -> Reshape
itself, after our passes, so an MLP runs four Reshapes where two do, and its Reshapes never
merge with the exporter's (the qkv projection's Reshape to [B, N, 3, H, hd], the Reshape to
[B, N, D] before the output projection); written here, merge-reshapes folds them.

Rewritten only where the node count does not grow (each Add becoming a Gemm bias and each new
Reshape that merges with a neighbouring Reshape pays for one of the two new Reshapes). Left
alone: a lone layer with no Reshape neighbour (the runtime fuses it as well as we could),
dynamic shapes, and layers next to a node another pass could fold into the weights (a MatMul,
Gemm, or a Mul/Div/Add/Sub by a constant other than an erf GELU's), so the result is the same in
whatever order the passes run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import constant_value, erf_gelu_nodes, infer_shapes, is_graph_output, static_shape, successor

_FOLDABLE = ("MatMul", "Gemm", "Mul", "Div", "Add", "Sub")


_ELEMENTWISE = {"Relu", "Erf", "Sigmoid", "Tanh", "Gelu", "Softplus", "Neg", "Abs", "Sqrt", "Exp", "Log",
                "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Clip", "Add", "Sub", "Mul", "Div", "Pow",
                "Max", "Min"}


@dataclass
class _Layer:
    matmul: gs.Node
    add: gs.Node | None
    weight: np.ndarray
    bias: np.ndarray | None

    @property
    def last(self) -> gs.Node:
        return self.add if self.add is not None else self.matmul


@dataclass
class _Run:
    """Linear layers joined by element-wise regions (an MLP: fc1 -> GELU -> fc2), all runnable on rows."""
    layers: list[_Layer]
    regions: list[list[gs.Node]]  # the element-wise nodes between layer i and layer i + 1
    shape: tuple[int, ...]  # static shape of the first layer's input


def _weight(node: gs.Node | None) -> np.ndarray | None:
    if node is None or node.op != "MatMul" or len(node.inputs) != 2 or not node.outputs:
        return None
    value = constant_value(node.inputs[1])
    if value is None or value.ndim != 2 or not np.issubdtype(value.dtype, np.floating):
        return None
    return value if constant_value(node.inputs[0]) is None else None


def _bias(node: gs.Node | None, source, width: int, rank: int) -> tuple[gs.Node, np.ndarray] | None:
    """(Add node, bias as a length-``width`` vector) for Add(source, b) with b over the last dimension only."""
    if node is None or node.op != "Add":
        return None
    for data, const in ((0, 1), (1, 0)):
        value = constant_value(node.inputs[const])
        if node.inputs[data] is not source or value is None or value.ndim > rank:
            continue
        if value.shape[-1:] == (width,) and value.size == width:
            return node, value.reshape(width)
    return None


def _layer(graph: gs.Graph, matmul: gs.Node, rank: int) -> _Layer | None:
    weight = _weight(matmul)
    if weight is None:
        return None
    found = _bias(successor(graph, matmul), matmul.outputs[0], weight.shape[1], rank)
    add, bias = found if found is not None else (None, None)
    return _Layer(matmul, add, weight, bias)


def _producer(tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def _foldable(node: gs.Node | None) -> bool:
    """True for a neighbour that another pass may fold into (or with) a linear map."""
    if node is None or node.op not in _FOLDABLE:
        return False
    return node.op in ("MatMul", "Gemm") or any(constant_value(t) is not None for t in node.inputs)


def _row_constant(tensor, width: int) -> bool:
    """A constant that broadcasts the same over [rows, width] as over [..., rows, width]: a scalar or a [width]."""
    value = constant_value(tensor)
    return value is not None and (value.size == 1 and value.ndim <= 1 or value.shape == (width,))


def _region(graph: gs.Graph, tensor, width: int, gelu: set[int]) -> tuple[list[gs.Node], gs.Node] | None:
    """(element-wise nodes, next MatMul) when everything reading ``tensor`` is row-wise up to one linear layer."""
    nodes, seen, frontier, exit_node = [], set(), [tensor], None
    while frontier:
        current = frontier.pop()
        if is_graph_output(graph, current) or not current.outputs:
            return None
        for consumer in current.outputs:
            if id(consumer) in seen:
                continue
            if _weight(consumer) is not None and consumer.inputs[0] is current and current is not tensor:
                if exit_node is not None and exit_node is not consumer:
                    return None
                exit_node = consumer
                continue
            if consumer.op not in _ELEMENTWISE or len(consumer.outputs) != 1:
                return None
            if consumer.op in ("Mul", "Div") and id(consumer) not in gelu and \
                    any(constant_value(t) is not None for t in consumer.inputs):
                return None  # a scale fold-scalar-scales / fold-channel-scales may move into the weights
            seen.add(id(consumer))
            nodes.append(consumer)
            frontier.append(consumer.outputs[0])
    if exit_node is None or len(exit_node.inputs[0].outputs) != 1:
        return None
    inside = {id(tensor)} | {id(n.outputs[0]) for n in nodes}
    if any(id(t) not in inside and not _row_constant(t, width) for n in nodes for t in n.inputs):
        return None
    return nodes, exit_node


def _reshape_before(graph: gs.Graph, tensor) -> bool:
    """``tensor`` is written by a Reshape and read only by the linear layer (so the Reshapes merge)."""
    producer = _producer(tensor)
    return producer is not None and producer.op == "Reshape" and len(tensor.outputs) == 1 \
        and not is_graph_output(graph, tensor)


def _reshape_after(node: gs.Node | None, tensor) -> bool:
    """``node`` is a Reshape of ``tensor`` to a constant target without copied (0) dims."""
    if node is None or node.op != "Reshape" or node.inputs[0] is not tensor:
        return False
    target = constant_value(node.inputs[1])
    return target is not None and not np.any(np.asarray(target) == 0)


def _run_from(graph: gs.Graph, matmul: gs.Node, gelu: set[int]) -> _Run | None:
    """The rewritable run of linear layers starting at ``matmul``, or None."""
    shape = static_shape(matmul.inputs[0]) if _weight(matmul) is not None else None
    if shape is None or len(shape) < 3:
        return None
    layers, regions = [], []
    layer = _layer(graph, matmul, len(shape))
    if layer.weight.shape[0] != shape[-1]:
        return None
    while True:
        layers.append(layer)
        width = layer.weight.shape[1]
        found = _region(graph, layer.last.outputs[0], width, gelu)
        following = _layer(graph, found[1], len(shape)) if found is not None else None
        if following is None or following.weight.shape[0] != width:
            break
        regions.append(found[0])
        layer = following
    before, after = _producer(matmul.inputs[0]), successor(graph, layers[-1].last)
    merged_before = _reshape_before(graph, matmul.inputs[0])
    merged_after = _reshape_after(after, layers[-1].last.outputs[0])
    biases = sum(layer.add is not None for layer in layers)
    if merged_before + merged_after + biases < 2:
        return None  # two new Reshapes; the node count would grow
    if (not merged_before and _foldable(before)) or (not merged_after and _foldable(after)):
        return None  # leave it to the folding passes first
    if len(layers) == 1 and not (merged_before or merged_after):
        return None  # the runtime fuses a lone MatMul + Add itself
    return _Run(layers, regions, shape)


def _fresh(names: set[str], base: str) -> str:
    candidate, index = base, 1
    while candidate in names:
        candidate, index = f"{base}_{index}", index + 1
    names.add(candidate)
    return candidate


def _rewrite(graph: gs.Graph, run: _Run, names: set[str]) -> None:
    first = run.layers[0].matmul
    rows, base = math.prod(run.shape[:-1]), first.name or "linear"
    source, result = first.inputs[0], run.layers[-1].last.outputs[0]
    flat = gs.Variable(_fresh(names, f"{base}_rows"), dtype=source.dtype, shape=[rows, run.shape[-1]])
    rows_shape = gs.Constant(_fresh(names, f"{base}_rows_shape"), np.array([rows, run.shape[-1]], np.int64))
    graph.nodes.append(gs.Node("Reshape", _fresh(names, f"{base}_to_rows"), inputs=[source, rows_shape],
                               outputs=[flat]))
    data = flat
    for index, layer in enumerate(run.layers):
        width = layer.weight.shape[1]
        if index > 0:
            data = layer.matmul.inputs[0]
        output = layer.last.outputs[0]
        if index == len(run.layers) - 1:
            output = gs.Variable(_fresh(names, f"{base}_gemm_rows"), dtype=result.dtype)
        else:
            for tensor in [output, *(n.outputs[0] for n in run.regions[index])]:
                tensor.shape = [rows, width]
        output.shape = [rows, width]
        inputs = [data, layer.matmul.inputs[1]]
        if layer.bias is not None:
            bias = gs.Constant(_fresh(names, f"{layer.matmul.name}_gemm_bias"), np.ascontiguousarray(layer.bias))
            inputs.append(bias)
        name_ = _fresh(names, f"{layer.matmul.name or base}_gemm")
        for node in (layer.matmul, layer.add):
            if node is not None:
                node.inputs.clear()
                node.outputs.clear()
        graph.nodes.append(gs.Node("Gemm", name_, inputs=inputs, outputs=[output]))
        data = output
    out_shape = gs.Constant(_fresh(names, f"{base}_out_shape"),
                            np.array([*run.shape[:-1], run.layers[-1].weight.shape[1]], np.int64))
    graph.nodes.append(gs.Node("Reshape", _fresh(names, f"{base}_from_rows"), inputs=[data, out_shape],
                               outputs=[result]))


def _needs_shapes(graph: gs.Graph) -> bool:
    return any(_weight(n) is not None and getattr(n.inputs[0], "shape", None) is None for n in graph.nodes)


def run(graph: gs.Graph) -> bool:
    if _needs_shapes(graph):
        infer_shapes(graph)
    gelu = erf_gelu_nodes(graph)
    runs, used = [], set()
    for node in list(graph.toposort().nodes):
        found = _run_from(graph, node, gelu) if id(node) not in used else None
        if found is not None:
            runs.append(found)
            used.update(id(layer.matmul) for layer in found.layers)
    names = set(graph.tensors()) | {n.name for n in graph.nodes}
    for found in runs:
        _rewrite(graph, found, names)
    return bool(runs)


PASS = InPlacePass("linear-to-gemm", "rank >= 3 MatMul(+Add) as Reshape -> Gemm -> Reshape", run)
