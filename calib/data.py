"""Calibration inputs: the shared seeded, class-balanced sampler, preprocessed as the graph's metadata says."""

from __future__ import annotations

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader

from edge.errors import EdgeError
from edge.onnx_metadata import metadata_of, preprocessing


def input_spec_of(model: onnx.ModelProto, source: str):
    """The preprocessing ``edge export`` recorded in the graph (input size, mean, std)."""
    from edge.data import InputSpec

    try:
        config = preprocessing(metadata_of(model))
    except KeyError as e:
        raise EdgeError(f"{source} has no edge preprocessing metadata ({e.args[0]} missing)",
                        expected="an ONNX graph written by `edge export` (it records input size, mean and std)",
                        fix="export the model with `edge export`, then quantize that file") from e
    return InputSpec(*config["input_size"], config["mean"], config["std"], config["interpolation"])


def calibration_images(model: onnx.ModelProto, source: str, data: str, samples: int, seed: int = 0) -> np.ndarray:
    """``samples`` class-balanced training images (seeded) as the float32 array the graph takes."""
    from edge.data import ArrayPreprocess, calibration_set

    spec = input_spec_of(model, source)
    images = calibration_set(data, samples, seed, split="train")
    return ArrayPreprocess(spec)(images.images).numpy().astype(np.float32)


def graph_batch(model: onnx.ModelProto) -> int | None:
    """The static batch of the graph's first input, or None when it is symbolic."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None


class ArrayCalibrationReader(CalibrationDataReader):
    """Feeds ONNX Runtime's calibrator batches of a fixed array (static batch graphs get their batch)."""

    def __init__(self, images: np.ndarray, input_name: str, batch: int) -> None:
        self.images = images
        self.input_name = input_name
        self.batch = batch
        self.start, self.end = 0, len(images)
        self.position = 0

    def get_next(self) -> dict | None:
        begin = self.start + self.position
        if begin + self.batch > self.end:
            return None
        self.position += self.batch
        return {self.input_name: self.images[begin:begin + self.batch]}

    def __len__(self) -> int:
        return (self.end - self.start) // self.batch

    def set_range(self, start_index: int, end_index: int) -> None:
        self.start, self.end = start_index * self.batch, min(end_index * self.batch, len(self.images))
        self.position = 0

    def rewind(self) -> None:
        self.start, self.end, self.position = 0, len(self.images), 0
