"""Fold every subgraph whose inputs are all constants into constants (onnx-graphsurgeon + ONNX Runtime).

Shapes are inferred first, so ``Shape`` of a tensor with a static shape is a constant too: the
exporter's shape arithmetic (Shape -> Slice -> Concat -> Reshape) folds into one Reshape target.

A folded tensor may not be larger than the largest weight the graph holds (and at least 1 MiB):
folding a weight's Transpose is a gain, folding ConstantOfShape into a 400 MB filler (as the
onnx package's "light" model zoo graphs hold) only bloats the file. Passing the threshold also
keeps onnx-graphsurgeon's "you may want to set a constant-folding size threshold" note, which
is advice to a caller of its API, off the user's terminal.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from edge.check.compare import ort_messages
from edge.graph.graph_pass import InPlacePass
from edge.graph.util import infer_shapes

MIN_SIZE_THRESHOLD = 1 << 20  # bytes; onnx-graphsurgeon's own limit for its note


def size_threshold(graph: gs.Graph) -> int:
    """The largest tensor folding may create, in bytes: the largest weight, at least 1 MiB."""
    weights = (t.values.nbytes for t in graph.tensors().values() if isinstance(t, gs.Constant))
    return max(MIN_SIZE_THRESHOLD, max(weights, default=0))


# onnx-graphsurgeon cannot hold a sequence as a constant: folding SequenceEmpty (no inputs) fails
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase",
                          "SplitToSequence"})


def run(graph: gs.Graph) -> bool:
    if any(n.op in SEQUENCE_OPS for n in graph.nodes):
        return False
    before = sum(1 for n in graph.nodes if n.op != "Constant")
    infer_shapes(graph)
    with ort_messages():  # folding runs ONNX Runtime sessions on ONNX Runtime's default logger
        graph.fold_constants(fold_shapes=True, error_ok=True, size_threshold=size_threshold(graph)).cleanup()
    return sum(1 for n in graph.nodes if n.op != "Constant") < before


PASS = InPlacePass("fold-constants", "fold constant subgraphs, static Shape arithmetic included", run)
