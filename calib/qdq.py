"""Explicit INT8 quantization (Q/DQ) with ONNX Runtime's static quantizer, configured for TensorRT.

ONNX Runtime calibrates and inserts the Q/DQ pairs; the configuration is TensorRT's:

* ``QuantFormat.QDQ``, ``QuantType.QInt8`` for activations and weights, ``ActivationSymmetric``
  and ``WeightSymmetric`` (every zero point 0: TensorRT only takes symmetric int8);
* ``per_channel=True`` (weights per output channel; activations stay per tensor);
* only MatMul, Gemm, Conv and the residual Adds are quantized; their outputs are not
  (``OpTypesToExcludeOutputQuantization``), biases stay float (``QuantizeBias=False``: TensorRT
  folds float biases itself), ``QDQKeepRemovableActivations`` so nothing is folded away;
* LayerNormalization and Softmax are never quantized, and after ONNX Runtime's pass
  :func:`calib.placement.restrict_to_tensorrt_placement` hands them the float tensor again.

Calibration data come from the shared seeded, class-balanced sampler; the tensor ranges are
cached (ONNX Runtime's JSON calibration cache) under a key of the graph's sha256, data, samples,
seed, method and options, so a second run with the same inputs skips calibration.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from calib.data import ArrayCalibrationReader, calibration_images, graph_batch
from calib.placement import GEMM_OPS, qdq_violations, residual_adds, restrict_to_tensorrt_placement
from edge.compare import ort_messages
from edge.errors import EdgeError
from edge.onnx_metadata import CALIBRATION, set_precision_metadata, source_precision

METHODS = ("minmax", "entropy", "percentile")
CALIBRATION_BATCH = 32


def default_cache_dir() -> Path:
    base = os.environ.get("EDGE_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "edge")
    return Path(base).expanduser() / "calibration"


@dataclass
class Int8Config:
    data: str = "fmnist"
    samples: int = 500
    seed: int = 0
    method: str = "minmax"          # minmax | entropy | percentile
    percentile: float = 99.999      # percentile method: the share of |x| kept
    entropy_bins: int = 2048        # entropy and percentile methods: histogram bins
    quantize_residual: bool = True  # Q/DQ on the skip input of residual Adds
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


def _ort_method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


def _extra_options(config: Int8Config) -> dict:
    options = {
        "ActivationSymmetric": True,
        "WeightSymmetric": True,
        "QuantizeBias": False,
        "OpTypesToExcludeOutputQuantization": [*GEMM_OPS, "Add"],
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
              "residual": config.quantize_residual, "onnxruntime": onnxruntime.__version__,
              **({"percentile": config.percentile} if config.method == "percentile" else {}),
              **({"bins": config.entropy_bins} if config.method != "minmax" else {})}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


def nodes_to_quantize(model: onnx.ModelProto, config: Int8Config) -> tuple[list[str], dict[str, str]]:
    residual = residual_adds(model.graph) if config.quantize_residual else {}
    names = [n.name for n in model.graph.node if n.op_type in GEMM_OPS] + list(residual)
    return [n for n in names if n not in config.exclude_nodes], residual


def quantize_int8(model: onnx.ModelProto, source: str, config: Int8Config | None = None,
                  progress=None) -> tuple[onnx.ModelProto, dict]:
    """The Q/DQ int8 graph of ``model`` (float32) and a report (calibration, cache, structure)."""
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
    model_bytes = model.SerializeToString()
    names, residual = nodes_to_quantize(model, config)
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
    with tempfile.TemporaryDirectory(prefix="edge-int8-") as tmp, ort_messages():  # the quantizer's notes
        out = Path(tmp) / "model.int8.onnx"
        quantize_static(onnx.ModelProto.FromString(model_bytes), str(out), reader, quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=[*GEMM_OPS, "Add"], nodes_to_quantize=names, per_channel=True,
                        reduce_range=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=_ort_method(config.method), extra_options=_extra_options(config),
                        calibration_cache_path=str(cache_path) if cache_path else None)
        quantized = onnx.load(str(out))
    placement = restrict_to_tensorrt_placement(quantized, residual)
    problems = qdq_violations(quantized)
    if problems:
        raise EdgeError(f"the int8 graph of {source} breaks TensorRT's Q/DQ rules ({len(problems)} places)",
                        found="; ".join(problems[:5]), fix="nothing was written; report this graph as a bug")
    _copy_metadata(model, quantized)
    set_precision_metadata(quantized, "int8", **{CALIBRATION: json.dumps(
        {"data": config.data, "samples": config.samples, "seed": config.seed, "method": config.method})})
    counts = _qdq_counts(quantized)
    report = {"precision": "int8", "format": "QDQ", "config": asdict(config),
              "calibration": {"method": config.method, "samples": config.samples, "data": config.data,
                              "seed": config.seed, "seconds": round(time.perf_counter() - start, 2),
                              "cache": str(cache_path) if cache_path else None, "cache_hit": cache_hit},
              "quantized_nodes": {op: sum(1 for n in model.graph.node if n.name in names and n.op_type == op)
                                  for op in (*GEMM_OPS, "Add")},
              **counts, **placement}
    return quantized, report


def _copy_metadata(source: onnx.ModelProto, target: onnx.ModelProto) -> None:
    del target.metadata_props[:]
    for p in source.metadata_props:
        target.metadata_props.add(key=p.key, value=p.value)
    target.producer_name, target.producer_version = source.producer_name, source.producer_version


def _qdq_counts(model: onnx.ModelProto) -> dict:
    ops = [n.op_type for n in model.graph.node]
    return {"quantize_nodes": ops.count("QuantizeLinear"), "dequantize_nodes": ops.count("DequantizeLinear")}
