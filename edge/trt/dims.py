"""TensorRT ``Dims`` as plain Python values, shared by the builder and the TensorRT profiler backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorrt


def dims_list(dims: tensorrt.Dims) -> list[int]:
    """A TensorRT ``Dims`` as a list (the bindings index it; the stubs give it no ``__iter__``)."""
    return [int(dims[i]) for i in range(len(dims))]
