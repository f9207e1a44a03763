"""Transpose followed by Transpose becomes one Transpose, or nothing when the two are inverse."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from edge.graph.util import bypass, only_consumer

name = "cancel-transposes"


def run(graph: gs.Graph) -> bool:
    changed = False
    for first in list(graph.nodes):
        if first.op != "Transpose" or not first.outputs:
            continue
        second = only_consumer(first.outputs[0])
        if second is None or second.op != "Transpose" or any(o is first.outputs[0] for o in graph.outputs):
            continue
        p1, p2 = first.attrs.get("perm"), second.attrs.get("perm")
        if p1 is None or p2 is None:
            continue
        combined = [p1[i] for i in p2]
        second.inputs[0] = first.inputs[0]
        first.outputs.clear()
        first.inputs.clear()
        if combined == list(range(len(combined))):
            bypass(graph, second)
        else:
            second.attrs["perm"] = combined
        changed = True
    return changed
