"""Latency tables measured on the target, predictions from them, and an Orin Nano estimator.

A model is a sum of parts (:mod:`edge.latency.parts`: patch embedding, per block an attention-like
sub-layer and an MLP, span maps, head). A latency table (:mod:`edge.latency.table`) holds each part's
latency measured on one target: ONNX Runtime here (:mod:`edge.latency.measure`, every part exported
once as a single-part graph and timed side by side), or TensorRT / ONNX Runtime on a device through
the bundle and device runner (:mod:`edge.latency.device_table`). :func:`predict_model` sums a model's
parts from a table measured on the target asked for (a table from another target is refused).
Without a device table, :mod:`edge.latency.orin` estimates an Orin Nano's latency per part with a
roofline per power mode, calibrated on published figures.

Layering: above ``edge.bundle`` and ``edge.deploy`` (the device path uses them) and the verbs it
times with (``edge.profile``, ``edge.export``); it never imports ``edge.compress`` (parts are read
from module shapes), so the planner above both can use it.
"""

from edge.latency.parts import Part, model_parts
from edge.latency.predict import Prediction, predict_model, predict_parts
from edge.latency.table import LatencyTable, Target

__all__ = ["LatencyTable", "Part", "Prediction", "Target", "model_parts", "predict_model", "predict_parts"]
