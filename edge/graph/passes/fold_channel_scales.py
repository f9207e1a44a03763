"""A per-output-channel scale after a linear map is folded into its weights and bias:
MatMul(x, W) [-> Add(., b)] -> Mul(., s)  becomes  MatMul(x, W diag(s)) [-> Add(., b * s)].

This is LayerScale (DeiT-III, DINOv2: ``x * gamma`` after the attention projection and after
fc2); a Div by per-channel constants is the same with 1 / s. ``s`` must act on the last
dimension only (shape ``[N]``, ``[1, ..., N]`` or a scalar), so the output shape is unchanged. The
Mul / Div nodes of an erf GELU are left alone (runtimes fuse that pattern).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import bypass, constant_value, erf_gelu_nodes, static_shape, successor


def _weight(node: gs.Node | None) -> np.ndarray | None:
    if node is None or node.op != "MatMul":
        return None
    value = constant_value(node.inputs[1])
    return value if value is not None and value.ndim == 2 else None


def _last_dim_vector(value: np.ndarray, width: int, rank: int | None) -> np.ndarray | None:
    """``value`` as a length-``width`` vector if it broadcasts over the last dimension only, else None."""
    if value.ndim > 1 and (rank is None or value.ndim > rank or any(d != 1 for d in value.shape[:-1])):
        return None
    if value.size == 1:
        return np.full(width, float(value.reshape(())), dtype=np.float64)
    if value.shape[-1] != width:
        return None
    return value.reshape(width).astype(np.float64)


def _scale(node: gs.Node, width: int, rank: int | None) -> tuple[int, np.ndarray] | None:
    """(data input index, per-channel factors) for Mul / Div by finite non-zero constants."""
    if node.op not in ("Mul", "Div"):
        return None
    for data, const in (((0, 1), (1, 0)) if node.op == "Mul" else ((0, 1),)):
        value = constant_value(node.inputs[const])
        if value is None or not np.issubdtype(value.dtype, np.floating):
            continue
        vector = _last_dim_vector(value, width, rank)
        if vector is None or not np.isfinite(vector).all() or np.any(vector == 0):
            continue
        return data, (vector if node.op == "Mul" else 1.0 / vector)
    return None


def _bias(node: gs.Node | None, width: int) -> tuple[int, np.ndarray] | None:
    """(data input index, bias) for an Add of a constant over the last dimension only."""
    if node is None or node.op != "Add":
        return None
    for data, const in ((0, 1), (1, 0)):
        value = constant_value(node.inputs[const])
        if value is not None and value.size == width and value.shape[-1:] == (width,) and value.ndim == 1:
            return data, value
    return None


def _fold(matmul: gs.Node, add: gs.Node | None, factors: np.ndarray) -> None:
    weight = _weight(matmul)
    matmul.inputs[1] = gs.Constant(f"{matmul.name}_channel_scaled_weight",
                                   (weight.astype(np.float64) * factors).astype(weight.dtype))
    if add is not None:
        data, bias = _bias(add, weight.shape[1])
        add.inputs[1 - data] = gs.Constant(f"{add.name}_channel_scaled_bias",
                                           (bias.astype(np.float64) * factors).astype(bias.dtype))


def run(graph: gs.Graph) -> bool:
    changed = False
    gelu = erf_gelu_nodes(graph)
    for matmul in list(graph.nodes):
        weight = _weight(matmul) if matmul.outputs else None
        if weight is None:
            continue
        width = weight.shape[1]
        node = successor(graph, matmul)
        bias = _bias(node, width)
        add = node if bias is not None and node.inputs[bias[0]] is matmul.outputs[0] else None
        if add is not None:
            node = successor(graph, add)
        if node is None:
            continue
        source = (add or matmul).outputs[0]
        shape = static_shape(node.outputs[0]) or static_shape(source)
        scale = _scale(node, width, len(shape) if shape is not None else None)
        if scale is None or id(node) in gelu or node.inputs[scale[0]] is not source:
            continue
        _fold(matmul, add, scale[1])
        bypass(graph, node, scale[0])
        changed = True
    return changed


PASS = InPlacePass("fold-channel-scales", "fold per-channel scales (LayerScale) into the linear map", run)
