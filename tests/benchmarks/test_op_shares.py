"""benchmarks/op_shares.py: ONNX Runtime's profile summed per operator type and call; the fixed share."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_shares import markdown, profile  # noqa: E402


def _graph(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], [0.01] * 256)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["s"], axis=-1),
             helper.make_node("Add", ["s", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_profile_sums_each_operator_type_over_the_measured_calls_only(tmp_path):
    result = profile(_graph(tmp_path / "g.onnx"), threads=1, warmup=2, iterations=5, seed=0)
    assert result["calls"] == 5                                   # the profiled warm-up calls are left out
    assert {"MatMul", "Softmax", "Add"} <= set(result["ops_ms"])
    assert all(ms >= 0 for ms in result["ops_ms"].values()) and result["kernels_ms"] > 0
    # one thread runs the kernels one after another inside each call: their sum is within the call's time
    assert result["kernels_ms"] <= result["wall_ms"] + 0.01


def test_types_that_do_not_shrink_are_named_with_their_share():
    record = {"command": "python benchmarks/op_shares.py", "model": "m", "supernet": "s", "batch": 32, "threads": 2,
              "warmup": 1, "iterations": 3, "provider": "CPU", "ort_optimization": "all",
              "versions": {"onnxruntime": "x"}, "hardware": {"cpu": "c", "cpu_count": 2},
              "load_average": {"before": [0, 0, 0], "after": [0, 0, 0]},
              "rows": [{"variant": "original", "flops": 100.0, "kernels_ms": 10.0, "wall_ms": 11.0,
                        "ops_ms": {"Gemm": 8.0, "Softmax": 1.0, "LayerNormalization": 1.0}},
                       {"variant": "half", "flops": 50.0, "kernels_ms": 6.0, "wall_ms": 7.0,
                        "ops_ms": {"Gemm": 4.0, "Softmax": 1.0, "LayerNormalization": 1.0}}]}
    text = markdown(record)
    assert "LayerNormalization, Softmax; they take **20.0 %**" in text
    assert "| Gemm | 8.00 ms | 4.00 ms (0.50x) |" in text
