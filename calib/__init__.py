"""INT8 for TensorRT: calibration data, explicit (Q/DQ) quantization, the legacy TensorRT calibrator."""
