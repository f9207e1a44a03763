"""The accuracy gate of edge quantize (issue 30, point 5): figures per output on held-out images, a refusal naming
the nodes that add most error, --accept-loss, the figures recorded in the graph and carried by the bundle.

The quantization that breaks accuracy is the real one: ModelOpt's residual-stream placement (``--placement
modelopt``) on the outlier model, whose massive residual channels leave every other token a few int8 levels.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.cli import main
from edge.errors import EdgeError
from edge.precision.gate import (THRESHOLDS, AccuracyLoss, GateConfig, Thresholds, failures, node_errors,
                                 output_figures, reference_names)
from edge.precision.int8 import Int8Config
from edge.precision.quantize import quantize_file

CALIBRATION = 32
GATE = GateConfig(images=100, node_images=4)  # the default: 500 images, 8 for the nodes


def export(name: str, path):
    from edge.export import ExportConfig, export
    from edge.models import create_model, data_config

    model = create_model(name)
    export(model, path, source=name, plan=None, data_config=data_config(model),
           config=ExportConfig(dynamic_batch=True, verify=False))
    return path


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The outlier model and the reference model exported with a dynamic batch (float32)."""
    folder = tmp_path_factory.mktemp("gate")
    return {"outliers": export("fmnist-deit-tiny-outliers", folder / "outliers.onnx"),
            "reference": export("fmnist-deit-tiny", folder / "reference.onnx"), "cache": folder / "cache"}


def modelopt(graphs) -> Int8Config:
    return Int8Config(data="fmnist-mini", samples=CALIBRATION, placement="modelopt", cache_dir=str(graphs["cache"]))


def metadata(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


# the figures
def test_output_figures_are_exact_on_known_arrays():
    reference = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    candidate = np.array([[1.0, 0.5, 0.0], [0.0, 0.0, 3.0]])  # image 0 keeps its arg-max, image 1 loses it
    figures = output_figures(reference, candidate, class_scores=True)
    assert figures["top1_agreement"] == 0.5
    assert figures["max_abs"] == 3.0 and figures["mean_abs"] == pytest.approx(5.5 / 6)
    assert figures["rel_l2"] == pytest.approx(np.sqrt(0.25 + 4 + 9) / np.sqrt(5))
    assert "top1_agreement" not in output_figures(reference, candidate, class_scores=False)


def test_failures_name_each_output_and_bound():
    per_output = {"logits": {"top1_agreement": 0.9, "rel_l2": 0.5}, "features": {"rel_l2": 0.001}}
    assert failures({"per_output": per_output}, Thresholds(0.98, None, max_rel_l2=0.2)) == [
        "logits: top-1 agreement 0.900 < 0.98", "logits: rel L2 0.5 > 0.2"]
    assert failures({"per_output": per_output}, Thresholds(0.9, None, max_rel_l2=0.5)) == []
    assert THRESHOLDS["fp16"].min_top1_agreement > THRESHOLDS["int8"].min_top1_agreement


def _chain(w2: np.ndarray, qdq: bool = False) -> onnx.ModelProto:
    """x -> MatMul(W1) -> Relu -> [Q/DQ] -> MatMul(W2) -> y, with named nodes and tensors."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w1"),
             numpy_helper.from_array(w2.astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="act")]
    second = "r"
    if qdq:
        inits += [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                  numpy_helper.from_array(np.array(0, np.int8), "z")]
        nodes += [helper.make_node("QuantizeLinear", ["r", "s", "z"], ["r_q"], name="r_Q"),
                  helper.make_node("DequantizeLinear", ["r_q", "s", "z"], ["r_dq"], name="r_DQ")]
        second = "r_dq"
    nodes.append(helper.make_node("MatMul", [second, "w2"], ["y"], name="fc2"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def test_node_errors_blame_the_node_that_adds_the_error():
    w2 = np.random.default_rng(1).standard_normal((8, 8))
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    nodes = node_errors(_chain(w2), _chain(w2 * 1.5), x)  # only fc2's weights differ: y off by 50 %
    assert nodes[0]["node"] == "fc2" and nodes[0]["added"] == pytest.approx(0.5, rel=1e-5)
    assert nodes[0]["inputs_error"] == 0.0 and nodes[0]["quantized_inputs"] == []
    assert {n["node"]: n["added"] for n in nodes[1:]} == {"fc1": 0.0, "act": 0.0}


def test_a_qdq_pair_is_compared_with_the_tensor_it_quantizes():
    w2 = np.random.default_rng(1).standard_normal((8, 8))
    quantized = _chain(w2, qdq=True)
    assert reference_names(quantized, {"x", "h", "r", "y"}) == {"x": "x", "h": "h", "r": "r", "r_dq": "r", "y": "y"}
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32) * 10  # |r| up to ~100: 0.05 clips it
    nodes = {n["node"]: n for n in node_errors(_chain(w2), quantized, x)}
    assert nodes["r_DQ"]["added"] > 0.5 and nodes["r_DQ"]["inputs_error"] == 0.0  # clipped at 127 * 0.05
    assert nodes["fc2"]["quantized_inputs"] == ["r_DQ"]
    assert max(nodes.values(), key=lambda n: n["added"])["node"] == "r_DQ"


# a quantization that breaks accuracy
def test_the_collapsing_int8_is_refused_naming_nodes_and_nothing_is_written(graphs, tmp_path):
    out = tmp_path / "collapsed.onnx"
    with pytest.raises(AccuracyLoss, match="below the accuracy gate") as e:
        quantize_file(graphs["outliers"], out, "int8", int8=modelopt(graphs), gate=GATE)
    assert isinstance(e.value, EdgeError) and e.value.exit_code == 2 and not out.exists()
    gate = e.value.gate
    assert gate["images"] == 100 and gate["data"] == "fmnist-mini:test" and not gate["passed"]
    assert gate["top1_agreement"] < 0.8 and gate["rel_l2"] > 0.4  # 0.664 and 0.62 on 2,000 images (500 samples)
    named = gate["nodes"]
    assert len(named) == 5 and all(n["node"] in str(e.value) for n in named)
    assert [n["added"] for n in named] == sorted((n["added"] for n in named), reverse=True)
    # the residual stream's Q/DQ pairs from block 2 on, where the massive channels start: each rounds every
    # token but the outliers' to zero (measured: error about 0.2-0.3 -> 0.8, on 4 images)
    assert named[0]["op"] == "DequantizeLinear" and named[0]["added"] > 0.3 and named[0]["read_by"]
    assert all(n["node"].startswith(("/blocks/blocks.2/", "/blocks/blocks.3/", "/blocks/blocks.4/")) for n in named)
    assert "--accept-loss" in e.value.fix and "--exclude NODE" in e.value.fix


def test_accept_loss_writes_it_and_says_so(graphs, tmp_path):
    out = tmp_path / "collapsed.onnx"
    result = quantize_file(graphs["outliers"], out, "int8", int8=modelopt(graphs),
                           gate=GateConfig(images=100, node_images=4, accept_loss=True))
    check = result["check"]
    assert out.is_file() and check["accepted_loss"] and not check["passed"] and check["nodes"]
    recorded = json.loads(metadata(out)["edge.accuracy_gate"])
    assert recorded["accepted_loss"] is True and recorded["passed"] is False
    assert recorded["top1_agreement"] == check["top1_agreement"] and "nodes" not in recorded


def test_the_cli_refuses_with_exit_2_and_accept_loss_writes_loudly(graphs, tmp_path, capsys):
    out = tmp_path / "cli.onnx"
    command = ["quantize", str(graphs["outliers"]), "--precision", "int8", "--placement", "modelopt", "--data",
               "fmnist-mini", "--samples", str(CALIBRATION), "--cache-dir", str(graphs["cache"]), "--gate-images",
               "100", "--out", str(out)]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "below the accuracy gate" in err and "top-1 agreement" in err and "nodes adding most error" in err
    assert "Traceback" not in err and not out.exists()
    assert main([*command, "--accept-loss", "--json"]) == 0
    captured = capsys.readouterr()
    check = json.loads(captured.out)["check"]
    assert check["accepted_loss"] is True and check["passed"] is False and check["failures"]
    assert "WARNING" in captured.err and "--accept-loss" in captured.err and out.is_file()


# a quantization that keeps accuracy
def test_a_passing_graph_prints_and_records_its_figures(graphs, tmp_path, capsys):
    out = tmp_path / "ref.fp16.onnx"
    assert main(["quantize", str(graphs["reference"]), "--precision", "fp16", "--no-range-check", "--gate-images",
                 "100", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "accuracy gate passed: against float32 on 100 held-out images of fmnist-mini:test" in printed
    assert "logits: top-1 agreement 1.000, max abs" in printed and "rel L2" in printed
    recorded = json.loads(metadata(out)["edge.accuracy_gate"])
    assert recorded["passed"] and not recorded["accepted_loss"] and recorded["images"] == 100
    assert recorded["thresholds"] == THRESHOLDS["fp16"].to_json()
    logits = recorded["per_output"]["logits"]
    assert logits["top1_agreement"] == 1.0 and 0 < logits["rel_l2"] < THRESHOLDS["fp16"].max_rel_l2
    assert logits["mean_abs"] <= logits["max_abs"]


def test_the_bundle_carries_the_graphs_gate_figures_to_the_device(graphs, tmp_path):
    from edge.bundle import BundleConfig, make_bundle
    from jetson.accuracy_gate import gate_engine
    from jetson.bundle import Protocol, read_bundle

    out = tmp_path / "bundle"
    make_bundle([graphs["reference"]], out, BundleConfig(precisions=("fp32", "fp16"), gate_images=8, samples=64,
                                                         protocol=Protocol(iterations=10)))
    by_precision = {v.precision: v for v in read_bundle(out).variants}
    assert by_precision["fp32"].gate.host is None  # the float32 graph itself: nothing to compare
    host = by_precision["fp16"].gate.host
    assert host == json.loads(metadata(out / by_precision["fp16"].graph)["edge.accuracy_gate"])
    assert host["passed"] and host["images"] == 500 and host["data"] == by_precision["fp16"].gate.data

    class OnnxRuntimeEngine:  # the device's gate, run here on the fp16 graph in place of its engine
        batch = None

        def __init__(self, path):
            from edge.check.compare import ort_session

            self.session = ort_session(str(path))

        def run(self, feeds):
            names = [o.name for o in self.session.get_outputs()]
            return dict(zip(names, self.session.run(None, feeds), strict=True))

    engine = OnnxRuntimeEngine(out / by_precision["fp16"].graph)
    engine.batch = 8
    accuracy = gate_engine(engine, by_precision["fp16"].gate, out, "reference.fp16")
    assert accuracy["host"] == host
    assert accuracy["versus_host"] == {"device_top1_agreement": 1.0, "host_top1_agreement": host["top1_agreement"],
                                       "host_images": 500, "difference": 1.0 - host["top1_agreement"]}


def test_per_node_errors_of_a_smoothquant_graph_compare_with_the_smoothed_float_graph(tmp_path):
    """SmoothQuant divides each LayerNorm output channel by its scale (folded into the next GEMM): against the
    unsmoothed float graph every smoothed LayerNorm would look like the node adding most error."""
    from calib.qdq import Calibration, QdqConfig, quantize_int8
    from edge.precision.gate import node_errors
    from tests.calib.test_placement import HEAD, block_graph, images

    original = block_graph()
    quantized, report = quantize_int8(original, "block", QdqConfig(placement="linear-sq", float_precision="float32"),
                                      Calibration(images, {"images": "block test"}, tmp_path), head=HEAD)
    smoothed = report["smoothed_float_graph"]
    x = images(8)
    against_original = {n["node"]: n for n in node_errors(original, quantized, x, top=100)}
    against_smoothed = {n["node"]: n for n in node_errors(smoothed, quantized, x, top=100)}
    assert against_original["norm1"]["added"] > 0.5          # the rescaling, not an error
    assert against_smoothed["norm1"]["added"] < 1e-3          # the same LayerNorm, exact in float32
    worst = max(against_smoothed.values(), key=lambda n: n["added"])
    assert worst["op"] != "LayerNormalization"


def test_the_float32_graph_runs_once_for_two_conversions_and_again_when_the_file_changes(graphs, tmp_path,
                                                                                        monkeypatch):
    """edge pipeline converts one float32 graph twice (fp16, then int8): the second gate reuses the first one's
    float32 outputs (same graph content, same images; the key holds no precision); a file rewritten with other
    weights is run again, the same content at another path is not."""
    import shutil

    from edge.precision import quantize

    runs = []
    real = quantize.run_graph
    monkeypatch.setattr(quantize, "run_graph", lambda model, inputs: runs.append(len(inputs)) or real(model, inputs))
    monkeypatch.setattr(quantize, "_REFERENCE_OUTPUTS", type(quantize._REFERENCE_OUTPUTS)())
    source = tmp_path / "source.onnx"
    shutil.copyfile(graphs["reference"], source)
    gate = GateConfig(images=16, accept_loss=True)
    first = quantize_file(source, tmp_path / "a.onnx", "fp16", gate=gate, check_data="fmnist-mini")
    second = quantize_file(source, tmp_path / "b.onnx", "fp16", gate=gate, check_data="fmnist-mini")
    assert runs == [16]
    assert first["check"]["per_output"] == second["check"]["per_output"]
    assert first["check"]["per_output"]["logits"]["top1_agreement"] > 0.9
    shutil.copyfile(graphs["outliers"], source)    # other weights at the same path: its own float32 outputs
    outliers = quantize_file(source, tmp_path / "c.onnx", "fp16", gate=gate, check_data="fmnist-mini")
    assert runs == [16, 16]
    moved = quantize_file(graphs["outliers"], tmp_path / "d.onnx", "fp16", gate=gate, check_data="fmnist-mini")
    assert runs == [16, 16]   # the same content from another path: reused
    assert outliers["check"]["per_output"] == moved["check"]["per_output"]
    assert outliers["check"]["per_output"] != first["check"]["per_output"]


def _linear(batch) -> onnx.ModelProto:
    weight = np.random.default_rng(1).standard_normal((16, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("omp", ["1", "2", None])
def test_the_gate_runs_a_graph_in_calls_at_once_in_the_images_order(monkeypatch, omp):
    from edge.precision.gate import RUN_BATCH, run_graph

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    inputs = np.random.default_rng(2).standard_normal((2 * RUN_BATCH + 22, 16)).astype(np.float32)
    expected = inputs @ numpy_helper.to_array(_linear(None).graph.initializer[0])
    dynamic = run_graph(_linear("batch"), inputs)["y"]      # three calls: 64, 64 and 22 images
    assert dynamic.shape == expected.shape
    np.testing.assert_allclose(dynamic, expected, rtol=1e-5, atol=1e-5)
    static = run_graph(_linear(8), inputs)["y"]             # whole batches of 8: the last 6 images left out
    assert static.shape == (len(inputs) // 8 * 8, 3)
    np.testing.assert_allclose(static, dynamic[: len(static)], rtol=1e-6, atol=1e-6)
