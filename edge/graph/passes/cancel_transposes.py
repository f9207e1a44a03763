"""Transpose followed by Transpose becomes one Transpose, or nothing when the two are inverse."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from edge.graph.graph_pass import InPlacePass
from edge.graph.util import bypass, detach, same_op_pairs


def run(graph: gs.Graph) -> bool:
    changed = False
    for first, second in same_op_pairs(graph, "Transpose"):
        p1, p2 = first.attrs.get("perm"), second.attrs.get("perm")
        if p1 is None or p2 is None:
            continue
        combined = [p1[i] for i in p2]
        second.inputs[0] = first.inputs[0]
        detach(first)
        if combined == list(range(len(combined))):
            bypass(graph, second)
        else:
            second.attrs["perm"] = combined
        changed = True
    return changed


PASS = InPlacePass("cancel-transposes", "merge Transpose pairs; drop a pair that cancels", run)
