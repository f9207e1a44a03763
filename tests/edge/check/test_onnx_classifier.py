"""An ONNX graph scored with several calls at once gives what one call at a time gives (edge.check.onnx_classifier)."""

import numpy as np
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper, save

from edge.check.accuracy import evaluate
from edge.check.compare import MAX_CALLS, concurrent_calls
from edge.check.onnx_classifier import OnnxClassifier
from edge.data import InputSpec, load_dataset


@pytest.fixture(scope="module")
def linear_graph(tmp_path_factory):
    """A dynamic-batch linear classifier of 28x28 gray images into 10 classes, seeded weights."""
    weight = np.random.default_rng(0).standard_normal((784, 10)).astype(np.float32)
    nodes = [helper.make_node("Flatten", ["x"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              ["batch", 1, 28, 28])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                              [numpy_helper.from_array(weight, "w")])
    path = tmp_path_factory.mktemp("graph") / "linear.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


SPEC = InputSpec(1, 28, 28, (0.5,), (0.5,))


@pytest.mark.parametrize("threads, expected", [(1, (1, 1)), (2, (2, 1)), (3, (3, 1)), (MAX_CALLS, (MAX_CALLS, 1)),
                                               (2 * MAX_CALLS, (MAX_CALLS, 2)), (2 * MAX_CALLS + 1, (MAX_CALLS, 2))])
def test_an_accuracy_run_spends_its_threads_on_one_thread_calls_up_to_the_bound(threads, expected):
    assert concurrent_calls(threads) == expected


def test_calls_at_once_give_every_batchs_outputs_in_order_bit_for_bit(linear_graph):
    batches = [torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(n)) for n in (7, 64, 1, 33, 64, 5)]
    one = OnnxClassifier(linear_graph, threads=1)
    several = OnnxClassifier(linear_graph, threads=1, calls=3)
    expected = [one(x) for x in batches]
    got = list(several.map((x, i) for i, x in enumerate(batches)))
    assert [i for _, i in got] == list(range(len(batches)))
    for (logits, _), want in zip(got, expected, strict=True):
        assert torch.equal(logits, want)


def test_at_most_twice_the_calls_batches_are_read_before_the_first_result(linear_graph):
    read = []

    def batches():
        for i in range(20):
            read.append(i)
            yield torch.zeros(2, 1, 28, 28), i

    several = OnnxClassifier(linear_graph, threads=1, calls=2)
    stream = several.map(batches())
    _, first = next(stream)
    assert first == 0 and len(read) == 4
    assert [i for _, i in stream] == list(range(1, 20))


def test_a_failing_call_raises_from_the_stream(linear_graph):
    several = OnnxClassifier(linear_graph, threads=1, calls=2)
    items = [(torch.zeros(2, 1, 28, 28), 0), (torch.zeros(2, 3, 28, 28), 1), (torch.zeros(2, 1, 28, 28), 2)]
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        list(several.map(items))


def test_accuracy_with_calls_at_once_is_the_accuracy_one_at_a_time(linear_graph):
    dataset = load_dataset("fmnist-mini", "test")
    kwargs = {"batch_size": 64, "show_progress": False, "predictions": True}
    one = evaluate(OnnxClassifier(linear_graph, threads=1), dataset, SPEC, **kwargs)
    several = evaluate(OnnxClassifier(linear_graph, threads=1, calls=2), dataset, SPEC, **kwargs)
    one.pop("seconds"), several.pop("seconds")
    assert several == one
    assert one["samples"] == len(dataset) == len(one["predictions"])



def test_session_config_entries_reach_onnx_runtime(linear_graph):
    options = OnnxClassifier(linear_graph, threads=1, config={"session.disable_quant_qdq": "1"}).session \
        .get_session_options()
    assert options.get_session_config_entry("session.disable_quant_qdq") == "1"
    plain = OnnxClassifier(linear_graph, threads=1).session.get_session_options()
    with pytest.raises(RuntimeError, match="does not have configuration with key"):   # ONNX Runtime's default
        plain.get_session_config_entry("session.disable_quant_qdq")
