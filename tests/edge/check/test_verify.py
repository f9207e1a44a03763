"""``edge verify A B``: PyTorch against ONNX, ONNX against ONNX, and what happens when they differ."""

import json

import onnx
import pytest
from onnx import numpy_helper

from edge.cli import main
from edge.graph import InPlacePass

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import torch

    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    folder = tmp_path_factory.mktemp("verify")
    torch.manual_seed(0)
    weights = folder / "tiny.safetensors"
    save_safetensors(create_model(TINY).state_dict(), weights)
    onnx_path = folder / "tiny.onnx"
    assert main(["export", TINY, "--weights", str(weights), "--out", str(onnx_path)]) == 0
    return str(weights), onnx_path


def test_model_against_its_export_passes(exported, capsys):
    weights, onnx_path = exported
    assert main(["verify", TINY, str(onnx_path), "--weights", weights, "--data", "fmnist-mini", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["input_size"] == [1, 28, 28]
    assert {c["inputs"] for c in result["comparisons"]} == {"random", "real"}
    assert all(c["max_abs"] <= 1e-4 and c["rel_l2"] <= 1e-5 for c in result["comparisons"])
    assert result["top1_agreement"] == {"random": 1.0, "real": 1.0}
    assert result["reference"]["backend"] == "torch" and result["candidate"]["backend"] == "onnxruntime"


def test_a_perturbed_graph_fails_with_exit_1(exported, tmp_path, capsys):
    _, onnx_path = exported
    model = onnx.load(str(onnx_path))
    head = next(t for t in model.graph.initializer if len(t.dims) == 1 and t.dims[0] == 10)  # the head's bias
    bias = numpy_helper.to_array(head).copy()
    bias[3] += 0.01  # every logit of class 3 moves by 1e-2: beyond 1e-4 absolute
    head.CopyFrom(numpy_helper.from_array(bias, head.name))
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(model, str(perturbed))
    assert main(["verify", str(onnx_path), str(perturbed), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["passed"]
    assert all(abs(c["max_abs"] - 0.01) < 1e-5 for c in result["comparisons"])
    # the same pair passes with a tolerance that admits the change
    assert main(["verify", str(onnx_path), str(perturbed), "--max-abs", "0.02", "--rel-l2", "1"]) == 0


def test_mismatched_inputs_are_bad_input(exported, capsys):
    _, onnx_path = exported
    assert main(["verify", str(onnx_path), "timm:deit_tiny_patch16_224"]) == 2
    err = capsys.readouterr().err
    assert "take different inputs" in err and "(1, 28, 28) vs (3, 224, 224)" in err


def test_missing_and_corrupt_files(exported, tmp_path, capsys):
    _, onnx_path = exported
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all" * 10)
    assert main(["verify", str(onnx_path), str(bad)]) == 2
    assert "bad.onnx is not a readable ONNX model" in capsys.readouterr().err
    assert main(["verify", str(onnx_path), str(tmp_path / "missing.onnx")]) == 2
    assert "missing.onnx does not exist" in capsys.readouterr().err


def test_outputs_of_different_shape(exported, tmp_path, capsys):
    _, onnx_path = exported
    headless = TINY.replace("num_classes=10", "num_classes=0")
    assert main(["verify", str(onnx_path), headless]) == 2
    assert "outputs of different shapes" in capsys.readouterr().err


def _drift_first_weight(graph) -> bool:
    """A deliberately wrong cleaning pass: scales the first constant MatMul weight by 1.001."""
    import onnx_graphsurgeon as gs

    for node in graph.nodes:
        if node.op == "MatMul" and isinstance(node.inputs[1], gs.Constant):
            node.inputs[1] = gs.Constant(node.inputs[1].name + "_drift", node.inputs[1].values * 1.001)
            return True
    return False


DRIFTING_PASS = InPlacePass("drifting-pass", "scale the first MatMul weight by 1.001", _drift_first_weight)


def test_cleaning_that_drifts_writes_nothing_and_names_the_pass(exported, tmp_path):
    from edge.errors import EdgeError
    from edge.graph.clean import clean_file

    _, onnx_path = exported
    out = tmp_path / "drift.clean.onnx"
    with pytest.raises(EdgeError, match="cleaning pass 'drifting-pass' changed the model's outputs") as caught:
        clean_file(onnx_path, out, passes=(DRIFTING_PASS,))
    assert "--skip-pass drifting-pass" in str(caught.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []
