"""INT8 for TensorRT: calibration data, explicit (Q/DQ) quantization (the legacy calibrator: edge.trt.calibrator)."""
