"""`edge clean` on graphs `edge export` did not write (issue 13, finding 17): old opsets and IR
versions, several inputs and outputs, integer inputs, dynamic shapes, operators ONNX Runtime
lacks, and the onnx package's own backend test graphs. Each is cleaned and verified, or refused
with a reason the user can act on; never a traceback, never "report this as a bug".
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.check.compare import ort_session
from edge.check.feeds import input_sets
from edge.cli import main
from edge.errors import EdgeError
from edge.graph.clean import clean_file
from tests.edge.graph.onnx_backend_data import DATA, backend_models, clean_outcome, label

RNG = np.random.default_rng(0)


def _value(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _save(model, folder, inputs=None, outputs=None):
    """``folder/model.onnx``, with ``test_data_set_0`` holding ``inputs`` (and ``outputs``) if given."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    for kind, tensors in (("input", inputs), ("output", outputs)):
        if tensors is not None:
            (folder / "test_data_set_0").mkdir(exist_ok=True)
            for k, array in enumerate(tensors):
                onnx.save_tensor(numpy_helper.from_array(array), str(folder / "test_data_set_0" / f"{kind}_{k}.pb"))
    return folder / "model.onnx"


def _conv_pad_ir3():
    """An opset 9, IR 3 graph as old exporters wrote it: every weight is a graph input too, Pad
    takes its pads as an attribute (an input from opset 11 on: the upgrade adds an initializer)."""
    weights = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "b": RNG.standard_normal(4).astype(np.float32)}
    nodes = [helper.make_node("Pad", ["x"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1]),
             helper.make_node("Conv", ["p", "w", "b"], ["c"], kernel_shape=[3, 3]),
             helper.make_node("Identity", ["c"], ["i"]),
             helper.make_node("Relu", ["i"], ["y"])]
    graph = helper.make_graph(nodes, "old", [_value("x", TensorProto.FLOAT, [1, 3, 8, 8])] +
                              [_value(k, TensorProto.FLOAT, list(v.shape)) for k, v in weights.items()],
                              [_value("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)


def test_an_old_opset_and_ir_version_graph_is_upgraded_checked_and_cleaned(tmp_path, capsys):
    path = _save(_conv_pad_ir3(), tmp_path / "old")
    assert main(["clean", str(path), "--out", str(tmp_path / "c.onnx")]) == 0
    out = capsys.readouterr().out
    assert "note: upgraded from opset 9 to 17 with onnx.version_converter" in out and "its own outputs" in out
    clean = onnx.load(str(tmp_path / "c.onnx"))
    onnx.checker.check_model(clean, full_check=True)  # "w in initializer but not in graph input" at IR 3
    assert [o.version for o in clean.opset_import] == [17] and clean.ir_version >= 8
    assert [i.name for i in clean.graph.input] == ["x"] and "Identity" not in {n.op_type for n in clean.graph.node}
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(ort_session(str(tmp_path / "c.onnx")).run(None, {"x": x})[0],
                               ort_session(str(path)).run(None, {"x": x})[0], rtol=0, atol=1e-5)


def test_an_ir3_graph_at_opset_17_gets_the_ir_version_its_opset_needs(tmp_path):
    """As the issue's graphs upgraded to opset 17 by hand: IR 3 stays, weights are graph inputs too.
    onnx-graphsurgeon writes weights as initializers only, which IR 3 forbids."""
    model = _conv_pad_ir3()
    model.graph.node.remove(model.graph.node[0])
    model.graph.node[0].input[0] = "x"
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 17))
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 6
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 6
    result = clean_file(_save(model, tmp_path / "ir3"), tmp_path / "c.onnx")
    clean = onnx.load(str(tmp_path / "c.onnx"))
    onnx.checker.check_model(clean, full_check=True)
    assert clean.ir_version >= 8 and result["report"]["upgraded"] is None
    assert [i.name for i in clean.graph.input] == ["x"] and {t.name for t in clean.graph.initializer} == {"w", "b"}


def _average_pool_opset6():
    """AveragePool-1, which ONNX Runtime no longer implements."""
    graph = helper.make_graph([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                              "pool", [_value("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [_value("y", TensorProto.FLOAT, [1, 2, 2, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)], ir_version=3)


def test_an_upgrade_onnx_runtime_cannot_compare_is_checked_against_stored_outputs(tmp_path, capsys):
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    pooled = x.reshape(1, 2, 2, 2, 2, 2).mean(axis=(3, 5))
    path = _save(_average_pool_opset6(), tmp_path / "stored", [x], [pooled])
    assert main(["clean", str(path), "--out", str(tmp_path / "c.onnx")]) == 0
    assert "against the outputs stored with it" in capsys.readouterr().out
    np.testing.assert_allclose(ort_session(str(tmp_path / "c.onnx")).run(None, {"x": x})[0], pooled, atol=1e-6)

    bare = _save(_average_pool_opset6(), tmp_path / "bare")
    with pytest.raises(EdgeError, match="ONNX Runtime cannot run .* at opset 6, so its upgrade to opset 17 cannot be "
                                        "checked") as caught:
        clean_file(bare, tmp_path / "c2.onnx")
    assert "output_0.pb" in caught.value.fix and not (tmp_path / "c2.onnx").exists()

    wrong = _save(_average_pool_opset6(), tmp_path / "wrong", [x], [pooled + 0.1])
    with pytest.raises(EdgeError, match="changes its outputs beyond tolerance \\(compared with the outputs stored"):
        clean_file(wrong, tmp_path / "c3.onnx")


def _fake_converter_that_drifts(real):
    """A fake onnx.version_converter.convert_version: the real one, then the first weight scaled by 1.01."""
    def convert(model, target):
        converted = real(model, target)
        first = converted.graph.initializer[0]
        first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 1.01, first.name))
        return converted
    return convert


def test_an_upgrade_that_changes_the_outputs_is_refused(tmp_path, monkeypatch):
    path = _save(_conv_pad_ir3(), tmp_path / "old")
    monkeypatch.setattr(onnx.version_converter, "convert_version",
                        _fake_converter_that_drifts(onnx.version_converter.convert_version))
    with pytest.raises(EdgeError, match="upgrading .* from opset 9 to 17 with onnx.version_converter changes its "
                                        "outputs beyond tolerance \\(compared with its own outputs\\)") as caught:
        clean_file(path, tmp_path / "c.onnx")
    assert "re-export the model at opset 17" in caught.value.fix and "report" not in str(caught.value)
    assert not (tmp_path / "c.onnx").exists()


def test_folding_stops_at_the_largest_weight_and_graphsurgeon_says_nothing(tmp_path, capfd):
    """ConstantOfShape of a 4 MiB filler from an 8-byte shape (as the onnx package's "light" model
    zoo graphs hold): folding it only bloats the file; onnx-graphsurgeon would print its
    constant-folding size note to the terminal."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["filler"],
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("MatMul", ["x", "filler"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["y"])]
    graph = helper.make_graph(nodes, "light", [_value("x", TensorProto.FLOAT, [2, 1024])],
                              [_value("y", TensorProto.FLOAT, [2, 1024])],
                              [numpy_helper.from_array(np.array([1024, 1024], np.int64), "shape"),
                               numpy_helper.from_array(RNG.standard_normal(1024).astype(np.float32), "bias")])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m")
    capfd.readouterr()
    assert main(["clean", str(path), "--out", str(tmp_path / "c.onnx")]) == 0
    terminal = "".join(capfd.readouterr())
    assert "threshold" not in terminal and "large outputs" not in terminal
    clean = onnx.load(str(tmp_path / "c.onnx"))
    assert "ConstantOfShape" in {n.op_type for n in clean.graph.node}
    assert (tmp_path / "c.onnx").stat().st_size < 64 * 1024


def test_a_weight_transpose_above_1_mib_still_folds(tmp_path):
    """The bound is the largest weight: Transpose(W) of a 2 MiB W (a ViT-Small MLP is 2.25 MiB) folds."""
    w = RNG.standard_normal((1024, 512)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                               helper.make_node("MatMul", ["x", "wt"], ["y"])], "t",
                              [_value("x", TensorProto.FLOAT, [2, 512])], [_value("y", TensorProto.FLOAT, [2, 1024])],
                              [numpy_helper.from_array(w, "w")])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m")
    clean_file(path, tmp_path / "c.onnx")
    assert [n.op_type for n in onnx.load(str(tmp_path / "c.onnx")).graph.node] == ["MatMul"]


def _gather_argmax():
    """Two inputs (one int64), two outputs (one int64), and an Identity to remove."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Gather", ["a", "idx"], ["rows"]),
             helper.make_node("ArgMax", ["a"], ["best"], axis=1, keepdims=0)]
    graph = helper.make_graph(nodes, "g",
                              [_value("x", TensorProto.FLOAT, [4, 5]), _value("idx", TensorProto.INT64, [3])],
                              [_value("rows", TensorProto.FLOAT, [3, 5]), _value("best", TensorProto.INT64, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_several_inputs_and_outputs_and_an_integer_input(tmp_path):
    bare = _save(_gather_argmax(), tmp_path / "bare")
    with pytest.raises(EdgeError, match="input 'idx' is int64 and no sample inputs are stored with it") as caught:
        clean_file(bare, tmp_path / "c.onnx")
    assert "test_data_set_0/input_0.pb" in caught.value.fix

    x, idx = RNG.standard_normal((4, 5)).astype(np.float32), np.array([3, 0, 3], np.int64)
    path = _save(_gather_argmax(), tmp_path / "stored", [x, idx])
    result = clean_file(path, tmp_path / "c.onnx")
    assert [v["inputs"] for v in result["verification"]] == ["test_data_set_0"]
    clean = onnx.load(str(tmp_path / "c.onnx"))
    assert sorted(n.op_type for n in clean.graph.node) == ["ArgMax", "Gather"]
    rows, best = ort_session(str(tmp_path / "c.onnx")).run(None, {"x": x, "idx": idx})
    np.testing.assert_array_equal(rows, x[idx])
    np.testing.assert_array_equal(best, x.argmax(axis=1))


def _dynamic_conv():
    w = RNG.standard_normal((2, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])], "dyn",
                              [_value("x", TensorProto.FLOAT, ["n", 1, "h", "w"])],
                              [_value("y", TensorProto.FLOAT, ["n", 2, None, None])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_dynamic_dimensions_too_small_for_the_graph_are_a_refusal_with_a_fix(tmp_path):
    bare = _save(_dynamic_conv(), tmp_path / "bare")
    with pytest.raises(EdgeError, match="ONNX Runtime fails running .*model.onnx") as caught:
        clean_file(bare, tmp_path / "c.onnx")
    assert "x [2, 1, 2, 2]" in caught.value.found and "store sample inputs" in caught.value.fix
    path = _save(_dynamic_conv(), tmp_path / "stored", [RNG.standard_normal((1, 1, 8, 8)).astype(np.float32)])
    assert [v["inputs"] for v in clean_file(path, tmp_path / "c.onnx")["verification"]] == \
        ["test_data_set_0", "random", "random-large"]


def test_an_operator_onnx_runtime_lacks_is_a_refusal(tmp_path):
    graph = helper.make_graph([helper.make_node("Mystery", ["x"], ["y"], domain="com.example")], "custom",
                              [_value("x", TensorProto.FLOAT, [2])], [_value("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    with pytest.raises(EdgeError, match="ONNX Runtime cannot load .*model.onnx") as caught:
        clean_file(_save(model, tmp_path / "m"), tmp_path / "c.onnx")
    assert "Mystery" in caught.value.found and "deploy the graph as it is" in caught.value.fix


# A sample of the onnx package's backend graphs, one of each kind: IR 3 with weights as inputs
# (light), ops ONNX Runtime dropped (BatchNorm-6, AveragePool-1), Pad's attribute turned input,
# integer inputs (Embedding, Expand's shape), sequences, old broadcasting, an unknown operator.
SAMPLE = {"light/light_squeezenet": "cleaned", "pytorch-converted/test_BatchNorm2d_eval": "cleaned",
          "pytorch-converted/test_AvgPool2d": "cleaned", "pytorch-converted/test_Embedding": "cleaned",
          "pytorch-operator/test_operator_pad": "cleaned", "simple/test_expand_shape_model1": "cleaned",
          "simple/test_sequence_model1": "cleaned", "pytorch-converted/test_PReLU_2d_multiparam": "refused",
          "simple/test_gradient_of_add": "refused"}


def _check_outcome(model, out, outcome, message):
    """A refusal says what to do and blames no bug; a cleaned graph passes onnx.checker at opset 17
    and gives the outputs stored with the model."""
    if outcome == "refused":
        assert "\n  fix: " in message and "report" not in message, message
        return
    clean = onnx.load(str(out))
    onnx.checker.check_model(clean, full_check=True)
    assert [o.version for o in clean.opset_import if o.domain in ("", "ai.onnx")] == [17]
    for stored in input_sets(model, clean, ()):
        if stored.expected is not None:
            for got, want in zip(ort_session(str(out)).run(None, stored.feeds), stored.expected, strict=True):
                if np.issubdtype(want.dtype, np.floating):
                    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
                else:  # integer, bool, string outputs
                    np.testing.assert_array_equal(got, want)


def test_a_sample_of_the_onnx_backend_graphs(tmp_path):
    models = {label(m): m for m in backend_models()}
    assert set(SAMPLE) <= set(models), f"not in {DATA}"
    for name, expected in SAMPLE.items():
        out = tmp_path / f"{name.replace('/', '-')}.onnx"
        outcome, message = clean_outcome(models[name], out)
        assert outcome == expected, (name, message)
        _check_outcome(models[name], out, outcome, message)


@pytest.mark.slow
def test_every_onnx_backend_graph_is_cleaned_or_refused_with_a_fix(tmp_path):
    outcomes = {}
    for model in backend_models():
        out = tmp_path / "c.onnx"
        out.unlink(missing_ok=True)
        outcomes[label(model)], message = clean_outcome(model, out)
        _check_outcome(model, out, outcomes[label(model)], message)
    counts = {k: list(outcomes.values()).count(k) for k in ("cleaned", "refused")}
    print(f"onnx backend graphs: {counts['cleaned']} cleaned, {counts['refused']} refused of {len(outcomes)}")
    assert len(outcomes) == len(backend_models()) > 100 and counts["cleaned"] > counts["refused"]
