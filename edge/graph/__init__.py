"""Graph cleaning with onnx-graphsurgeon: one pass per file, a manager to a fixed point, verification."""

from edge.graph.manager import CleanReport, clean_graph, count_nodes
from edge.graph.passes import DEFAULT_PASSES

__all__ = ["DEFAULT_PASSES", "CleanReport", "clean_graph", "count_nodes"]
