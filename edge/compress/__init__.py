"""Compression: plans, one folder per method (edge/compress/methods/, found through a registry), and restorable
artifacts."""

from edge.compress import methods  # noqa: F401  (registers the built-in methods first)
from edge.compress.artifact import is_artifact, load_artifact, save_artifact
from edge.compress.compressor import CompressConfig, compress
from edge.compress.method import Method
from edge.compress.plan import Plan, parse_plan
from edge.compress.registry import register_method

__all__ = ["CompressConfig", "Method", "Plan", "compress", "is_artifact", "load_artifact", "parse_plan",
           "register_method", "save_artifact"]
