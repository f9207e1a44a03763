"""Reshape followed by Reshape becomes the second Reshape (when its target has no copied dims, 0)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from edge.graph.util import constant_value, only_consumer

name = "merge-reshapes"


def run(graph: gs.Graph) -> bool:
    changed = False
    for first in list(graph.nodes):
        if first.op != "Reshape" or not first.outputs:
            continue
        second = only_consumer(first.outputs[0])
        if second is None or second.op != "Reshape" or any(o is first.outputs[0] for o in graph.outputs):
            continue
        target = constant_value(second.inputs[1])
        if target is None or np.any(np.asarray(target) == 0):
            continue
        second.inputs[0] = first.inputs[0]
        first.outputs.clear()
        first.inputs.clear()
        changed = True
    return changed
