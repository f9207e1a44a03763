"""ONNX Runtime sessions follow OMP_NUM_THREADS where the caller names no thread count (edge.check.compare)."""

import pytest
from onnx import TensorProto, helper

from edge.check.compare import default_threads, ort_session


def graph() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("value, threads", [("1", 1), ("3", 3), (" 2 ", 2), ("", None), ("0", None), ("-1", None),
                                            ("auto", None), ("2,1", None)])
def test_omp_num_threads_names_the_sessions_threads_and_anything_else_leaves_onnxruntimes_own(monkeypatch, value,
                                                                                             threads):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == threads


def test_a_session_without_threads_gets_omp_num_threads_and_a_given_count_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert ort_session(graph()).get_session_options().intra_op_num_threads == 1
    assert ort_session(graph(), threads=2).get_session_options().intra_op_num_threads == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() is None
    assert ort_session(graph()).get_session_options().intra_op_num_threads == 0   # ONNX Runtime's own choice
