"""Compression: plans, one module per method, the planner, and restorable artifacts."""

from edge.compress.artifact import is_artifact, load_artifact, save_artifact
from edge.compress.compressor import CompressConfig, compress
from edge.compress.plan import Plan, SpanStep, parse_plan

__all__ = ["CompressConfig", "Plan", "SpanStep", "compress", "is_artifact", "load_artifact", "parse_plan",
           "save_artifact"]
