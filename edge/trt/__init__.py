"""TensorRT engines: feature detection, the builder, the legacy INT8 calibrator, manifests, the trtexec command.

Nothing here imports TensorRT at module level: ``import edge.trt`` works without it, and
``build_engine`` says what to install when it is missing.
"""

from edge.trt.builder import DEFAULT_WORKSPACE_MIB, PRECISIONS, BuildConfig, CalibrationImages, build_engine
from edge.trt.features import TensorRTFeatures, detect_features, load_tensorrt
from edge.trt.manifest import check_compatible, read_manifest

__all__ = ["DEFAULT_WORKSPACE_MIB", "PRECISIONS", "BuildConfig", "CalibrationImages", "TensorRTFeatures",
           "build_engine", "check_compatible", "detect_features", "load_tensorrt", "read_manifest"]
