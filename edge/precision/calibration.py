"""Calibration images: the shared seeded, class-balanced sampler, preprocessed as the graph's metadata says.

What INT8 calibrates on (explicit Q/DQ through :mod:`calib`, and the legacy TensorRT calibrator
that ``edge build --weakly-typed`` hands to :mod:`edge.trt`).
"""

from __future__ import annotations

import numpy as np
import onnx

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


def has_preprocessing(model: onnx.ModelProto) -> bool:
    """Whether the graph records the preprocessing calibration images need (``edge export`` writes it)."""
    try:
        preprocessing(metadata_of(model))
    except KeyError:
        return False
    return True
