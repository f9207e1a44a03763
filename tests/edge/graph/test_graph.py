import collections
import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import edge.graph.passes
from edge.check.compare import ort_session, run_ort
from edge.cli import build_parser, main
from edge.errors import EdgeError, InternalError
from edge.graph import DEFAULT_PASSES, PASSES, InPlacePass, PassRegistry, PassResult, clean_graph
from edge.graph.util import bypass, same_op_pairs

RNG = np.random.default_rng(0)


def make_model(nodes, inits, shape=(2, 3, 4), out_shape=None, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape or shape))],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def check_pass(model, graph_pass, expect_ops):
    """Run one pass (with the manager's checks); outputs must match and the ops must be as expected."""
    x = RNG.standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    before = run_ort(ort_session(model.SerializeToString()), x)
    cleaned, report = clean_graph(model, passes=(graph_pass,))
    after = run_ort(ort_session(cleaned.SerializeToString()), x)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    assert collections.Counter(n.op_type for n in cleaned.graph.node) == collections.Counter(expect_ops)
    assert report.nodes_after < report.nodes_before
    return cleaned


def test_remove_noops():
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Dropout", ["a"], ["b"]),
             helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["c", "same"], ["d"]),
             helper.make_node("Mul", ["d", "one"], ["e"]),
             helper.make_node("Add", ["zero", "e"], ["f"]),
             helper.make_node("Relu", ["f"], ["y"])]
    model = make_model(nodes, {"same": np.array([2, 3, 4], np.int64), "one": np.ones(1, np.float32),
                               "zero": np.zeros(4, np.float32)})
    model = onnx.shape_inference.infer_shapes(model)
    check_pass(model, PASSES["remove-noops"], ["Relu"])


def test_broadcasting_mul_by_one_is_kept():
    model = onnx.shape_inference.infer_shapes(make_model(
        [helper.make_node("Mul", ["x", "ones"], ["y"])], {"ones": np.ones((2, 2, 3, 4), np.float32)},
        out_shape=(2, 2, 3, 4)))
    cleaned, report = clean_graph(model, passes=(PASSES["remove-noops"],))
    assert [n.op_type for n in cleaned.graph.node] == ["Mul"] and report.passes["remove-noops"].changes == 0


def test_inverse_transposes_cancel_and_others_merge():
    inverse = make_model([helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 1]),
                          helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
                          helper.make_node("Relu", ["b"], ["y"])], {})
    check_pass(inverse, PASSES["cancel-transposes"], ["Relu"])
    chain = make_model([helper.make_node("Transpose", ["x"], ["a"], perm=[1, 0, 2]),
                        helper.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 1])], {}, out_shape=(3, 4, 2))
    cleaned = check_pass(chain, PASSES["cancel-transposes"], ["Transpose"])
    assert list(cleaned.graph.node[0].attribute[0].ints) == [1, 2, 0]


def test_reshape_chain_merges():
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                        helper.make_node("Reshape", ["a", "s2"], ["y"])],
                       {"s1": np.array([6, 4], np.int64), "s2": np.array([2, 12], np.int64)}, out_shape=(2, 12))
    check_pass(model, PASSES["merge-reshapes"], ["Reshape"])


def test_consecutive_linear_maps_fold_into_one():
    w1, b1 = RNG.standard_normal((4, 5)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    w2, b2 = RNG.standard_normal((5, 4)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Add", ["a", "b1"], ["b"]),
                        helper.make_node("MatMul", ["b", "w2"], ["c"]), helper.make_node("Add", ["b2", "c"], ["y"])],
                       {"w1": w1, "b1": b1, "w2": w2, "b2": b2})
    check_pass(model, PASSES["fold-linear-chains"], ["MatMul", "Add"])
    no_bias = make_model([helper.make_node("MatMul", ["x", "w1"], ["a"]),
                          helper.make_node("MatMul", ["a", "w2"], ["y"])], {"w1": w1, "w2": w2})
    check_pass(no_bias, PASSES["fold-linear-chains"], ["MatMul"])


def test_nonlinear_between_blocks_the_fold():
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("MatMul", ["b", "w2"], ["y"])], {"w1": w, "w2": w})
    cleaned, report = clean_graph(model, passes=(PASSES["fold-linear-chains"],))
    assert [n.op_type for n in cleaned.graph.node] == ["MatMul", "Relu", "MatMul"]


def test_scalar_scales_fold_into_weights():
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    before = make_model([helper.make_node("Mul", ["x", "c"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])],
                        {"c": np.array(0.125, np.float32), "w": w})
    check_pass(before, PASSES["fold-scalar-scales"], ["MatMul"])
    after = make_model([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Div", ["a", "c"], ["y"])],
                       {"c": np.array(3.0, np.float32), "w": w})
    check_pass(after, PASSES["fold-scalar-scales"], ["MatMul"])


def test_static_shape_arithmetic_folds_to_one_reshape():
    """Shape -> Slice -> Concat -> Reshape on a tensor whose shape only inference knows (no value_info)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Slice", ["s", "start", "end"], ["head"]),
             helper.make_node("Concat", ["head", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    model = make_model(nodes, {"start": np.array([0], np.int64), "end": np.array([1], np.int64),
                               "minus_one": np.array([-1], np.int64)}, out_shape=(2, 12))
    assert not model.graph.value_info
    cleaned = check_pass(model, PASSES["fold-constants"], ["Relu", "Reshape"])
    target = {t.name: numpy_helper.to_array(t) for t in cleaned.graph.initializer}[cleaned.graph.node[1].input[1]]
    assert target.tolist() == [2, -1]


def test_layer_scale_folds_into_the_linear_map():
    w, b = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
    gamma = RNG.uniform(0.5, 2.0, 6).astype(np.float32)
    after_bias = make_model([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Add", ["b", "a"], ["c"]),
                             helper.make_node("Mul", ["gamma", "c"], ["d"]), helper.make_node("Relu", ["d"], ["y"])],
                            {"w": w, "b": b, "gamma": gamma}, out_shape=(2, 3, 6))
    check_pass(after_bias, PASSES["fold-channel-scales"], ["MatMul", "Add", "Relu"])
    divided = make_model([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Div", ["a", "s"], ["y"])],
                         {"w": w, "s": gamma.reshape(1, 1, 6)}, out_shape=(2, 3, 6))
    check_pass(divided, PASSES["fold-channel-scales"], ["MatMul"])


@pytest.mark.parametrize("scale", [RNG.uniform(0.5, 2.0, (3, 1)).astype(np.float32),  # over tokens, not channels
                                   np.array([1.0, 0.0, 2.0, 1.0, 1.0, 1.0], np.float32)])  # a zero channel
def test_scales_that_are_not_per_output_channel_are_kept(scale):
    w = RNG.standard_normal((4, 6)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "s"], ["y"])],
                       {"w": w, "s": scale}, out_shape=(2, 3, 6))
    cleaned, report = clean_graph(model, passes=(PASSES["fold-channel-scales"],))
    assert [n.op_type for n in cleaned.graph.node] == ["MatMul", "Mul"]
    assert report.passes["fold-channel-scales"].changes == 0


@pytest.mark.parametrize("half_first", [False, True])
def test_erf_gelu_is_left_for_the_runtime_to_fuse(tmp_path, half_first):
    """The 0.5 of x * 0.5 * (1 + erf(x / sqrt 2)) is not folded into the next MatMul: ORT fuses the pattern."""
    import onnxruntime as ort

    w1, w2 = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal((8, 4)).astype(np.float32)
    gelu = [helper.make_node("Div", ["h", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["f"])]
    if half_first:
        gelu += [helper.make_node("Mul", ["h", "half"], ["hh"]), helper.make_node("Mul", ["hh", "f"], ["g"])]
    else:
        gelu += [helper.make_node("Mul", ["h", "f"], ["m"]), helper.make_node("Mul", ["m", "half"], ["g"])]
    model = make_model([helper.make_node("MatMul", ["x", "w1"], ["h"]), *gelu,
                        helper.make_node("MatMul", ["g", "w2"], ["y"])],
                       {"w1": w1, "w2": w2, "sqrt2": np.array(np.sqrt(2), np.float32),
                        "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)})
    cleaned, _ = clean_graph(model, passes=DEFAULT_PASSES)
    assert collections.Counter(n.op_type for n in cleaned.graph.node) == \
        collections.Counter(["MatMul", "Div", "Erf", "Add", "Mul", "Mul", "MatMul"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(cleaned.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node].count("Gelu") == 1


def _linear_layer(before, after, bias=True, shape=(2, 12), scale=None):
    """x -> Reshape to (2, 3, 4) | Relu -> MatMul(W 4x6) [-> Add b] [-> Mul scale] -> Reshape to (2, 3, 2, 3) | Relu."""
    rng = np.random.default_rng(1)
    inits = {"w": rng.standard_normal((4, 6)).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32),
             "s": np.array([2, 3, 4], np.int64), "t": np.array([2, 3, 2, 3], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "s"], ["a"]) if before == "Reshape" else
             helper.make_node("Relu", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["m"])]
    last = "m"
    if bias:
        nodes.append(helper.make_node("Add", ["b", "m"], ["m_b"]))
        last = "m_b"
    if scale is not None:
        inits["gamma"] = scale
        nodes.append(helper.make_node("Mul", [last, "gamma"], ["m_s"]))
        last = "m_s"
    nodes.append(helper.make_node("Reshape", [last, "t"], ["y"]) if after == "Reshape" else
                 helper.make_node("Relu", [last], ["y"]))
    return make_model(nodes, inits, shape=shape, out_shape=(2, 3, 2, 3) if after == "Reshape" else (2, 3, 6))


def _clean_and_compare(model, passes):
    x = np.random.default_rng(2).standard_normal([d.dim_value or 2 for d in
                                                  model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    cleaned, report = clean_graph(model, passes=passes)
    onnx.checker.check_model(cleaned, full_check=True)
    np.testing.assert_allclose(run_ort(ort_session(cleaned.SerializeToString()), x),
                               run_ort(ort_session(model.SerializeToString()), x), rtol=1e-5, atol=1e-5)
    assert report.nodes_after <= report.nodes_before
    return [n.op_type for n in cleaned.graph.node], report


@pytest.mark.parametrize("before,after,expect", [
    ("Reshape", "Reshape", ["Reshape", "Gemm", "Reshape"]),  # both new Reshapes merge: 4 nodes -> 3
    ("Relu", "Reshape", ["Relu", "Reshape", "Gemm", "Reshape"]),  # qkv projection: 4 -> 4
    ("Reshape", "Relu", ["Reshape", "Gemm", "Reshape", "Relu"])])  # output projection: 4 -> 4
def test_linear_layer_next_to_a_reshape_becomes_gemm(before, after, expect):
    model = _linear_layer(before, after, shape=(2, 12) if before == "Reshape" else (2, 3, 4))
    ops, _ = _clean_and_compare(model, (PASSES["linear-to-gemm"], PASSES["merge-reshapes"]))
    assert ops == expect


def test_mlp_runs_on_rows_between_one_pair_of_reshapes():
    """fc1 -> erf GELU -> fc2 on [2, 3, 4]: Reshape -> Gemm -> GELU -> Gemm -> Reshape (2 Adds pay for 2 Reshapes)."""
    rng = np.random.default_rng(5)
    inits = {"w1": rng.standard_normal((4, 8)).astype(np.float32), "b1": rng.standard_normal(8).astype(np.float32),
             "w2": rng.standard_normal((8, 4)).astype(np.float32), "b2": rng.standard_normal(4).astype(np.float32),
             "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    gelu = ["Div", "Erf", "Add", "Mul", "Mul"]
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("MatMul", ["r", "w1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["h"]),
                        helper.make_node("Div", ["h", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                        helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["h", "f"], ["g0"]),
                        helper.make_node("Mul", ["g0", "half"], ["g"]),
                        helper.make_node("MatMul", ["g", "w2"], ["n"]), helper.make_node("Add", ["n", "b2"], ["o"]),
                        helper.make_node("Relu", ["o"], ["y"])], inits)
    ops, report = _clean_and_compare(model, DEFAULT_PASSES)
    assert ops == ["Relu", "Reshape", "Gemm", *gelu, "Gemm", "Reshape", "Relu"]
    assert report.nodes_after == report.nodes_before


@pytest.mark.parametrize("case", ["no reshape", "no bias, one reshape", "dynamic batch", "scale after"])
def test_linear_layers_left_alone(case):
    if case == "no reshape":  # the runtime fuses MatMul + Add itself
        model = _linear_layer("Relu", "Relu", shape=(2, 3, 4))
    elif case == "no bias, one reshape":  # Reshape -> Gemm -> Reshape would be one node more
        model = _linear_layer("Relu", "Reshape", bias=False, shape=(2, 3, 4))
    elif case == "dynamic batch":
        model = _linear_layer("Relu", "Reshape", shape=("batch", 3, 4))
    else:  # a constant scale next to the layer belongs to fold-channel-scales first
        model = _linear_layer("Reshape", "Reshape", scale=np.full(6, 0.5, np.float32))
    ops, report = _clean_and_compare(model, (PASSES["linear-to-gemm"], PASSES["merge-reshapes"]))
    assert "Gemm" not in ops and report.nodes_after == report.nodes_before
    assert report.passes["linear-to-gemm"].changes == 0


@pytest.mark.parametrize("case", ["layer scale", "linear chain"])
def test_linear_to_gemm_waits_for_the_folding_passes(case):
    """With all passes, whatever the order: fold the scale / chain into one linear map first, then Gemm."""
    if case == "layer scale":
        scale = np.random.default_rng(4).uniform(0.5, 2.0, 6).astype(np.float32)
        model = _linear_layer("Reshape", "Reshape", scale=scale)
    else:
        rng = np.random.default_rng(3)
        inits = {"w1": rng.standard_normal((4, 5)).astype(np.float32), "b1": rng.standard_normal(5).astype(np.float32),
                 "w2": rng.standard_normal((5, 6)).astype(np.float32), "b2": rng.standard_normal(6).astype(np.float32),
                 "s": np.array([2, 3, 4], np.int64), "t": np.array([2, 3, 2, 3], np.int64)}
        model = make_model([helper.make_node("Reshape", ["x", "s"], ["a"]),
                            helper.make_node("MatMul", ["a", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["i"]),
                            helper.make_node("MatMul", ["i", "w2"], ["j"]), helper.make_node("Add", ["j", "b2"], ["k"]),
                            helper.make_node("Reshape", ["k", "t"], ["y"])],
                           inits, shape=(2, 12), out_shape=(2, 3, 2, 3))
    for passes in (DEFAULT_PASSES, DEFAULT_PASSES[::-1]):
        ops, _ = _clean_and_compare(model, passes)
        assert ops == ["Reshape", "Gemm", "Reshape"]


def _negate_first_weight(graph) -> bool:
    """A deliberately wrong pass: it negates the first MatMul weight (the manager must catch it)."""
    import onnx_graphsurgeon as gs

    for node in graph.nodes:
        if node.op == "MatMul" and isinstance(node.inputs[1], gs.Constant):
            node.inputs[1] = gs.Constant(node.inputs[1].name + "_neg", -node.inputs[1].values)
            return True
    return False


CORRUPTING_PASS = InPlacePass("corrupt-weights", "negate the first MatMul weight", _negate_first_weight)


def test_a_pass_that_changes_numbers_is_named():
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"w": w})
    with pytest.raises(EdgeError, match="cleaning pass 'corrupt-weights' changed the model's outputs"):
        clean_graph(model, passes=(CORRUPTING_PASS,))


# ---- the pass contract and the registry ---------------------------------------------------

def test_passes_are_registered_in_the_order_each_round_runs_them():
    assert PASSES.names() == ("fold-constants", "remove-noops", "fuse-layer-norm", "cancel-transposes",
                              "linear-to-gemm", "merge-reshapes", "fold-linear-chains", "fold-scalar-scales", "fold-channel-scales")
    assert DEFAULT_PASSES == tuple(PASSES) == PASSES.select()
    kept = [p.name for p in PASSES.select(skip=["linear-to-gemm"])]
    assert kept == [n for n in PASSES.names() if n != "linear-to-gemm"]


def test_registry_refuses_a_duplicate_name():
    registry = PassRegistry()
    registry.register(CORRUPTING_PASS)
    with pytest.raises(ValueError, match="a graph pass named 'corrupt-weights' is already registered"):
        registry.register(InPlacePass("corrupt-weights", "something else", lambda graph: False))
    assert registry.names() == ("corrupt-weights",) and registry["corrupt-weights"] is CORRUPTING_PASS
    with pytest.raises(ValueError, match="'remove-noops' is already registered"):
        PASSES.register(InPlacePass("remove-noops", "a second remove-noops", lambda graph: False))
    assert len(PASSES) == 9
    with pytest.raises(TypeError, match="is not a graph pass"):
        registry.register(lambda graph: False)
    with pytest.raises(EdgeError, match="unknown pass 'nope'") as caught:
        registry.select(skip=["nope"])
    assert "expected: one of corrupt-weights" in str(caught.value)


class DropDoubleRelu:
    """A toy pass written as a class, and functional: it returns a changed copy, not the graph it got."""

    name = "drop-double-relu"
    summary = "Relu(Relu(x)) is Relu(x)"

    def __init__(self, min_opset: int | None = None) -> None:
        self.min_opset = min_opset

    def __call__(self, graph: gs.Graph) -> PassResult:
        graph = graph.copy()
        pairs = list(same_op_pairs(graph, "Relu"))
        for _, second in pairs:
            bypass(graph, second)
        return PassResult(graph, bool(pairs))


def _relu_chain():
    return make_model([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                       helper.make_node("Relu", ["b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], {})


def test_a_pass_registered_in_a_test_runs_through_the_manager():
    registry = PassRegistry()
    registry.register(PASSES["remove-noops"])
    toy = registry.register(DropDoubleRelu())
    assert isinstance(toy, edge.graph.GraphPass)
    model = _relu_chain()
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    cleaned, report = clean_graph(model, passes=registry.select())
    assert [n.op_type for n in cleaned.graph.node] == ["Relu"]
    np.testing.assert_array_equal(run_ort(ort_session(cleaned.SerializeToString()), x), np.maximum(x, 0))
    assert report.rounds == 2 and report.passes["drop-double-relu"].changes == 1
    assert report.passes["drop-double-relu"].nodes_removed == 2 and report.passes["remove-noops"].nodes_removed == 1


def test_the_manager_checks_each_pass_requirements_before_running():
    with pytest.raises(EdgeError, match="the model uses opset 17") as caught:
        clean_graph(_relu_chain(), passes=(PASSES["remove-noops"], DropDoubleRelu(min_opset=18)))
    assert "expected: opset >= 18 (pass 'drop-double-relu')" in str(caught.value)
    assert "--skip-pass drop-double-relu" in str(caught.value)
    assert clean_graph(_relu_chain(), passes=(DropDoubleRelu(min_opset=17),))[1].passes["drop-double-relu"].changes
    old = make_model([helper.make_node("Relu", ["x"], ["y"])], {}, opset=13)
    cleaned, report = clean_graph(old, passes=(), source="old.onnx")  # below the manager's minimum: upgraded
    assert [o.version for o in cleaned.opset_import] == [17] and report.upgraded["from"] == 13


def test_a_pass_that_breaks_the_contract_is_an_internal_error():
    class ReturnsABool:
        name, summary, min_opset = "returns-a-bool", "the pass contract before PassResult", None

        def __call__(self, graph):
            return False

    with pytest.raises(InternalError, match="graph pass 'returns-a-bool' returned bool, not a PassResult"):
        clean_graph(_relu_chain(), passes=(ReturnsABool(),))


def _structure(graph: gs.Graph) -> tuple:
    """The graph as the manager writes it (after cleanup), less shape annotations: nodes and initializers."""
    model = gs.export_onnx(graph.cleanup(remove_unused_graph_inputs=False).toposort(), do_type_check=False)
    return ([n.SerializeToString() for n in model.graph.node],
            sorted((t.name, numpy_helper.to_array(t).tobytes()) for t in model.graph.initializer))


# A small graph each registered pass changes; a new pass adds its case here.
PASS_CASES = {
    "fold-constants": lambda: make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
         helper.make_node("Slice", ["s", "start", "end"], ["head"]),
         helper.make_node("Concat", ["head", "minus_one"], ["target"], axis=0),
         helper.make_node("Reshape", ["r", "target"], ["y"])],
        {"start": np.array([0], np.int64), "end": np.array([1], np.int64), "minus_one": np.array([-1], np.int64)},
        out_shape=(2, 12)),
    "remove-noops": _relu_chain,
    "fuse-layer-norm": lambda: make_model(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"]),
         helper.make_node("Pow", ["d", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
         helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
         helper.make_node("Div", ["d", "s"], ["y"])],
        {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}),
    "cancel-transposes": lambda: make_model([helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 1]),
                                             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
                                             helper.make_node("Relu", ["b"], ["y"])], {}),
    "linear-to-gemm": lambda: _linear_layer("Reshape", "Reshape"),
    "merge-reshapes": lambda: make_model(
        [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["y"])],
        {"s1": np.array([6, 4], np.int64), "s2": np.array([2, 12], np.int64)}, out_shape=(2, 12)),
    "fold-linear-chains": lambda: make_model(
        [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["y"])],
        {"w1": RNG.standard_normal((4, 5)).astype(np.float32), "w2": RNG.standard_normal((5, 4)).astype(np.float32)}),
    "fold-scalar-scales": lambda: make_model(
        [helper.make_node("Mul", ["x", "c"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])],
        {"c": np.array(0.125, np.float32), "w": RNG.standard_normal((4, 4)).astype(np.float32)}),
    "fold-channel-scales": lambda: make_model(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Div", ["a", "s"], ["y"])],
        {"w": RNG.standard_normal((4, 6)).astype(np.float32), "s": RNG.uniform(0.5, 2, (1, 1, 6)).astype(np.float32)},
        out_shape=(2, 3, 6)),
}


@pytest.mark.parametrize("name", PASSES.names())
def test_every_registered_pass_reports_modified_truthfully(name):
    graph_pass, model = PASSES[name], PASS_CASES[name]()
    graph = gs.import_onnx(model)
    before = _structure(graph)
    result = graph_pass(graph)
    assert result.modified is True and _structure(result.graph) != before
    cleaned, _ = clean_graph(model)  # every pass, to a fixed point
    graph = gs.import_onnx(cleaned)
    before = _structure(graph)
    result = graph_pass(graph)
    assert result.modified is False and _structure(result.graph) == before


def test_every_registered_pass_has_a_case():
    assert set(PASS_CASES) == set(PASSES.names())


def _parse_clean(*args):
    return build_parser().parse_args(["clean", "m.onnx", "--out", "o.onnx", *args])


def test_skip_pass_choices_and_help_come_from_the_registry(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx").write_bytes(b"")  # the CLI checks at parse time that the input exists
    assert _parse_clean(*(a for n in PASSES.names() for a in ("--skip-pass", n))).skip_pass == list(PASSES.names())
    registry = PassRegistry()
    registry.register(DropDoubleRelu())
    monkeypatch.setattr(edge.graph.passes, "PASSES", registry)
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["clean", "--help"])
    assert caught.value.code == 0
    assert "\n  drop-double-relu     Relu(Relu(x)) is Relu(x)\nRounds run" in capsys.readouterr().out
    assert _parse_clean("--skip-pass", "drop-double-relu").skip_pass == ["drop-double-relu"]
    assert main(["clean", "--skip-pass", "remove-noops", "m.onnx", "--out", "o.onnx"]) == 2
    assert "argument --skip-pass: invalid choice: 'remove-noops' (choose from 'drop-double-relu')" in \
        capsys.readouterr().err


def test_skip_pass_leaves_the_pass_out(tmp_path, capsys):
    onnx.save(_relu_chain(), str(tmp_path / "m.onnx"))
    assert main(["clean", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "o.onnx"), "--json",
                 "--skip-pass", "remove-noops", "--skip-pass", "fold-constants"]) == 0
    report = json.loads(capsys.readouterr().out)["report"]
    assert list(report["passes"]) == [n for n in PASSES.names() if n not in ("remove-noops", "fold-constants")]
    assert [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node] == ["Identity", "Relu", "Relu", "Relu"]


# ---- real exports ------------------------------------------------------------------------

def _export_clean(tmp_path, model_arg, extra=()):
    raw, clean = tmp_path / "raw.onnx", tmp_path / "clean.onnx"
    assert main(["export", model_arg, "--out", str(raw), *extra]) == 0
    assert main(["clean", str(raw), "--out", str(clean)]) == 0
    return onnx.load(str(raw)), onnx.load(str(clean))


def _transpose_pairs(model):
    producers = {o: n for n in model.graph.node for o in n.output}
    pairs = 0
    for node in model.graph.node:
        if node.op_type == "Transpose" and producers.get(node.input[0]) is not None:
            first = producers[node.input[0]]
            if first.op_type == "Transpose":
                p1, p2 = list(first.attribute[0].ints), list(node.attribute[0].ints)
                pairs += [p1[i] for i in p2] == list(range(len(p1)))
    return pairs


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory):
    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ref") / "ref.safetensors"
    save_safetensors(create_model("fmnist-deit-tiny", pretrained_weights=False).state_dict(), path)
    return str(path)


def test_reference_geometry_export_clean_structure(tmp_path, reference_weights, capsys):
    raw, clean = _export_clean(tmp_path, "fmnist-deit-tiny", ("--weights", reference_weights))
    onnx.checker.check_model(clean, full_check=True)
    ops = collections.Counter(n.op_type for n in clean.graph.node)
    assert ops["Identity"] == 0 and ops["Dropout"] == 0 and _transpose_pairs(clean) == 0
    assert len(clean.graph.node) < len(raw.graph.node)
    assert {p.key for p in clean.metadata_props} == {p.key for p in raw.metadata_props}
    for graph_pass in PASSES:  # the fixed point: no pass has anything left to do, and none says it has
        graph = gs.import_onnx(clean)
        before = _structure(graph)
        result = graph_pass(graph)
        assert result.modified is False and _structure(result.graph) == before, graph_pass.name


@pytest.mark.parametrize("plan,matmuls", [("linear:9-10", 11 * 6 + 1), ("linear:8-9,linear:9-10", 10 * 6 + 1),
                                          ("affine:2-5", 9 * 6 + 1)])
def test_each_approximated_span_is_one_matmul(tmp_path, reference_weights, plan, matmuls):
    art = tmp_path / "art"
    assert main(["compress", "fmnist-deit-tiny", "--weights", reference_weights, "--plan", plan,
                 "--data", "fmnist-mini", "--samples", "100", "--out", str(art)]) == 0
    _, clean = _export_clean(tmp_path, str(art))
    ops = collections.Counter(n.op_type for n in clean.graph.node)
    # linear maps (MatMul or Gemm): 6 per kept block + 1 per span (adjacent spans fold into one) + the head
    assert ops["MatMul"] + ops["Gemm"] == matmuls + 1


def test_clean_rejects_bad_input(tmp_path, capsys):
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x01junk")
    assert main(["clean", str(tmp_path / "junk.onnx"), "--out", str(tmp_path / "o.onnx")]) == 2
    assert "is not an ONNX model" in capsys.readouterr().err
    (tmp_path / "data").mkdir()
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], {}), str(tmp_path / "data" / "model.onnx"))
    (tmp_path / "data" / "test_data_set_0").mkdir()  # stored inputs, one too many
    for k in range(2):
        onnx.save_tensor(numpy_helper.from_array(np.ones((2, 3, 4), np.float32)),
                         str(tmp_path / "data" / "test_data_set_0" / f"input_{k}.pb"))
    assert main(["clean", str(tmp_path / "data" / "model.onnx"), "--out", str(tmp_path / "o.onnx")]) == 2
    assert "test_data_set_0 holds 2 inputs" in capsys.readouterr().err and not (tmp_path / "o.onnx").exists()
    good = make_model([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], {})
    onnx.save(good, str(tmp_path / "good.onnx"))
    (tmp_path / "file").write_text("")
    assert main(["clean", str(tmp_path / "good.onnx"), "--out", str(tmp_path / "file" / "o.onnx")]) == 2
    assert "cannot write" in capsys.readouterr().err
