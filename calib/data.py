"""Calibration inputs for ONNX Runtime's quantizer: a reader over an array of images the caller hands in."""

from __future__ import annotations

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader


def graph_batch(model: onnx.ModelProto) -> int | None:
    """The static batch of the graph's first input, or None when it is symbolic."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None


class ArrayCalibrationReader(CalibrationDataReader):
    """Feeds ONNX Runtime's calibrator batches of a fixed array (static batch graphs get their batch; with
    ``partial``, for a dynamic batch, the last batch holds what is left, so no image is dropped)."""

    def __init__(self, images: np.ndarray, input_name: str, batch: int, partial: bool = False) -> None:
        self.images = images
        self.input_name = input_name
        self.batch = max(1, batch)
        self.partial = partial
        self.start, self.end = 0, len(images)
        self.position = 0

    def get_next(self) -> dict | None:
        begin = self.start + self.position
        if begin >= self.end or (begin + self.batch > self.end and not self.partial):
            return None
        stop = min(begin + self.batch, self.end)
        self.position = stop - self.start
        return {self.input_name: self.images[begin:stop]}

    def __len__(self) -> int:
        whole, rest = divmod(self.end - self.start, self.batch)
        return whole + (1 if rest and self.partial else 0)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.start, self.end = start_index * self.batch, min(end_index * self.batch, len(self.images))
        self.position = 0

    def rewind(self) -> None:
        self.start, self.end, self.position = 0, len(self.images), 0
