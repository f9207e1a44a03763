"""Fold every subgraph whose inputs are all constants into constants (onnx-graphsurgeon + ONNX Runtime)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

name = "fold-constants"


def run(graph: gs.Graph) -> bool:
    before = sum(1 for n in graph.nodes if n.op != "Constant")
    graph.fold_constants(error_ok=True).cleanup()
    return sum(1 for n in graph.nodes if n.op != "Constant") < before
