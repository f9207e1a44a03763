"""FP16 and INT8 (Q/DQ) accuracy of the bundled reference model on the full Fashion-MNIST test split.

ONNX Runtime CPU. fp32 export -> edge quantize fp16 and int8 with each calibration method
(min-max, entropy, percentile; 500 class-balanced training samples, seed 0) -> accuracy on all
10,000 test images. Also counts the Casts of onnxconverter-common's float16 converter on the same
graph with the same float32 block list, the comparison behind edge's own fp16 pass.

    .venv/bin/python benchmarks/precision.py   # -> benchmarks/results/precision.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def accuracy(path: Path, threads: int) -> dict:
    from edge.check.compare import ort_session
    from edge.data import ArrayPreprocess, load_dataset
    from edge.precision.calibration import input_spec_of

    data = load_dataset("fmnist", "test")
    spec = input_spec_of(onnx.load(str(path), load_external_data=False), str(path))
    session = ort_session(str(path), threads)
    preprocess = ArrayPreprocess(spec)
    correct = 0
    for start in range(0, len(data), 500):
        x = preprocess(data.images[start:start + 500]).numpy()
        correct += int((session.run(None, {"input": x})[0].argmax(-1) == data.labels[start:start + 500].numpy()).sum())
    return {"accuracy": correct / len(data), "correct": correct, "samples": len(data)}


def onnxconverter_casts(fp32: Path) -> dict:
    from onnxconverter_common import float16

    from edge.precision.fp16 import DEFAULT_BLOCK_LIST, head_nodes

    model = onnx.load(str(fp32))
    converted = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=list(DEFAULT_BLOCK_LIST),
                                                 node_block_list=sorted(head_nodes(model.graph)))
    return {"casts": sum(n.op_type == "Cast" for n in converted.graph.node), "nodes": len(converted.graph.node)}


def main() -> None:
    from calib.qdq import METHODS
    from edge.export import ExportConfig, export
    from edge.models import create_model, data_config
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file
    from edge.runtime import hardware, set_threads

    threads = 2
    set_threads(threads)
    results: dict = {"model": "fmnist-deit-tiny", "data": "fmnist test (10,000 images)", "backend": "onnxruntime CPU",
                     "calibration": {"data": "fmnist train", "samples": 500, "seed": 0}, "hardware": hardware()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = create_model("fmnist-deit-tiny")
        fp32 = folder / "ref.onnx"
        export(model, fp32, source="fmnist-deit-tiny", plan=None, data_config=data_config(model),
               config=ExportConfig(dynamic_batch=True))
        results["fp32"] = accuracy(fp32, threads)
        start = time.perf_counter()
        report = quantize_file(fp32, folder / "ref.fp16.onnx", "fp16")
        results["fp16"] = {**accuracy(folder / "ref.fp16.onnx", threads), "casts": report["casts"],
                           "seconds": time.perf_counter() - start, "onnxconverter_common": onnxconverter_casts(fp32)}
        results["int8"] = {}
        for method in METHODS:
            out = folder / f"ref.int8.{method}.onnx"
            report = quantize_file(fp32, out, "int8", int8=Int8Config(data="fmnist", samples=500, method=method,
                                                                      cache_dir=str(folder / "cache")))
            results["int8"][method] = {**accuracy(out, threads), "calibration_seconds":
                                       report["calibration"]["seconds"], "quantize_nodes": report["quantize_nodes"],
                                       "dequantize_nodes": report["dequantize_nodes"]}
    base = results["fp32"]["accuracy"]
    results["drop_pt"] = {"fp16": 100 * (base - results["fp16"]["accuracy"]),
                          **{f"int8-{m}": 100 * (base - r["accuracy"]) for m, r in results["int8"].items()}}
    results["acceptance"] = {"fp16 <= 0.2 pt": results["drop_pt"]["fp16"] <= 0.2,
                             **{f"int8-{m} <= 1.0 pt": d <= 1.0 for m, d in results["drop_pt"].items()
                                if m.startswith("int8")}}
    out = ROOT / "benchmarks" / "results" / "precision.json"
    out.write_text(json.dumps(results, indent=2, default=lambda o: o.item() if isinstance(o, np.generic) else str(o)))
    print(json.dumps(results["drop_pt"], indent=2))


if __name__ == "__main__":
    main()
