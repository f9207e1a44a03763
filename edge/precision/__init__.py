"""Precision: the float16 and int8 variants of a float32 ONNX graph (``edge quantize``).

* :mod:`edge.precision.fp16`: the float16 pass with float32 islands;
* :mod:`edge.precision.int8`: edge's INT8 options, calibration images and cache around
  :mod:`calib.qdq` (explicit Q/DQ with ONNX Runtime's quantizer; calib imports nothing of edge);
* :mod:`edge.precision.calibration`: the calibration images (the shared seeded, class-balanced
  sampler), also what ``edge build --weakly-typed`` hands TensorRT's legacy calibrator
  (:mod:`edge.trt.calibrator`, which needs TensorRT and CUDA and so lives with the builder);
* :mod:`edge.precision.quantize`: ``edge quantize``, one of them run, checked and written.

Precision works on graphs, never on torch models: it imports nothing of :mod:`edge.compress`.
"""
