"""Explicit INT8 quantization (Q/DQ) with ONNX Runtime's static quantizer, configured for TensorRT.

ONNX Runtime calibrates and inserts the Q/DQ pairs; the configuration is TensorRT's:

* ``QuantFormat.QDQ``, ``QuantType.QInt8`` for activations and weights, ``ActivationSymmetric``
  and ``WeightSymmetric`` (every zero point 0: TensorRT only takes symmetric int8);
* ``per_channel=True`` (weights per output channel; activations stay per tensor);
* only the nodes of the placement (:mod:`calib.placement`: for ``linear`` the weight GEMMs; for
  ``modelopt`` and ``skip`` MatMul, Gemm, Conv, the residual Adds, and for ``modelopt`` the
  LayerNorms' inputs) are quantized; ``linear-sq`` first folds SmoothQuant into the float graph
  (:mod:`calib.smoothquant`, its per-channel activation maxima measured on the same images and
  cached beside the ranges); their outputs are not
  (``OpTypesToExcludeOutputQuantization``), biases stay float (``QuantizeBias=False``: TensorRT
  folds float biases itself), ``QDQKeepRemovableActivations`` so nothing is folded away;
* after ONNX Runtime's pass :func:`calib.placement.restrict_to_placement` hands every input the
  placement leaves float (Softmax, the other Add input, a LayerNorm's scale) its float tensor.

A strongly typed TensorRT network takes every tensor's type from the graph, so what is not
quantized (LayerNorm, Softmax, GELU, the Adds, every GEMM output) runs in the precision the graph
gives it: with ``float_precision="float16"`` (the default, as ModelOpt's) the graph is raised to
opset 19 (float16 Q/DQ scales) and the caller converts the rest (edge: its fp16 pass, in
:mod:`edge.precision.quantize`), giving TensorRT INT8+FP16; ``"float32"`` keeps INT8+FP32.

ONNX Runtime's quantizer logs advice to run its pre-processing (symbolic shape inference and
graph optimisation) on every graph that lacks its tag; the graphs here come from ``edge export``
/ ``edge clean`` with static shapes, so the advice goes into the report (``onnxruntime_log``),
not onto the terminal.

The calibration images are handed in (:class:`Calibration`: edge passes its seeded,
class-balanced sampler, :mod:`edge.precision.int8`); the tensor ranges are cached (ONNX Runtime's
JSON calibration cache) under a key of the graph's sha256, what identifies the images (edge: data,
samples, seed), the method and options, so a second run with the same inputs skips calibration.
This module imports nothing of edge: bad input raises :class:`calib.errors.CalibError`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from calib.data import ArrayCalibrationReader, graph_batch
from calib.errors import CalibError
from calib.placement import GEMM_OPS, PLACEMENTS, placement_plan, qdq_violations, restrict_to_placement
from calib.smoothquant import DEFAULT_ALPHA

METHODS = ("minmax", "entropy", "percentile")
FLOAT_PRECISIONS = ("float16", "float32")
CALIBRATION_BATCH = 32
#: float16 Q/DQ scales (DequantizeLinear's output type follows its scale) exist from opset 19
FP16_QDQ_OPSET = 19


@dataclass(frozen=True)
class QdqConfig:
    """How a graph is quantized; which images calibrate it is :class:`Calibration`'s."""

    method: str = "minmax"          # minmax | entropy | percentile
    percentile: float = 99.999      # percentile method: the share of |x| kept
    entropy_bins: int = 2048        # entropy and percentile methods: histogram bins
    quantize_residual: bool = True  # Q/DQ on an input of residual Adds (which one: placement)
    placement: str = "linear-sq"    # linear-sq | linear | modelopt | skip (calib.placement)
    smoothquant_alpha: float = DEFAULT_ALPHA  # linear-sq: SmoothQuant's migration strength
    float_precision: str = "float16"  # what is not quantized: float16 (INT8+FP16) or float32 (INT8+FP32)
    exclude_nodes: tuple[str, ...] = ()

    def check(self) -> None:
        if self.method not in METHODS:
            raise CalibError(f"calibration method {self.method!r} is unknown", expected=f"one of {', '.join(METHODS)}")
        if not 0 < self.percentile <= 100:
            raise CalibError(f"percentile {self.percentile} is out of range", expected="0 < percentile <= 100")
        if not 0 <= self.smoothquant_alpha <= 1:
            raise CalibError(f"SmoothQuant alpha {self.smoothquant_alpha} is out of range", expected="0 <= alpha <= 1")
        if self.placement not in PLACEMENTS:
            raise CalibError(f"Q/DQ placement {self.placement!r} is unknown",
                             expected=f"one of {', '.join(PLACEMENTS)}")
        if self.float_precision not in FLOAT_PRECISIONS:
            raise CalibError(f"float precision {self.float_precision!r} is unknown",
                             expected=f"one of {', '.join(FLOAT_PRECISIONS)}")


@dataclass(frozen=True)
class Calibration:
    """The calibration images, handed in by the caller, and where the tensor ranges they give are cached."""

    images: Callable[[], np.ndarray]  # float32, as the graph takes them; called only when the cache misses
    identity: dict = field(default_factory=dict)  # what the images are (edge: data, samples, seed): in the cache key
    cache_dir: Path | None = None     # None: no cache


def _ort_method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


def _extra_options(config: QdqConfig) -> dict:
    options = {
        "ActivationSymmetric": True,
        "WeightSymmetric": True,
        "QuantizeBias": False,
        "OpTypesToExcludeOutputQuantization": [*GEMM_OPS, "Add", "LayerNormalization"],
        "QDQKeepRemovableActivations": True,
        "AddQDQPairToWeight": False,
    }
    if config.method in ("entropy", "percentile"):
        options["CalibNumBins"] = config.entropy_bins
    if config.method == "percentile":
        options["CalibPercentile"] = config.percentile
    return options


def cache_key(model_bytes: bytes, config: QdqConfig, identity: dict) -> str:
    """The calibration cache's key: the graph's sha256, the images' ``identity``, the method and options."""
    import onnxruntime

    fields = {"onnx_sha256": hashlib.sha256(model_bytes).hexdigest(), **identity,
              "method": config.method, "exclude": sorted(config.exclude_nodes),
              "residual": config.quantize_residual, "placement": config.placement,
              **({"alpha": config.smoothquant_alpha} if config.placement == "linear-sq" else {}),
              "onnxruntime": onnxruntime.__version__,
              **({"percentile": config.percentile} if config.method == "percentile" else {}),
              **({"bins": config.entropy_bins} if config.method != "minmax" else {})}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


def quantization_plan(model: onnx.ModelProto, config: QdqConfig, head: frozenset[str]) -> dict[str, tuple]:
    """Node name -> input indices to quantize: the placement's, less the excluded nodes (and Adds if asked)."""
    plan = placement_plan(model.graph, config.placement, head)
    ops = {n.name: n.op_type for n in model.graph.node}
    return {name: inputs for name, inputs in plan.items() if name not in config.exclude_nodes
            and (config.quantize_residual or ops[name] != "Add")}


@contextlib.contextmanager
def _onnxruntime_log():
    """Collect what ONNX Runtime's quantizer logs (through the root logger) instead of printing it."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(f"{record.levelname}: {record.getMessage().strip()}")
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


def _with_opset(model: onnx.ModelProto, opset: int, source: str) -> onnx.ModelProto:
    """``model`` at default-domain opset ``opset`` or above (onnx's version converter)."""
    from onnx import version_converter

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if current >= opset:
        return model
    try:
        raised = version_converter.convert_version(model, opset)
    except Exception as e:  # noqa: BLE001 - the converter raises several types
        raise CalibError(f"{source} (opset {current}) cannot be raised to opset {opset} for float16 Q/DQ scales",
                         found=str(e)[:300],
                         fix="pass --unquantized fp32 to keep the unquantized ops in float32") from e
    return with_needed_ir_version(raised)


def with_needed_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` at the lowest IR version its opsets allow, or its own if higher.

    onnx's version converter raises the opset and keeps the IR version: opset 19 from an opset 17
    export stayed at IR 8, below the IR 9 that ONNX's version table (``onnx.helper.VERSION_TABLE``)
    gives opset 19, a graph out of the ONNX spec.
    """
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    model.ir_version = max(model.ir_version, needed)
    return model


def quantize_int8(model: onnx.ModelProto, source: str, config: QdqConfig, calibration: Calibration, *,
                  head: frozenset[str] = frozenset(),
                  quiet: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> tuple[onnx.ModelProto, dict]:
    """The Q/DQ int8 graph of ``model`` (float32, named ``source`` in errors) and a report (calibration, structure;
    with ``linear-sq``, ``smoothed_float_graph``: the float graph after smoothing, whose LayerNorm outputs are
    rescaled per channel, the graph to compare the int8 graph's intermediate tensors with).

    ``head``: the names of the classifier head's nodes, which the ``modelopt`` placement leaves
    unquantized. ``quiet``: a context ONNX Runtime's quantizer runs in (edge's keeps ONNX Runtime's
    C++ log lines off the terminal). Everything not quantized is still float32 here; with
    ``config.float_precision="float16"`` the graph is at opset 19, ready for a float16 pass.
    """
    config.check()
    model = _prepared(model, source, config)
    calibration = replace(calibration, images=functools.cache(calibration.images))  # read once for both uses
    smoothing = None
    if config.placement == "linear-sq":
        model, smoothing = _smoothed(model, config, calibration, head)
    model_bytes = model.SerializeToString()
    plan = quantization_plan(model, config, head)
    cache_path = _cache_path(model_bytes, config, calibration)
    cache_hit = bool(cache_path and cache_path.is_file())
    start = time.perf_counter()
    reader = None if cache_hit else _reader(model, calibration, cache_path)
    with quiet(), _onnxruntime_log() as ort_log:
        quantized = _quantize_static(model_bytes, config, plan, reader, cache_path)
    placement = restrict_to_placement(quantized, plan, onnx.ModelProto.FromString(model_bytes))
    problems = qdq_violations(quantized, config.placement)
    if problems:
        raise CalibError(f"the int8 graph of {source} breaks TensorRT's Q/DQ rules ({len(problems)} places)",
                         found="; ".join(problems[:5]), fix="nothing was written; report this graph as a bug")
    _copy_metadata(model, quantized)
    with_needed_ir_version(quantized)
    report = {"calibration": {"seconds": round(time.perf_counter() - start, 2),
                              "cache": str(cache_path) if cache_path else None, "cache_hit": cache_hit},
              "quantized_nodes": {op: sum(1 for n in model.graph.node if n.name in plan and n.op_type == op)
                                  for op in (*GEMM_OPS, "Add", "LayerNormalization")},
              **_qdq_counts(quantized), **placement, "onnxruntime_log": ort_log,
              **({"smoothquant": smoothing} if smoothing else {})}
    if smoothing:   # the float graph the Q/DQ pairs were placed in (its LayerNorms rescaled): for per-tensor errors
        report["smoothed_float_graph"] = model
    return quantized, report


def _smoothed(model: onnx.ModelProto, config: QdqConfig, calibration: Calibration,
              head: frozenset[str]) -> tuple[onnx.ModelProto, dict]:
    """``model`` with SmoothQuant folded in; the per-channel activation maxima cached like the ranges."""
    from calib.smoothquant import activation_channel_max, smooth, smooth_targets

    targets = smooth_targets(model.graph, head)
    if not targets:  # no LayerNorm -> GEMM pair: nothing to smooth, no images to read
        return model, {"alpha": config.smoothquant_alpha, "smoothed": [], "cache": None, "cache_hit": False}
    path = _cache_path(model.SerializeToString(), config, calibration)
    path = path.with_name(path.stem + ".smoothquant.npz") if path else None
    if path and path.is_file():
        with np.load(path) as saved:
            maxima = {t.output: saved[f"t{i}"] for i, t in enumerate(targets)}
        cache_hit = True
    else:
        maxima = activation_channel_max(model, calibration.images(), [t.output for t in targets])
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as tmp:
                np.savez(tmp, **{f"t{i}": maxima[t.output] for i, t in enumerate(targets)})
            Path(tmp.name).replace(path)
        cache_hit = False
    smoothed, report = smooth(model, maxima, config.smoothquant_alpha, head)
    return smoothed, {**report, "cache": str(path) if path else None, "cache_hit": cache_hit}


def _prepared(model: onnx.ModelProto, source: str, config: QdqConfig) -> onnx.ModelProto:
    """``model`` with every node named, at the opset its float precision needs; refused if it holds Q/DQ already."""
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        raise CalibError(f"{source} already holds Q/DQ nodes", expected="a float32 graph without quantization",
                         fix="quantize the float32 export")
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    if config.float_precision == "float16":
        model = _with_opset(model, FP16_QDQ_OPSET, source)
    return model


def _cache_path(model_bytes: bytes, config: QdqConfig, calibration: Calibration) -> Path | None:
    if calibration.cache_dir is None:
        return None
    return Path(calibration.cache_dir) / f"{cache_key(model_bytes, config, calibration.identity)}.json"


def _reader(model: onnx.ModelProto, calibration: Calibration, cache_path: Path | None) -> ArrayCalibrationReader:
    """The calibration images as ONNX Runtime's reader, in the graph's static batch (or batches of 32)."""
    images = calibration.images()
    static = graph_batch(model)  # a dynamic batch takes every image: the last batch may be short
    reader = ArrayCalibrationReader(images, model.graph.input[0].name, static or min(CALIBRATION_BATCH, len(images)),
                                    partial=static is None)
    if cache_path:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
    return reader


def _quantize_static(model_bytes: bytes, config: QdqConfig, plan: dict[str, tuple],
                     reader: ArrayCalibrationReader | None, cache_path: Path | None) -> onnx.ModelProto:
    """ONNX Runtime's static quantizer with TensorRT's configuration, on the nodes of ``plan``."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    with tempfile.TemporaryDirectory(prefix="edge-int8-") as tmp:
        out = Path(tmp) / "model.int8.onnx"
        quantize_static(onnx.ModelProto.FromString(model_bytes), str(out), reader, quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=[*GEMM_OPS, "Add", "LayerNormalization"], nodes_to_quantize=list(plan),
                        per_channel=True,
                        reduce_range=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=_ort_method(config.method), extra_options=_extra_options(config),
                        calibration_cache_path=str(cache_path) if cache_path else None)
        return onnx.load(str(out))


def _copy_metadata(source: onnx.ModelProto, target: onnx.ModelProto) -> None:
    del target.metadata_props[:]
    for p in source.metadata_props:
        target.metadata_props.add(key=p.key, value=p.value)
    target.producer_name, target.producer_version = source.producer_name, source.producer_version


def _qdq_counts(model: onnx.ModelProto) -> dict:
    ops = [n.op_type for n in model.graph.node]
    return {"quantize_nodes": ops.count("QuantizeLinear"), "dequantize_nodes": ops.count("DequantizeLinear")}
