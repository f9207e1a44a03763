"""calib on its own: Q/DQ quantization of a graph on images the caller hands in, without edge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from calib.errors import CalibError
from calib.qdq import Calibration, QdqConfig, quantize_int8

REPO = Path(__file__).resolve().parents[2]


def two_layer_graph() -> onnx.ModelProto:
    """x [N, 8] -> MatMul -> Relu -> MatMul -> y [N, 4], float32, opset 17."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "two_layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def images() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)


def test_quantizes_on_the_images_handed_in_and_caches_their_ranges(tmp_path):
    config = QdqConfig(float_precision="float32")
    calibration = Calibration(images, {"images": "seeded normal, 64"}, tmp_path / "cache")
    quantized, report = quantize_int8(two_layer_graph(), "two_layers", config, calibration)
    onnx.checker.check_model(quantized, full_check=True)
    assert report["quantized_nodes"]["MatMul"] == 2 and report["quantize_nodes"] > 0
    assert report["calibration"]["cache_hit"] is False and Path(report["calibration"]["cache"]).is_file()

    def no_images() -> np.ndarray:
        raise AssertionError("a cache hit reads no images")

    again, second = quantize_int8(two_layer_graph(), "two_layers", config,
                                  Calibration(no_images, calibration.identity, calibration.cache_dir))
    assert second["calibration"]["cache_hit"] is True
    assert again.SerializeToString() == quantized.SerializeToString()


def test_float16_qdq_raises_the_ir_version_with_the_opset(tmp_path):
    """Opset 19 (float16 scales) needs IR 9 (onnx.helper.VERSION_TABLE); torch's opset-17 export is IR 8, and the
    version converter kept it: the int8 graph was opset 19 at IR 8, out of the ONNX spec (issue 29, point 9)."""
    export_like = two_layer_graph()
    export_like.ir_version = 8   # what torch.onnx writes at opset 17
    quantized, _ = quantize_int8(export_like, "two_layers", QdqConfig(), Calibration(images))
    opset = next(o.version for o in quantized.opset_import if o.domain in ("", "ai.onnx"))
    assert opset == 19 and quantized.ir_version >= 9 == helper.find_min_ir_version_for(list(quantized.opset_import))
    onnx.checker.check_model(quantized, full_check=True)


def test_bad_input_is_a_calib_error():
    calibration = Calibration(images)
    with pytest.raises(CalibError, match="calibration method 'kl' is unknown"):
        quantize_int8(two_layer_graph(), "two_layers", QdqConfig(method="kl"), calibration)
    quantized, _ = quantize_int8(two_layer_graph(), "two_layers", QdqConfig(float_precision="float32"), calibration)
    with pytest.raises(CalibError, match="already holds Q/DQ nodes"):
        quantize_int8(quantized, "q.onnx", QdqConfig(), calibration)


# In a fresh interpreter: import every module of calib and list the top-level packages they brought in.
LIST_IMPORTS = """
import sys
before = set(sys.modules)
import importlib, json, pkgutil, calib
names = sorted("calib." + m.name for m in pkgutil.iter_modules(calib.__path__))
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "imported": sorted({m.split(".")[0] for m in set(sys.modules) - before})}))
"""


def test_calib_imports_neither_edge_nor_torch():
    done = subprocess.run([sys.executable, "-c", LIST_IMPORTS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert {"calib.data", "calib.errors", "calib.placement", "calib.qdq"} <= set(found["modules"])
    assert not {"edge", "jetson", "torch", "timm"} & set(found["imported"]), found["imported"]
