"""ONNX Runtime's notes stay off the terminal in every verb; they go to a log, with their count."""

import logging
import os
import re
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.conftest import TINY
from tests.launch import run_edge

ROOT = Path(__file__).resolve().parents[3]
ORT_LINE = re.compile(r"\[[VIWEF]:onnxruntime:|onnxruntime.*(UnsqueezeElimination|pre-processing)")


def _graph_ort_warns_about() -> bytes:
    """A Relu with an unused initializer, which ONNX Runtime removes with a warning."""
    unused = helper.make_tensor("unused", TensorProto.FLOAT, [3], [0.0, 1.0, 2.0])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [unused])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_default_logger_session_is_kept_off_the_terminal(capfd):
    import onnxruntime as ort

    from edge.check.compare import ORT_MESSAGES, ort_messages

    ORT_MESSAGES.take()
    with ort_messages():
        session = ort.InferenceSession(_graph_ort_warns_about(), providers=["CPUExecutionProvider"])  # default logger
        print("edge's own line", file=sys.stderr)
        logging.getLogger("onnxruntime.quantization.fake_tool").warning("a quantizer note")
    assert session.run(None, {"x": -np.ones(3, np.float32)})[0].tolist() == [0.0, 0.0, 0.0]
    captured = capfd.readouterr()
    assert not ORT_LINE.search(captured.out + captured.err) and "a quantizer note" not in captured.err
    assert "edge's own line" in captured.err  # the rest of stderr still gets through
    lines = ORT_MESSAGES.take()
    assert "[python:WARNING:onnxruntime.quantization.fake_tool] a quantizer note" in lines
    assert any("[W:onnxruntime:" in line and "Removing initializer 'unused'" in line for line in lines)


def test_edge_clean_prints_no_onnxruntime_line(tmp_path):
    """A dynamic-batch ViT: onnx-graphsurgeon's constant folding makes ONNX Runtime warn about Unsqueezes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGE_NO_PROGRESS": "1", "EDGE_ORT_LOG": str(tmp_path / "ort.log")}

    def edge(*args):
        done = run_edge(list(args), cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return done

    edge("export", TINY, "--dynamic-batch", "--out", "m.onnx", "--no-verify")
    result = edge("clean", "m.onnx", "--out", "m.clean.onnx")
    assert onnx.load(str(tmp_path / "m.clean.onnx")).graph.node
    assert not ORT_LINE.search(result.stdout + result.stderr), result.stderr
    log = (tmp_path / "ort.log").read_text().splitlines()
    assert log and all("onnxruntime" in line for line in log)
    assert f"edge clean: {len(log)} ONNX Runtime notes" in result.stderr
