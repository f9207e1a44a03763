"""Reshape followed by Reshape becomes the second Reshape (when its target has no copied dims, 0)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import constant_value, detach, same_op_pairs


def run(graph: gs.Graph) -> bool:
    changed = False
    for first, second in same_op_pairs(graph, "Reshape"):
        target = constant_value(second.inputs[1])
        if target is None or np.any(np.asarray(target) == 0):
            continue
        second.inputs[0] = first.inputs[0]
        detach(first)
        changed = True
    return changed


PASS = InPlacePass("merge-reshapes", "Reshape -> Reshape becomes one Reshape", run)
