"""TensorRT ``Dims`` as plain Python values, shared by the builder, the TensorRT profiler backend and
the device runner (:mod:`jetson.features`)."""

from jetson.features import dims_list

__all__ = ["dims_list"]
