"""Calibration images: the shared seeded, class-balanced sampler, preprocessed as the graph takes its input.

What INT8 calibrates on (explicit Q/DQ through :mod:`calib`, and the legacy TensorRT calibrator
that ``edge build --weakly-typed`` hands to :mod:`edge.trt`), and what the fp16 range check runs.

The preprocessing (input size, per-channel mean and std) comes from the graph's metadata, which
``edge export`` writes. A graph from another exporter (torch.onnx of the user's own code, Hugging
Face exporters) records none: the user gives it (:class:`InputOptions`, ``--input-size``, ``--mean``,
``--std``), the input size can also be read from the graph's static input shape, and whatever is
still missing is named with the option that supplies it (:func:`input_spec_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from edge.errors import EdgeError, plural
from edge.graph.input_shape import Dims, check_fits, image_input, input_count, shown, with_channels
from edge.onnx_metadata import metadata_of, preprocessing, set_preprocessing

INPUT_SIZE_HELP = ("CxHxW (e.g. 3x224x224) or HxW (channels from the graph's input shape); default: what the "
                   "graph records (edge export), else its static input shape")
MEAN_HELP = ("per-channel mean of images scaled to 0..1, comma-separated (e.g. 0.485,0.456,0.406); default: what "
             "the graph records (edge export)")
STD_HELP = ("per-channel std of images scaled to 0..1, comma-separated (e.g. 0.229,0.224,0.225); default: what the "
            "graph records (edge export)")
EXAMPLES = {"--input-size": "--input-size 3x224x224", "--mean": "--mean 0.485,0.456,0.406",
            "--std": "--std 0.229,0.224,0.225"}


def _fix(flags: list[str]) -> str:
    """How to give ``flags``: an example of each, and where a model's own values are found."""
    return (f"pass {' '.join(EXAMPLES[f] for f in flags)} (ImageNet's values as an example: give your model's own; "
            "a timm model's are in model.pretrained_cfg, a Hugging Face model's in preprocessor_config.json)")


@dataclass(frozen=True)
class InputOptions:
    """The preprocessing a user states for a graph (``--input-size``, ``--mean``, ``--std``); None: not given.

    Given values take precedence over what the graph records; the graph written from it records them.
    """

    input_size: tuple[int, ...] | None = None   # (C, H, W) or (H, W)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    interpolation: str | None = None            # None: what the graph records, else bilinear

    def given(self) -> bool:
        return any(v is not None for v in (self.input_size, self.mean, self.std))


def parse_channel_values(text: str, flag: str) -> tuple[float, ...]:
    """``"0.485,0.456,0.406"`` -> a tuple of floats, for images scaled to 0..1 (timm's convention)."""
    expected = "one number or one per channel, comma-separated, for images scaled to 0..1 (e.g. 0.485,0.456,0.406)"
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError as e:
        raise EdgeError(f"{flag} {text!r}", expected=expected, fix=f"pass e.g. {flag} 0.5") from e
    if not all(np.isfinite(values)):
        raise EdgeError(f"{flag} {text!r}", expected=expected, found="a value that is not finite")
    if flag == "--std" and min(values) <= 0:
        raise EdgeError(f"{flag} {text!r}", expected=expected + ", each above 0", found="a value <= 0")
    if max(abs(v) for v in values) > 1:
        raise EdgeError(f"{flag} {text!r}", expected=expected, found="a value beyond 1: statistics of 0..255 pixels",
                        fix=f"divide by 255 (e.g. {flag} 123.675 -> {flag} 0.485)")
    return values


def _recorded(model: onnx.ModelProto) -> dict:
    try:
        return preprocessing(metadata_of(model))
    except KeyError:
        return {}


def _input_size(given: tuple[int, ...] | None, recorded: dict, dims: Dims | None,
                source: str) -> tuple[int, int, int] | None:
    """(C, H, W): given, else recorded, else the graph's static input shape; None when none says it."""
    if given is not None:
        return with_channels(given, recorded["input_size"][0] if recorded else None, dims, source)
    if recorded:
        c, h, w = recorded["input_size"]
        return int(c), int(h), int(w)
    if dims is not None and len(dims) == 4:
        c, h, w = dims[1:]
        if c and h and w:
            return c, h, w
    return None


def _check_channel_values(channels: int, source: str, **values: tuple[float, ...]) -> None:
    """Mean and std: one value, or one per channel (or three on one channel: RGB statistics, averaged)."""
    counts = sorted({1, channels, *((3,) if channels == 1 else ())})
    for flag, given in values.items():
        if len(given) not in counts:
            raise EdgeError(f"--{flag} {','.join(map(str, given))} for {source}",
                            expected=f"{' or '.join(map(str, counts))} values (the input has "
                                     f"{plural(channels, 'channel')})",
                            found=f"{len(given)} values", fix=f"pass {channels} comma-separated values")


def input_spec_of(model: onnx.ModelProto, source: str, given: InputOptions | None = None):
    """The preprocessing of the graph's input (an edge.data InputSpec): ``given`` first, then what the graph
    records (``edge export``), then (input size only) its static input shape; an EdgeError names what is missing
    and the option that supplies it."""
    from edge.data import InputSpec

    given = given or InputOptions()
    recorded = _recorded(model)
    image = image_input(model)
    if image is None and not recorded:
        raise EdgeError(f"{source} has {input_count(model)} inputs and records no preprocessing",
                        expected="one image input [N, C, H, W], or edge export's metadata",
                        fix="calibrate a graph with one image input (export the model alone, without extra inputs)")
    name, dims = image or ("", None)
    size = _input_size(given.input_size, recorded, dims, source)
    mean = given.mean or recorded.get("mean")
    std = given.std or recorded.get("std")
    missing = [flag for flag, value in (("--input-size", size), ("--mean", mean), ("--std", std)) if value is None]
    if missing or size is None or mean is None or std is None:
        raise EdgeError(f"{source} records no preprocessing (edge export's metadata), so {' and '.join(missing)} "
                        "must be given", expected="the input size and the per-channel mean and std the model was "
                                                  "trained with",
                        found=f"input {name!r} of shape {shown(dims or [])}, no edge.input_size/mean/std metadata",
                        fix=_fix(missing))
    if given.given() or not recorded:   # what edge export recorded is its own graph's (which may flatten images)
        check_fits(size, dims, name, source)
    _check_channel_values(size[0], source, mean=mean, std=std)
    interpolation = given.interpolation or recorded.get("interpolation", "bilinear")
    return InputSpec(*size, tuple(mean), tuple(std), interpolation)


def with_input_options(model: onnx.ModelProto, source: str, given: InputOptions | None,
                       images_needed: bool = False) -> None:
    """Record in ``model`` the preprocessing ``given`` states (resolved by :func:`input_spec_of`), so that every
    step after (calibration, the range check, the checks on images) and the graph written from it use it.
    ``images_needed`` (int8 calibration): refuse now, before any work, a graph whose preprocessing is unknown."""
    if given is not None and given.given():
        set_preprocessing(model, input_spec_of(model, source, given).as_dict())
    elif images_needed:
        input_spec_of(model, source)


def random_inputs(model: onnx.ModelProto, source: str, count: int, seed: int = 0) -> np.ndarray:
    """``count`` seeded standard normal inputs of the graph's static input shape: what a graph that records no
    preprocessing is checked on (no image can be normalised for it)."""
    image = image_input(model)
    if image is None:
        raise EdgeError(f"{source} has {input_count(model)} inputs and records no preprocessing",
                        expected="one input", fix="convert a graph with one image input")
    name, dims = image
    shape = [d for d in dims[1:] if d is not None]
    if len(dims) < 2 or len(shape) < len(dims) - 1:
        raise EdgeError(f"{source}: input {name!r} has shape {shown(dims)} and the graph records no preprocessing, "
                        "so no input can be made to check the converted graph on",
                        expected="a static input shape (besides the batch), or the preprocessing",
                        fix=_fix(["--input-size", "--mean", "--std"]))
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, *shape)).astype(np.float32)


def calibration_images(model: onnx.ModelProto, source: str, data: str, samples: int, seed: int = 0) -> np.ndarray:
    """``samples`` class-balanced training images (seeded) as the float32 array the graph takes."""
    from edge.data import calibration_set

    spec = input_spec_of(model, source)
    images = calibration_set(data, samples, seed, split="train")
    return images.inputs(spec).numpy().astype(np.float32)


def has_preprocessing(model: onnx.ModelProto) -> bool:
    """Whether the graph records the preprocessing calibration images need (``edge export`` writes it, and
    :func:`with_input_options` from the user's options)."""
    return bool(_recorded(model))
