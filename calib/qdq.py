"""Explicit INT8 quantization (Q/DQ) with ONNX Runtime's static quantizer, configured for TensorRT.

ONNX Runtime calibrates and inserts the Q/DQ pairs; the configuration is TensorRT's:

* ``QuantFormat.QDQ``, ``QuantType.QInt8`` for activations and weights, ``ActivationSymmetric``
  and ``WeightSymmetric`` (every zero point 0: TensorRT only takes symmetric int8);
* ``per_channel=True`` (weights per output channel; activations stay per tensor);
* only the nodes of the placement (:mod:`calib.placement`: MatMul, Gemm, Conv, the residual Adds,
  and for ``modelopt`` the LayerNorms' inputs) are quantized; their outputs are not
  (``OpTypesToExcludeOutputQuantization``), biases stay float (``QuantizeBias=False``: TensorRT
  folds float biases itself), ``QDQKeepRemovableActivations`` so nothing is folded away;
* after ONNX Runtime's pass :func:`calib.placement.restrict_to_placement` hands every input the
  placement leaves float (Softmax, the other Add input, a LayerNorm's scale) its float tensor.

A strongly typed TensorRT network takes every tensor's type from the graph, so what is not
quantized (LayerNorm, Softmax, GELU, the Adds, every GEMM output) runs in the precision the graph
gives it: with ``float_precision="float16"`` (the default, as ModelOpt's) the graph is raised to
opset 19 (float16 Q/DQ scales) and :mod:`edge.quantize` converts the rest with the fp16 pass,
giving TensorRT INT8+FP16; ``"float32"`` keeps INT8+FP32.

ONNX Runtime's quantizer logs advice to run its pre-processing (symbolic shape inference and
graph optimisation) on every graph that lacks its tag; the graphs here come from ``edge export``
/ ``edge clean`` with static shapes, so the advice goes into the report (``onnxruntime_log``),
not onto the terminal.

Calibration data come from the shared seeded, class-balanced sampler; the tensor ranges are
cached (ONNX Runtime's JSON calibration cache) under a key of the graph's sha256, data, samples,
seed, method and options, so a second run with the same inputs skips calibration.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from calib.data import ArrayCalibrationReader, calibration_images, graph_batch
from calib.placement import GEMM_OPS, PLACEMENTS, placement_plan, qdq_violations, restrict_to_placement
from edge.check.compare import ort_messages
from edge.config import MAX_SAMPLES, MAX_SEED, option
from edge.errors import EdgeError
from edge.onnx_metadata import CALIBRATION, QDQ_PLACEMENT, set_precision_metadata, source_precision

METHODS = ("minmax", "entropy", "percentile")
FLOAT_PRECISIONS = ("float16", "float32")
CALIBRATION_BATCH = 32
#: float16 Q/DQ scales (DequantizeLinear's output type follows its scale) exist from opset 19
FP16_QDQ_OPSET = 19


def default_cache_dir() -> Path:
    base = os.environ.get("EDGE_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "edge")
    return Path(base).expanduser() / "calibration"


@dataclass
class Int8Config:
    data: str = "fmnist"
    samples: int = option(500, minimum=1, maximum=MAX_SAMPLES)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    method: str = "minmax"          # minmax | entropy | percentile
    percentile: float = option(99.999, above=0, maximum=100)  # percentile method: the share of |x| kept
    entropy_bins: int = option(2048, minimum=2, maximum=1 << 20)  # entropy and percentile methods: histogram bins
    quantize_residual: bool = True  # Q/DQ on an input of residual Adds (which one: placement)
    placement: str = "modelopt"     # modelopt | skip (calib.placement; the choice: docs/results/quant-peers.md)
    float_precision: str = "float16"  # what is not quantized: float16 (INT8+FP16) or float32 (INT8+FP32)
    exclude_nodes: tuple[str, ...] = ()
    cache_dir: str | None = None    # None: $EDGE_CACHE_DIR/calibration or ~/.cache/edge/calibration
    use_cache: bool = True

    def check(self) -> None:
        if self.method not in METHODS:
            raise EdgeError(f"calibration method {self.method!r} is unknown", expected=f"one of {', '.join(METHODS)}",
                            fix="pass --method minmax, entropy or percentile")
        if not 0 < self.percentile <= 100:
            raise EdgeError(f"percentile {self.percentile} is out of range", expected="0 < percentile <= 100")
        if self.samples < 1:
            raise EdgeError(f"--samples {self.samples}", expected="at least 1 calibration sample")
        if self.placement not in PLACEMENTS:
            raise EdgeError(f"Q/DQ placement {self.placement!r} is unknown", expected=f"one of {', '.join(PLACEMENTS)}",
                            fix="pass --placement skip or modelopt")
        if self.float_precision not in FLOAT_PRECISIONS:
            raise EdgeError(f"float precision {self.float_precision!r} is unknown",
                            expected=f"one of {', '.join(FLOAT_PRECISIONS)}", fix="pass --unquantized fp16 or fp32")


def _ort_method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


def _extra_options(config: Int8Config) -> dict:
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


def cache_key(model_bytes: bytes, config: Int8Config) -> str:
    import onnxruntime

    fields = {"onnx_sha256": hashlib.sha256(model_bytes).hexdigest(), "data": config.data, "samples": config.samples,
              "seed": config.seed, "method": config.method, "exclude": sorted(config.exclude_nodes),
              "residual": config.quantize_residual, "placement": config.placement,
              "onnxruntime": onnxruntime.__version__,
              **({"percentile": config.percentile} if config.method == "percentile" else {}),
              **({"bins": config.entropy_bins} if config.method != "minmax" else {})}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


def quantization_plan(model: onnx.ModelProto, config: Int8Config, head: frozenset[str]) -> dict[str, tuple]:
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
        return version_converter.convert_version(model, opset)
    except Exception as e:  # noqa: BLE001 - the converter raises several types
        raise EdgeError(f"{source} (opset {current}) cannot be raised to opset {opset} for float16 Q/DQ scales",
                        found=str(e)[:300], fix="pass --unquantized fp32 to keep the unquantized ops in float32") from e


def quantize_int8(model: onnx.ModelProto, source: str, config: Int8Config | None = None, progress=None,
                  head: frozenset[str] = frozenset()) -> tuple[onnx.ModelProto, dict]:
    """The Q/DQ int8 graph of ``model`` (float32) and a report (calibration, cache, structure).

    ``head``: the names of the classifier head's nodes (:func:`edge.fp16.head_nodes`), which the
    ``modelopt`` placement leaves unquantized.
    Everything not quantized is still float32 here; with ``config.float_precision="float16"`` the
    graph is at opset 19, ready for :func:`edge.fp16.convert_to_fp16`.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    config = config or Int8Config()
    config.check()
    if source_precision(model) != "float32":
        raise EdgeError(f"{source} is a {source_precision(model)} graph", expected="the float32 graph from edge export",
                        fix="quantize the float32 export, not a converted one")
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        raise EdgeError(f"{source} already holds Q/DQ nodes", expected="a float32 graph without quantization",
                        fix="quantize the float32 export")
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    if config.float_precision == "float16":
        model = _with_opset(model, FP16_QDQ_OPSET, source)
    model_bytes = model.SerializeToString()
    plan = quantization_plan(model, config, head)
    names = list(plan)
    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
    cache_path = cache_dir / f"{cache_key(model_bytes, config)}.json" if config.use_cache else None
    cache_hit = bool(cache_path and cache_path.is_file())
    reader = None
    start = time.perf_counter()
    if not cache_hit:
        images = calibration_images(model, source, config.data, config.samples, config.seed)
        batch = graph_batch(model) or CALIBRATION_BATCH
        reader = ArrayCalibrationReader(images, model.graph.input[0].name, batch)
        if progress:
            progress(f"calibrating ({config.method}) on {config.samples} samples of {config.data}")
        if cache_path:
            cache_dir.mkdir(parents=True, exist_ok=True)
    # the quantizer's notes: its C++ log lines to the ONNX Runtime log, its Python advice into the result
    with tempfile.TemporaryDirectory(prefix="edge-int8-") as tmp, ort_messages(), _onnxruntime_log() as ort_log:
        out = Path(tmp) / "model.int8.onnx"
        quantize_static(onnx.ModelProto.FromString(model_bytes), str(out), reader, quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=[*GEMM_OPS, "Add", "LayerNormalization"], nodes_to_quantize=names,
                        per_channel=True,
                        reduce_range=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=_ort_method(config.method), extra_options=_extra_options(config),
                        calibration_cache_path=str(cache_path) if cache_path else None)
        quantized = onnx.load(str(out))
    placement = restrict_to_placement(quantized, plan, onnx.ModelProto.FromString(model_bytes))
    problems = qdq_violations(quantized, config.placement)
    if problems:
        raise EdgeError(f"the int8 graph of {source} breaks TensorRT's Q/DQ rules ({len(problems)} places)",
                        found="; ".join(problems[:5]), fix="nothing was written; report this graph as a bug")
    _copy_metadata(model, quantized)
    set_precision_metadata(quantized, "int8", **{CALIBRATION: json.dumps(
        {"data": config.data, "samples": config.samples, "seed": config.seed, "method": config.method}),
        QDQ_PLACEMENT: config.placement})
    counts = _qdq_counts(quantized)
    report = {"precision": "int8", "format": "QDQ", "config": asdict(config),
              "calibration": {"method": config.method, "samples": config.samples, "data": config.data,
                              "seed": config.seed, "seconds": round(time.perf_counter() - start, 2),
                              "cache": str(cache_path) if cache_path else None, "cache_hit": cache_hit},
              "quantized_nodes": {op: sum(1 for n in model.graph.node if n.name in names and n.op_type == op)
                                  for op in (*GEMM_OPS, "Add", "LayerNormalization")},
              **counts, **placement, "onnxruntime_log": ort_log}
    return quantized, report


def _copy_metadata(source: onnx.ModelProto, target: onnx.ModelProto) -> None:
    del target.metadata_props[:]
    for p in source.metadata_props:
        target.metadata_props.add(key=p.key, value=p.value)
    target.producer_name, target.producer_version = source.producer_name, source.producer_version


def _qdq_counts(model: onnx.ModelProto) -> dict:
    ops = [n.op_type for n in model.graph.node]
    return {"quantize_nodes": ops.count("QuantizeLinear"), "dequantize_nodes": ops.count("DequantizeLinear")}
