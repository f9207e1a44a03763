"""Range-aware float16 (issue 30 point 4): nodes whose float32 values leave float16's range stay float32.

The graphs are built by hand with edge's preprocessing metadata, so that the range check runs on
fmnist-mini images: Reshape -> MatMul (+ bias) -> a LayerNorm written out with Mul(d, d) (not in
the op block list, and not fused: the range check has to cope with graphs as they come) ->
MatMul -> mean over tokens. "massive": one channel of the first MatMul reaches ~1e5 (beyond
float16); "square": every value stays below 65504 but the variance's squares pass it.

Float16 graphs are run with onnx's reference evaluator (numpy, each op in the graph's types):
ONNX Runtime's CPU provider runs ops that have no float16 kernel in float32 and drops the Cast
pairs between them, so it does not show a float16 overflow (test below), whereas TensorRT does.
"""

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.check.compare import ort_session
from edge.cli import main
from edge.errors import EdgeError
from edge.onnx_metadata import graph_metadata
from edge.precision.fp16 import FP16_MAX, Fp16Config, convert_to_fp16, name_nodes
from edge.precision.fp16_ranges import KeptNode, RangeCheck, nodes_beyond_fp16
from edge.precision.quantize import quantize_file, range_checked

#: float16 keeps 11 significant bits (relative rounding 4.9e-4); a dozen roundings deep, 1 % of the
#: output's norm is the bound a float16 graph is held to here (float32 graphs: 1e-5)
FP16_REL_L2 = 1e-2
DATA_CONFIG = {"input_size": (1, 28, 28), "mean": (0.286,), "std": (0.353,)}
RANGES = RangeCheck(data="fmnist-mini", samples=32)


def outlier_graph(kind: str, metadata: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((28, 16)).astype(np.float32)
    if kind == "massive":  # channel 0 sums a row of pixels 4000 times: |h| ~ 9e4 on background rows
        w1[:, 0] = 4000.0
    else:  # |h| up to ~1e3: within float16, its square is not
        w1 = w1 * 40.0
        w1[:, 0] = 20.0
    inits = {"shape": np.array([-1, 28, 28], np.int64), "w1": w1, "b1": rng.standard_normal(16).astype(np.float32),
             "eps": np.array(1e-5, np.float32), "w2": rng.standard_normal((16, 10)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["rows"], name="rows"),
             helper.make_node("MatMul", ["rows", "w1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1_bias"),
             helper.make_node("ReduceMean", ["h"], ["m"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["h", "m"], ["d"], name="centre"),
             helper.make_node("Mul", ["d", "d"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["v"], name="variance", axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"], name="plus_eps"),
             helper.make_node("Sqrt", ["ve"], ["s"], name="std"),
             helper.make_node("Div", ["d", "s"], ["n"], name="normalise"),
             helper.make_node("MatMul", ["n", "w2"], ["t"], name="fc2"),
             helper.make_node("ReduceMean", ["t"], ["y"], name="pool", axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "outliers", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["batch", 1, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    if metadata:
        for key, value in graph_metadata("outliers", None, DATA_CONFIG).items():
            model.metadata_props.add(key=key, value=value)
    return model


def real_images(count: int = 64) -> np.ndarray:
    from edge.data import ArrayPreprocess, InputSpec, load_dataset

    spec = InputSpec(*DATA_CONFIG["input_size"], DATA_CONFIG["mean"], DATA_CONFIG["std"], "bilinear")
    return ArrayPreprocess(spec)(load_dataset("fmnist-mini", "test").images[:count]).numpy().astype(np.float32)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime (CPU): the float32 reference."""
    return ort_session(model.SerializeToString()).run(None, {"x": x})[0].astype(np.float64)


def run_float16(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnx's reference evaluator: float16 ops computed and rounded in float16, overflowing as on a GPU."""
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "overflow encountered": what is shown here
        return ReferenceEvaluator(model).run(None, {"x": x})[0].astype(np.float64)


def rel_l2(reference: np.ndarray, candidate: np.ndarray) -> float:
    if not np.isfinite(candidate).all():
        return float("inf")
    return float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference))


@pytest.mark.parametrize("kind,kept", [
    ("massive", {"fc1": "its output h0", "fc1_bias": "its output h", "mean": "reads h", "centre": "its output d",
                 "square": "its square sq", "variance": "its output v", "plus_eps": "its output ve",
                 "std": "its output s", "normalise": "reads d"}),
    ("square", {"square": "its square sq", "variance": "its output v", "plus_eps": "its output ve",
                "std": "reads ve"}),
])
def test_activations_beyond_float16_stay_float32(tmp_path, kind, kept):
    """Issue 30's acceptance: naive float16 disagrees with float32; edge's keeps the named nodes and agrees."""
    model = outlier_graph(kind)
    x = real_images()
    reference = run(model, x)
    naive, _ = convert_to_fp16(model, Fp16Config())  # op types only: Mul(d, d) and the MatMul are float16
    assert rel_l2(reference, run_float16(naive, x)) > 0.5  # inf/NaN ("massive"), the norm's output lost ("square")

    onnx.save(model, str(tmp_path / "fp32.onnx"))
    result = quantize_file(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx", "fp16", ranges=RANGES)
    check = result["range_check"]
    assert check["done"] and check["samples"] == 32 and check["margin"] == 2.0
    assert {k["node"]: k["reason"][:len(kept[k["node"]])] for k in check["kept"]} == kept
    assert set(kept) <= set(result["fp32_nodes"])
    converted = onnx.load(str(tmp_path / "fp16.onnx"))
    recorded = json.loads({p.key: p.value for p in converted.metadata_props}["edge.fp16_range_check"])
    assert recorded == {"done": True, "data": "fmnist-mini", "samples": 32, "seed": 0, "margin": 2.0,
                        "kept": list(kept)}
    assert rel_l2(reference, run_float16(converted, x)) <= FP16_REL_L2
    assert result["check"]["top1_agreement"] == 1.0
    inferred = onnx.shape_inference.infer_shapes(converted)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    assert types["t"] == TensorProto.FLOAT16  # fc2, which the check did not flag, is still float16


def test_onnx_runtime_cpu_does_not_show_float16_overflow(tmp_path):
    """Why the check measures float32 ranges instead of trusting the output check: without it the
    "massive" graph is written (ONNX Runtime's CPU provider computes its float16 ops in float32 and
    agrees with float32), though in float16 its outputs are inf."""
    onnx.save(outlier_graph("massive"), str(tmp_path / "fp32.onnx"))
    result = quantize_file(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx", "fp16", ranges=None,
                           check_data="fmnist-mini")
    assert result["check"]["finite"] and result["check"]["top1_agreement"] == 1.0
    assert not np.isfinite(run_float16(onnx.load(str(tmp_path / "fp16.onnx")), real_images(8))).all()


def test_a_graph_without_edge_metadata_gets_no_range_check():
    """fp16 of a graph from another exporter keeps working as before, and says no range check was done."""
    model = outlier_graph("square", metadata=False)
    name_nodes(model.graph)
    config, check = range_checked(model, "foreign.onnx", Fp16Config(), RANGES)
    assert config == Fp16Config() and not check["done"]
    assert check["reason"].startswith("foreign.onnx records no input size, mean and std")
    with pytest.raises(EdgeError, match="range margin 0.5"):
        range_checked(model, "foreign.onnx", Fp16Config(), RangeCheck(margin=0.5))
    _, check = range_checked(model, "foreign.onnx", Fp16Config(), None)
    assert check == {"done": False,
                     "reason": "not asked (--no-range-check, or no RangeCheck given): op types and the head only"}


@pytest.mark.parametrize("margin,value,expect", [(2.0, FP16_MAX / 2 * 1.01, True), (2.0, FP16_MAX / 2 * 0.99, False),
                                                 (1.0, FP16_MAX * 0.99, False), (4.0, FP16_MAX / 4 * 1.01, True)])
def test_the_margin_applies_to_outputs_and_squared_to_squares(margin, value, expect):
    model = outlier_graph("square", metadata=False)
    ranges = {"rows": 2.0, "h0": value, "h": 1.0, "m": 1.0, "d": 1.0, "sq": 1.0, "v": 1.0, "ve": 1.0, "s": 1.0,
              "n": 1.0, "t": 1.0, "y": 1.0}
    kept = {k.node for k in nodes_beyond_fp16(model, ranges, margin)}
    assert kept == ({"fc1", "fc1_bias"} if expect else set())
    ranges.update(h0=1.0, d=np.sqrt(FP16_MAX) / margin * 1.01, sq=FP16_MAX / margin ** 2 * 1.01)  # x^2 with x margin
    assert [k.node for k in nodes_beyond_fp16(model, ranges, margin)][:1] == ["square"]


def test_a_layer_norm_is_kept_when_its_input_squared_leaves_float16():
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["y"], name="norm", axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "g")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (kept,) = nodes_beyond_fp16(model, {"x": 200.0, "y": 1.0})
    assert kept == KeptNode("norm", "LayerNormalization", "x", 200.0, kept.reason)
    assert kept.reason.startswith("its variance squares x (max |x| 200")
    assert nodes_beyond_fp16(model, {"x": 100.0, "y": 1.0}) == []  # (2 x 100)^2 < 65504


def test_cli_prints_and_lists_the_kept_nodes(tmp_path, capsys):
    onnx.save(outlier_graph("massive"), str(tmp_path / "fp32.onnx"))
    args = ["quantize", str(tmp_path / "fp32.onnx"), "--precision", "fp16", "--data", "fmnist-mini",
            "--samples", "32", "--out", str(tmp_path / "fp16.onnx")]
    assert main([*args, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["range_check"]["kept"]
    assert [k["node"] for k in listed][:2] == ["fc1", "fc1_bias"] and not listed[0]["kept_anyway"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "range check on 32 samples of fmnist-mini (margin 2x" in out
    assert "9 nodes beyond float16's range, 6 of them kept float32 by this check alone:" in out
    assert "\n  fc1 (MatMul): its output h0 reaches " in out
    assert main([*args, "--no-range-check"]) == 0
    assert "note: no range check was done: not asked (--no-range-check" in capsys.readouterr().out
