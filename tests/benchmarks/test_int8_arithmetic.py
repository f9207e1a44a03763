"""benchmarks/int8_arithmetic.py: a run's INT8 graphs scored with ONNX Runtime's integer kernels and without."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.onnx_metadata import set_preprocessing
from tests.rgb_folder import make_rgb_folder

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from int8_arithmetic import SETTINGS, markdown  # noqa: E402


def _int8_classifier(path: Path, channels: int = 1, size: int = 28) -> Path:
    """A Q/DQ linear classifier of ``channels`` x ``size`` x ``size`` images (int8 input and per-channel int8
    weights), with edge's metadata."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((channels * size * size, 10)).astype(np.float32) * 0.05
    scales = (np.abs(weights).max(axis=0) / 127).astype(np.float32)
    q = np.clip(np.rint(weights / scales), -127, 127).astype(np.int8)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", channels, size, size])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
    inits = [numpy_helper.from_array(q, "w_q"), numpy_helper.from_array(scales, "w_scale"),
             numpy_helper.from_array(np.zeros(10, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "x_zero")]
    nodes = [helper.make_node("Flatten", ["input"], ["flat"]),
             helper.make_node("QuantizeLinear", ["flat", "x_scale", "x_zero"], ["flat_q"]),
             helper.make_node("DequantizeLinear", ["flat_q", "x_scale", "x_zero"], ["flat_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], axis=1),
             helper.make_node("MatMul", ["flat_dq", "w"], ["logits"])]
    model = helper.make_model(helper.make_graph(nodes, "int8", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    mean, std = ((0.2860,), (0.3530,)) if channels == 1 else ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    set_preprocessing(model, {"input_size": (channels, size, size), "mean": mean, "std": std})
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))
    return path


def test_every_int8_graph_of_a_run_is_scored_both_ways_on_the_same_images(tmp_path):
    run = tmp_path / "run"
    _int8_classifier(run / "variants" / "tiny" / "int8" / "model.batched.onnx")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "int8_arithmetic.py"), "--run", str(run),
                           "--data", "fmnist-mini", "--images", "100", "--out", str(out), "--md-out", str(md)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    assert row["graph"] == "tiny.int8" and row["images"] == 100 and record["data"] == "fmnist-mini:test[100]"
    assert set(row["settings"]) == set(SETTINGS)
    for scored in row["settings"].values():
        assert scored["correct"] == round(scored["accuracy"] * 100)
    # one integer product per logit: both ways give it to float rounding, so no prediction moves
    assert row["largest_logit_difference"] < 1e-4 and row["predictions_differ"] == 0
    assert "| tiny.int8 |" in md.read_text()


def test_a_224_px_rgb_graph_is_scored_on_the_users_image_folder(tmp_path):
    run = tmp_path / "run"
    _int8_classifier(run / "variants" / "mine" / "int8" / "model.batched.onnx", channels=3, size=224)
    images = make_rgb_folder(tmp_path / "images", train=1, val=12, size=64)   # resized to 224 by the graph's spec
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "int8_arithmetic.py"), "--run", str(run),
                           "--data", str(images), "--images", "100", "--out", str(out), "--md-out", str(md)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["graph"] == "mine.int8" and row["images"] == 100
    assert row["largest_logit_difference"] < 1e-3 and row["predictions_differ"] == 0


def test_more_images_than_the_split_holds_is_refused_naming_the_option(tmp_path):
    run = tmp_path / "run"
    _int8_classifier(run / "variants" / "tiny" / "int8" / "model.batched.onnx")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "int8_arithmetic.py"), "--run", str(run),
                           "--data", "fmnist-mini", "--images", "5000", "--out", str(tmp_path / "r.json"),
                           "--md-out", str(tmp_path / "r.md")],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "int8_arithmetic: --images 5000: no class-balanced set of that many among the 2,000 test images" \
        in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_folder_without_int8_graphs_is_refused_naming_it(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "int8_arithmetic.py"), "--run", str(tmp_path),
                           "--out", str(tmp_path / "r.json"), "--md-out", str(tmp_path / "r.md")],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode != 0
    assert f"no variants/*/int8/model.batched.onnx under {tmp_path}" in done.stderr
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("differ, share", [(0, "0.00 %"), (23, "1.15 %")])
def test_the_table_gives_each_graph_both_accuracies_and_the_predictions_that_differ(differ, share):
    labels = list(SETTINGS)
    record = {"command": "python benchmarks/int8_arithmetic.py", "run": "runs/pipeline", "versions": {},
              "provider": "CPU", "ort_optimization": "all", "data": "fmnist:test[2000]",
              "hardware": {"cpu": "c", "cpu_count": 2},
              "rows": [{"graph": "planned.int8", "images": 2000, "predictions_differ": differ,
                        "largest_logit_difference": 2.87, "median_largest_logit_difference": 1e-6,
                        "settings": {labels[0]: {"accuracy": 0.834, "seconds": 7.5},
                                     labels[1]: {"accuracy": 0.8355, "seconds": 6.0}}}]}
    text = markdown(record)
    assert f"| planned.int8 | 83.40 % (7.5 s) | 83.55 % (6.0 s) | {differ} of 2,000 ({share}) | 2.87 (1e-06) |" in text
