"""Device-side code that runs on the Jetson itself: tegrastats parsing and sampling, energy per
inference, power mode and clock control.

It runs with the system Python of a stock JetPack 6 (3.10) and imports nothing but the standard
library and numpy, because it is copied into bundles and run where edge, torch and onnx are absent
(tests/jetson/test_imports.py holds it to that). It never imports ``edge`` or ``calib``.
"""
