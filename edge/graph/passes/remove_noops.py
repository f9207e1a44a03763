"""Remove nodes that do nothing: Identity, Dropout, Cast to the same type, Reshape to the same
shape, Mul/Div by 1 and Add/Sub of 0 (only when the constant does not broadcast the input)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import bypass, constant_value, static_shape


def _neutral(node: gs.Node) -> int | None:
    """Index of the input that passes through unchanged, or None."""
    op = node.op
    if op == "Identity":
        return 0
    if op == "Dropout":
        return 0 if len(node.outputs) == 1 or not node.outputs[1].outputs else None
    if op == "Cast":
        source = node.inputs[0]
        dtype = getattr(source, "dtype", None)
        target = node.attrs.get("to")
        return 0 if dtype is not None and target is not None and \
            np.dtype(dtype) == onnx.helper.tensor_dtype_to_np_dtype(target) else None
    if op == "Reshape":
        shape_in, target = static_shape(node.inputs[0]), constant_value(node.inputs[1])
        if shape_in is not None and target is not None and tuple(int(v) for v in target) == shape_in:
            return 0
        return None
    identity = {"Mul": 1.0, "Div": 1.0, "Add": 0.0, "Sub": 0.0}.get(op)
    if identity is None:
        return None
    for index in ((0, 1) if op in ("Mul", "Add") else (0,)):
        other = 1 - index
        value = constant_value(node.inputs[other])
        if value is None or not np.all(value == identity):
            continue
        data_shape, out_shape = static_shape(node.inputs[index]), static_shape(node.outputs[0])
        if data_shape is not None and data_shape == out_shape:
            return index
    return None


def run(graph: gs.Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        keep = _neutral(node)
        if keep is not None and node.outputs:
            bypass(graph, node, keep)
            changed = changed or not node.outputs  # bypass leaves a graph-output node it cannot rename
    return bool(changed)


PASS = InPlacePass("remove-noops", "remove Identity, Dropout, no-op Cast/Reshape, x * 1, x + 0", run)
