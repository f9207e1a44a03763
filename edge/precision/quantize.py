"""``edge quantize``: the fp16 or int8 (Q/DQ) variant of a float32 ONNX graph, checked before it is written.

The float16 conversion is :mod:`edge.precision.fp16`, the int8 quantization :mod:`edge.precision.int8`
(over :mod:`calib.qdq`); this front door
loads the graph, runs one of them, records the precision in the graph's metadata, checks the
result (``onnx.checker`` and the outputs on real images) and writes it atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from edge.errors import EdgeError
from edge.fileio import write_atomic
from edge.onnx_metadata import (ACCURACY_GATE, FLOAT_PRECISION, FP16_RANGE_CHECK, FP32_OPS, SOFTMAX,
                                set_precision_metadata, source_precision)
from edge.precision.calibration import InputOptions, with_input_options
from edge.precision.fp16 import Fp16Config, convert_to_fp16, head_nodes, name_nodes
from edge.precision.fp16_ranges import RangeCheck
from edge.precision.gate import GATE_IMAGES, GateConfig, gate_record, judge, run_graph


def load_onnx(path: str | Path) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise EdgeError(f"{path} does not exist", expected="an ONNX file", fix="check the path, or run `edge export`")
    try:
        return onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - onnx raises several types for a bad file
        raise EdgeError(f"{path} is not a readable ONNX model", found=str(e)[:300],
                        fix="pass a file written by `edge export`") from e


PRECISIONS = ("fp16", "int8")

# the float32 graphs' outputs on the gate's images, by (graph content, images): the fp16 and the int8 graph of one
# source (as `edge pipeline` makes them) are judged against one run of it
_REFERENCE_OUTPUTS: OrderedDict[tuple[str, str], dict[str, np.ndarray]] = OrderedDict()
REFERENCES_KEPT = 2


def reference_outputs(model: onnx.ModelProto, graph_digest: str, inputs: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`~edge.precision.gate.run_graph` of the float32 graph ``model`` (as loaded, before any change: its
    serialisation's sha256 is ``graph_digest``) on ``inputs``; the last :data:`REFERENCES_KEPT` results are kept
    (read-only) and reused."""
    key = (graph_digest, hashlib.sha256(inputs.tobytes()).hexdigest() + str(inputs.shape) + str(inputs.dtype))
    if key in _REFERENCE_OUTPUTS:
        _REFERENCE_OUTPUTS.move_to_end(key)
        return _REFERENCE_OUTPUTS[key]
    outputs = run_graph(model, inputs)
    for value in outputs.values():
        value.setflags(write=False)
    _REFERENCE_OUTPUTS[key] = outputs
    while len(_REFERENCE_OUTPUTS) > REFERENCES_KEPT:
        _REFERENCE_OUTPUTS.popitem(last=False)
    return outputs


def _check_images(model: onnx.ModelProto, source: str, data: str, count: int = GATE_IMAGES) \
        -> tuple[np.ndarray, int | None, str]:
    """``count`` test images (or one static batch of the graph when that is larger), the class count, the name;
    a graph that records no preprocessing: seeded random inputs, no class count, ``random inputs``."""
    from calib.data import graph_batch
    from edge.data import load_dataset
    from edge.precision.calibration import has_preprocessing, input_spec_of, random_inputs

    count = max(count, graph_batch(model) or 0)
    if not has_preprocessing(model):
        return random_inputs(model, source, count), None, "random inputs"
    spec = input_spec_of(model, source)
    dataset = load_dataset(data, "test")
    images = dataset.inputs(spec, count).numpy().astype(np.float32)
    return images, dataset.num_classes, dataset.name


def fp16_metadata(config: Fp16Config) -> dict[str, str]:
    """What a float16 conversion records: the ops kept in float32 and Softmax's precision."""
    return {FP32_OPS: ",".join(config.fp32_ops()), SOFTMAX: config.softmax_precision()}


def fp32_by_config(model: onnx.ModelProto, config: Fp16Config) -> set[str]:
    """The nodes ``config`` keeps float32 without any range check: by op type, by name, the head."""
    head = head_nodes(model.graph) if config.keep_head_fp32 else set()
    ops = set(config.fp32_ops())
    return {n.name for n in model.graph.node if n.op_type in ops} | set(config.node_block_list) | head


def range_checked(model: onnx.ModelProto, source: str, config: Fp16Config, ranges: RangeCheck | None,
                  progress=None) -> tuple[Fp16Config, dict]:
    """``config`` with the nodes whose float32 ranges leave float16's added to its node block list,
    and what the check did; without images (``ranges`` None, or a graph without preprocessing metadata,
    edge export's or the user's input options') the config as it is, and why no range check was done.
    ``model``'s nodes must be named (:func:`edge.precision.fp16.name_nodes`)."""
    from edge.precision.calibration import calibration_images, has_preprocessing
    from edge.precision.fp16_ranges import nodes_beyond_fp16, record_ranges

    if ranges is None:
        return config, {"done": False, "reason": "not asked (--no-range-check, or no RangeCheck given): op types "
                                                 "and the head only"}
    ranges.check()
    if not has_preprocessing(model):
        return config, {"done": False, "reason": f"{source} records no input size, mean and std (edge export's "
                                                 "metadata) and none were given (--input-size, --mean, --std), so "
                                                 "no calibration images: op types and the head only"}
    if progress:
        progress(f"recording float32 ranges on {ranges.samples} samples of {ranges.data}")
    images = calibration_images(model, source, ranges.data, ranges.samples, ranges.seed)
    recorded = record_ranges(model, images)
    kept = nodes_beyond_fp16(model, recorded, ranges.margin)
    already = fp32_by_config(model, config)
    added = tuple(k.node for k in kept if k.node not in already)
    largest = max(recorded, key=recorded.get)
    return replace(config, node_block_list=(*config.node_block_list, *added)), {
        "done": True, "data": ranges.data, "samples": int(len(images)), "seed": ranges.seed,
        "margin": ranges.margin, "largest": {"tensor": largest, "max_abs": recorded[largest]},
        "kept": [{**k.as_dict(), "kept_anyway": k.node in already} for k in kept], "added": len(added)}


def range_record(check: dict) -> dict:
    """What the graph records of its range check: the images, the margin and the nodes it kept float32."""
    if not check["done"]:
        return {"done": False, "reason": check["reason"]}
    return {"done": True, **{k: check[k] for k in ("data", "samples", "seed", "margin")},
            "kept": [k["node"] for k in check["kept"]]}


def _int8_float_rest(quantized: onnx.ModelProto, result: dict, fp16: Fp16Config) -> tuple[onnx.ModelProto, dict]:
    """The unquantized part of an int8 graph in the precision its config asks (float16: the fp16 pass)."""
    precision = result["config"]["float_precision"]
    extra = {FLOAT_PRECISION: precision}
    if precision == "float16":
        quantized, report = convert_to_fp16(quantized, fp16)
        result["float16_rest"] = {k: v for k, v in report.as_dict().items() if k != "fp32_nodes"}
        extra.update(fp16_metadata(fp16))
    set_precision_metadata(quantized, "int8", **extra)
    result["float_precision"] = precision
    return quantized, result


def _resolve_data(model: onnx.ModelProto, model_path: str | Path, precision: str, int8, ranges: RangeCheck | None,
                  check_data: str | None):
    """The images each step reads, before any work: calibration (int8) and the range check (fp16) take ``--data``,
    the gate ``--gate-data``, else ``--data``'s test split; without them, a graph of a bundled model takes that
    model's data set, and any other graph is refused naming the flag. A graph that records no preprocessing needs no
    images for the range check or the gate (random inputs; int8 refuses it earlier)."""
    from edge.models import data_for
    from edge.precision.calibration import has_preprocessing
    from edge.precision.int8 import Int8Config

    if precision == "int8":
        int8 = int8 or Int8Config()
        int8 = replace(int8, data=data_for(int8.data, model_path))
    if not has_preprocessing(model):
        return int8, ranges, check_data or "random inputs"
    if precision == "fp16" and ranges is not None:
        ranges = replace(ranges, data=data_for(ranges.data, model_path, fix_also="or --no-range-check"))
    given = (int8.data if precision == "int8" else ranges.data if ranges is not None else None)
    return int8, ranges, check_data or given or data_for(None, model_path, "--gate-data", check=True)


def quantize_file(model_path: str | Path, out: str | Path, precision: str, *, fp16: Fp16Config | None = None,
                  int8=None, ranges: RangeCheck | None = None, check_data: str | None = None,
                  input_options: InputOptions | None = None, gate: GateConfig | None = None,
                  progress=None) -> dict:
    """``edge quantize``: write the fp16 or int8 (Q/DQ) variant of a float32 ONNX graph, checked first.

    ``ranges``: fp16 only, where the calibration images for the range check come from (None: no
    range check, float32 islands by op type and head only, as before the check existed).
    ``input_options``: the preprocessing the user gives (a graph from another exporter records none); it is
    recorded in the written graph and used for calibration, the range check and the check on images.
    ``gate``: the accuracy gate on ``check_data``'s test images (None: the test split of the calibration data,
    else of the bundled model's check set; :mod:`edge.precision.gate`; ``gate`` None: its defaults); below its
    thresholds nothing is written (:class:`~edge.precision.gate.AccuracyLoss`) unless ``gate.accept_loss``. The result's ``check`` holds its figures, the graph records them.
    """
    if precision not in PRECISIONS:
        raise EdgeError(f"--precision {precision!r}", expected=f"one of {', '.join(PRECISIONS)}")
    out = Path(out)
    model = load_onnx(model_path)
    if source_precision(model) != "float32":
        raise EdgeError(f"{model_path} is already {source_precision(model)}", expected="a float32 graph",
                        fix="convert the float32 export from `edge export` / `edge clean`")
    # the float32 outputs' key (the gate): the graph as loaded, external weights included
    digest = hashlib.sha256(model.SerializeToString()).hexdigest()
    with_input_options(model, str(model_path), input_options, images_needed=precision == "int8")
    int8, ranges, check_data = _resolve_data(model, model_path, precision, int8, ranges, check_data)
    if precision == "fp16":
        name_nodes(model.graph)
        fp16, range_check = range_checked(model, str(model_path), fp16 or Fp16Config(), ranges, progress)
        converted, report = convert_to_fp16(model, fp16)
        set_precision_metadata(converted, "float16", **fp16_metadata(fp16),
                               **{FP16_RANGE_CHECK: json.dumps(range_record(range_check), sort_keys=True)})
        result = {"precision": "float16", "softmax": fp16.softmax_precision(), **report.as_dict(),
                  "range_check": range_check}
    else:
        from edge.precision.int8 import quantize_int8

        # ONNX Runtime's histogram calibrators (entropy, percentile) print their progress: to stderr, so
        # that stdout holds only what the caller prints (`--json`: one JSON document)
        with contextlib.redirect_stdout(sys.stderr):
            converted, result = quantize_int8(model, str(model_path), int8, progress=progress,
                                              head=frozenset(head_nodes(model.graph)))
        converted, result = _int8_float_rest(converted, result, fp16 or Fp16Config())
    try:
        onnx.checker.check_model(converted, full_check=True)
    except onnx.checker.ValidationError as e:
        raise EdgeError(f"the {precision} graph of {model_path} fails onnx.checker", found=str(e)[:500],
                        fix="nothing was written; report this graph as a bug") from e
    gate = gate or GateConfig()
    inputs, classes, data_name = _check_images(model, str(model_path), check_data, gate.images)
    # per-node errors against the float graph the Q/DQ pairs were placed in (SmoothQuant rescales LayerNorm outputs)
    smoothed = result.pop("smoothed_float_graph", None)
    result["check"] = judge(model, converted, precision, inputs, classes, data_name, str(model_path), gate,
                            node_reference=smoothed, reference_outputs=reference_outputs(model, digest, inputs))
    if not result["check"]["finite"]:
        raise EdgeError(f"the {precision} graph of {model_path} gives non-finite outputs on real images",
                        fix="nothing was written; keep more ops in float32 (--keep-fp32 OP)")
    set_precision_metadata(converted, source_precision(converted), **{ACCURACY_GATE: gate_record(result["check"])})
    data = converted.SerializeToString()
    write_atomic(data, out)
    result.update({"source": str(model_path), "out": str(out), "bytes": len(data), "nodes": len(converted.graph.node)})
    return result
