"""INT8 for TensorRT: explicit (Q/DQ) quantization with ONNX Runtime's quantizer, its placement of
the Q/DQ pairs, and the reader that feeds it calibration images.

calib stands alone like ``jetson/``: it imports onnx, onnxruntime, numpy and the standard library,
never ``edge`` (an import contract holds it to that). Which images it calibrates on and how they
are preprocessed is the caller's business: :mod:`edge.precision.int8` hands them in. The legacy
TensorRT calibrator needs TensorRT and CUDA, so it lives with the builder (``edge.trt.calibrator``).
"""
