"""The ``edge.*`` entries of an ONNX graph's ``metadata_props``: what they are, writing them, reading them.

``edge export`` records where a graph came from and the preprocessing it expects; the
precision passes add what they did. Every reader and writer of these keys goes through here.
Pure ONNX: imports nothing of torch.
"""

from __future__ import annotations

import json

import onnx

from edge import __version__

VERSION = "edge.version"
SOURCE_MODEL = "edge.source_model"
PLAN = "edge.plan"
INPUT_SIZE = "edge.input_size"          # JSON [C, H, W]
MEAN = "edge.mean"                      # JSON per-channel list
STD = "edge.std"                        # JSON per-channel list
INTERPOLATION = "edge.interpolation"
PRECISION = "edge.precision"            # float16 or int8; absent: float32
FP32_OPS = "edge.fp32_ops"              # fp16 graphs, int8 graphs with a float16 rest: ops kept float32 (a,b,...)
SOFTMAX = "edge.softmax"                # fp16 graphs, int8 graphs with a float16 rest: float16 or float32
FP16_RANGE_CHECK = "edge.fp16_range_check"  # fp16 graphs: JSON, what the range check measured and kept float32
CALIBRATION = "edge.calibration"        # int8 graphs: JSON data, samples, seed, method
FLOAT_PRECISION = "edge.float_precision"  # int8 graphs: the precision of everything not quantized
QDQ_PLACEMENT = "edge.qdq_placement"    # int8 graphs: where the Q/DQ pairs sit (calib.placement.PLACEMENTS)
ACCURACY_GATE = "edge.accuracy_gate"    # fp16 and int8 graphs: JSON, edge quantize's gate figures (edge.precision.gate)


def graph_metadata(source: str, plan: str | None, data_config: dict) -> dict[str, str]:
    """The entries ``edge export`` writes: source model, plan, edge version and the preprocessing."""
    return {VERSION: __version__, SOURCE_MODEL: source, PLAN: plan or "", **preprocessing_entries(data_config)}


def preprocessing_entries(data_config: dict) -> dict[str, str]:
    """The preprocessing entries of a data config: input size, mean, std, interpolation."""
    c, h, w = data_config["input_size"]
    return {
        INPUT_SIZE: json.dumps([int(c), int(h), int(w)]),
        MEAN: json.dumps([float(m) for m in data_config["mean"]]),
        STD: json.dumps([float(s) for s in data_config["std"]]),
        INTERPOLATION: str(data_config.get("interpolation", "bilinear")),
    }


def with_metadata(model_bytes: bytes, metadata: dict[str, str]) -> onnx.ModelProto:
    """The graph of ``model_bytes`` with exactly ``metadata`` (sorted by key), produced by edge."""
    proto = onnx.load_from_string(model_bytes)
    del proto.metadata_props[:]
    for key, value in sorted(metadata.items()):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name, proto.producer_version = "edge", __version__
    return proto


def metadata_of(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def preprocessing(metadata: dict[str, str]) -> dict:
    """The data config recorded by ``edge export``: input size, mean, std, interpolation (crop 1.0).

    Raises ``KeyError`` with the first missing key: the caller says which file lacks it.
    """
    return {"input_size": tuple(json.loads(metadata[INPUT_SIZE])),
            "mean": tuple(json.loads(metadata[MEAN])),
            "std": tuple(json.loads(metadata[STD])),
            "interpolation": metadata.get(INTERPOLATION, "bilinear"), "crop_pct": 1.0}


def precision_of(metadata: dict[str, str]) -> str:
    return metadata.get(PRECISION, "float32")


def source_precision(model: onnx.ModelProto) -> str:
    return precision_of(metadata_of(model))


def set_precision_metadata(model: onnx.ModelProto, precision: str, **extra: str) -> None:
    set_entries(model, {PRECISION: precision, **extra})


def set_preprocessing(model: onnx.ModelProto, data_config: dict) -> None:
    """Record the preprocessing of ``data_config`` in ``model`` (a graph from another exporter, given by the user)."""
    set_entries(model, preprocessing_entries(data_config))


def set_entries(model: onnx.ModelProto, new: dict[str, str]) -> None:
    """``model``'s metadata with ``new`` added or replaced, sorted by key."""
    entries = {**metadata_of(model), **new}
    del model.metadata_props[:]
    for key, value in sorted(entries.items()):
        model.metadata_props.add(key=key, value=value)
