"""Graph cleaning with onnx-graphsurgeon: one pass per file, a manager to a fixed point, verification."""

from edge.graph.graph_pass import GraphPass, InPlacePass, PassResult
from edge.graph.manager import CleanReport, clean_graph, count_nodes
from edge.graph.passes import DEFAULT_PASSES, PASSES
from edge.graph.registry import PassRegistry

__all__ = ["DEFAULT_PASSES", "PASSES", "CleanReport", "GraphPass", "InPlacePass", "PassRegistry", "PassResult",
           "clean_graph", "count_nodes"]
