"""Consecutive linear maps become one: MatMul(+Add) -> MatMul(+Add) with constant weights and
nothing non-linear between is rewritten as a single MatMul(+Add) with folded weights (float64).

This is what adjacent block approximations (``linear:8-9,linear:9-10``) export as."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import constant_value, detach, successor


def _weight(node: gs.Node) -> np.ndarray | None:
    if node.op != "MatMul":
        return None
    value = constant_value(node.inputs[1])
    return value if value is not None and value.ndim == 2 else None


def _bias(node: gs.Node, width: int) -> tuple[int, np.ndarray] | None:
    """(index of the data input, bias) for an Add of a constant over the last dimension only."""
    if node is None or node.op != "Add":
        return None
    for data, const in ((0, 1), (1, 0)):
        value = constant_value(node.inputs[const])
        if value is not None and value.size == width and value.shape[-1:] == (width,):
            return data, value.reshape(width)
    return None


def _chain(graph: gs.Graph, first: gs.Node):
    """(first, bias1, second, bias2 node or None) for MatMul[+Add] -> MatMul[+Add], else None."""
    w1 = _weight(first)
    if w1 is None:
        return None
    node = successor(graph, first)
    bias1 = _bias(node, w1.shape[1])
    add1 = node if bias1 is not None else None
    if add1 is not None:
        node = successor(graph, add1)
    if node is None or _weight(node) is None or _weight(node).shape[0] != w1.shape[1]:
        return None
    if node.inputs[0] is not (add1.outputs[0] if add1 is not None else first.outputs[0]):
        return None
    w2 = _weight(node)
    after = successor(graph, node)
    add2 = after if _bias(after, w2.shape[1]) is not None else None
    return first, add1, bias1, node, add2


def _fold(graph: gs.Graph, first, add1, bias1, second, add2) -> None:
    w1 = _weight(first).astype(np.float64)
    w2 = _weight(second).astype(np.float64)
    dtype = _weight(second).dtype
    bias = np.zeros(w2.shape[1])
    if bias1 is not None:
        bias += bias1[1].astype(np.float64) @ w2
    if add2 is not None:
        bias += _bias(add2, w2.shape[1])[1].astype(np.float64)
    second.inputs[0] = first.inputs[0]
    second.inputs[1] = gs.Constant(f"{second.name}_folded_weight", (w1 @ w2).astype(dtype))
    if add2 is not None:
        data = _bias(add2, w2.shape[1])[0]
        add2.inputs[1 - data] = gs.Constant(f"{add2.name}_folded_bias", bias.astype(dtype))
    elif bias1 is not None:
        product = gs.Variable(f"{second.name}_product", dtype=second.outputs[0].dtype)
        result = second.outputs[0]
        second.outputs[0] = product
        graph.nodes.append(gs.Node("Add", f"{second.name}_folded_add",
                                   inputs=[product, gs.Constant(f"{second.name}_folded_bias", bias.astype(dtype))],
                                   outputs=[result]))
    for node in (first, add1):
        if node is not None:
            detach(node)


def run(graph: gs.Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        if not node.outputs:
            continue
        chain = _chain(graph, node)
        if chain is not None:
            _fold(graph, *chain)
            changed = True
    return changed


PASS = InPlacePass("fold-linear-chains", "consecutive linear maps become one MatMul(+Add)", run)
