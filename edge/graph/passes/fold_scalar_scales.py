"""A multiplication (or division) by a scalar constant next to a MatMul with constant weights is
folded into those weights: Mul(x, c) -> MatMul(., W)  and  MatMul(x, W) -> Mul(., c)  become
MatMul(x, c W).

The 0.5 of an erf GELU is left in place: runtimes fuse the whole pattern into one kernel."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import bypass, constant_value, erf_gelu_nodes, is_graph_output, successor


def _scale(node: gs.Node) -> tuple[int, float] | None:
    """(data input index, factor) for Mul/Div by a scalar constant."""
    if node.op not in ("Mul", "Div"):
        return None
    candidates = ((0, 1), (1, 0)) if node.op == "Mul" else ((0, 1),)
    for data, const in candidates:
        value = constant_value(node.inputs[const])
        if value is not None and value.size == 1 and np.isfinite(value).all() and float(value.reshape(())) != 0:
            factor = float(value.reshape(()))
            return data, (factor if node.op == "Mul" else 1.0 / factor)
    return None


def _weight(node: gs.Node) -> np.ndarray | None:
    if node is None or node.op != "MatMul":
        return None
    value = constant_value(node.inputs[1])
    return value if value is not None and value.ndim == 2 else None


def _rescale(matmul: gs.Node, factor: float) -> None:
    weight = _weight(matmul)
    matmul.inputs[1] = gs.Constant(f"{matmul.name}_scaled_weight",
                                   (weight.astype(np.float64) * factor).astype(weight.dtype))


def run(graph: gs.Graph) -> bool:
    changed = False
    gelu = erf_gelu_nodes(graph)
    for node in list(graph.nodes):
        scale = _scale(node) if node.outputs and id(node) not in gelu else None
        if scale is None:
            continue
        data, factor = scale
        consumer = successor(graph, node)
        if _weight(consumer) is not None and consumer.inputs[0] is node.outputs[0]:  # scale before the MatMul
            _rescale(consumer, factor)
            bypass(graph, node, data)
            changed = True
            continue
        source = node.inputs[data]
        producer = source.inputs[0] if len(source.inputs) == 1 else None
        if _weight(producer) is not None and len(source.outputs) == 1 and not is_graph_output(graph, source):
            _rescale(producer, factor)  # scale after the MatMul
            bypass(graph, node, data)
            changed = True
    return changed


PASS = InPlacePass("fold-scalar-scales", "fold a Mul/Div by a scalar into the next/previous MatMul", run)
