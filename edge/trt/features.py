"""Finding TensorRT, and what the installed version can do: the detection is :mod:`jetson.features`
(shared with the device runner); this module says what is missing in edge's own terms (EdgeError)."""

from __future__ import annotations

from types import ModuleType

from edge.errors import EdgeError
from jetson.errors import JetsonError
from jetson.features import (
    INSTALL_HINT,
    PRECISION_FLAGS,
    TensorRTFeatures,
    detect_features,
    has_python_plugins,
    parse_version,
)
from jetson.features import load_tensorrt as _load_tensorrt

__all__ = ["INSTALL_HINT", "PRECISION_FLAGS", "TensorRTFeatures", "detect_features", "has_python_plugins",
           "load_tensorrt", "parse_version"]


def load_tensorrt() -> ModuleType:
    """The ``tensorrt`` module, or an EdgeError saying it was not found and how to install it."""
    try:
        return _load_tensorrt()
    except JetsonError as e:
        raise EdgeError(e.what, expected=e.expected, found=e.found, fix=e.fix) from e
