"""Fold every subgraph whose inputs are all constants into constants (onnx-graphsurgeon + ONNX Runtime).

Shapes are inferred first, so ``Shape`` of a tensor with a static shape is a constant too: the
exporter's shape arithmetic (Shape -> Slice -> Concat -> Reshape) folds into one Reshape target.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from edge.compare import ort_messages
from edge.graph.graph_pass import InPlacePass
from edge.graph.util import infer_shapes


def run(graph: gs.Graph) -> bool:
    before = sum(1 for n in graph.nodes if n.op != "Constant")
    infer_shapes(graph)
    with ort_messages():  # folding runs ONNX Runtime sessions on ONNX Runtime's default logger
        graph.fold_constants(fold_shapes=True, error_ok=True).cleanup()
    return sum(1 for n in graph.nodes if n.op != "Constant") < before


PASS = InPlacePass("fold-constants", "fold constant subgraphs, static Shape arithmetic included", run)
