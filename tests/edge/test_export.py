import hashlib
import json

import onnx
import pytest

from edge.cli import main
from edge.errors import EdgeError
from tests.conftest import TINY


def test_export_is_verified_deterministic_and_carries_metadata(tmp_path, weights, capsys):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert main(["export", TINY, "--weights", weights, "--data", "fmnist-mini", "--out", str(a), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["export", TINY, "--weights", weights, "--data", "fmnist-mini", "--out", str(b)]) == 0
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    assert {v["inputs"] for v in report["verification"]} == {"random", "real"}
    assert all(v["passed"] and v["max_abs"] <= 1e-4 for v in report["verification"])
    model = onnx.load(str(a))
    onnx.checker.check_model(model, full_check=True)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["edge.source_model"] == TINY and json.loads(meta["edge.input_size"]) == [1, 28, 28]
    assert model.opset_import[0].version >= 17
    ops = {n.op_type for n in model.graph.node}
    assert "LayerNormalization" in ops and "Softmax" in ops  # explicit attention, native LayerNorm
    from edge.graph.manager import count_nodes  # the report counts nodes as `edge clean` does (issue 19)
    assert report["nodes"] == count_nodes(model)
    assert report["nodes"] + report["constant_nodes"] == len(model.graph.node)
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, 28, 28]


def test_dynamic_batch_and_compressed_artifact(tmp_path, weights):
    art = tmp_path / "art"
    assert main(["compress", TINY, "--weights", weights, "--plan", "linear:1-3", "--data", "fmnist-mini",
                 "--samples", "50", "--out", str(art)]) == 0
    out = tmp_path / "art.onnx"
    assert main(["export", str(art), "--dynamic-batch", "--out", str(out)]) == 0
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert {p.key: p.value for p in model.metadata_props}["edge.plan"] == "linear:1-3"


def test_bad_export_requests_write_nothing(tmp_path, capsys):
    from edge.export import ExportConfig, export_bytes
    from edge.models import create_model

    with pytest.raises(EdgeError, match="opset 16 is too old"):
        export_bytes(create_model(TINY), (1, 28, 28), ExportConfig(opset=16))
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["export", TINY, "--out", str(blocked / "x.onnx")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_eval_of_the_onnx_graph_matches_pytorch(tmp_path, weights, capsys):
    out = tmp_path / "m.onnx"
    assert main(["export", TINY, "--weights", weights, "--batch", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", TINY, "--weights", weights, "--data", "fmnist-mini", "--json"]) == 0
    torch_result = json.loads(capsys.readouterr().out)
    assert main(["eval", str(out), "--data", "fmnist-mini", "--json"]) == 0  # static batch 3: chunked and padded
    onnx_result = json.loads(capsys.readouterr().out)
    assert onnx_result["backend"] == "onnxruntime" and onnx_result["samples"] == 2000
    assert abs(onnx_result["correct"] - torch_result["correct"]) <= 2  # float32 ties may flip an argmax
    assert set(onnx_result) >= {"accuracy", "samples", "correct", "loss", "per_class_accuracy"}


def test_eval_of_a_file_that_is_not_onnx(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    assert main(["eval", str(bad), "--data", "fmnist-mini"]) == 2
    assert "not a readable ONNX model" in capsys.readouterr().err


@pytest.mark.parametrize("batch", [1, 9, 16, 32])
def test_export_verifies_and_writes_any_static_batch(tmp_path, weights, capsys, batch):
    """The CLI verifies with 8 real images; a static batch above 8 repeats them (issue 19, point 1)."""
    out = tmp_path / f"b{batch}.onnx"
    assert main(["export", TINY, "--weights", weights, "--data", "fmnist-mini", "--batch", str(batch),
                 "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {v["inputs"] for v in report["verification"]} == {"random", "real"}
    assert all(v["passed"] for v in report["verification"])
    dims = [d.dim_value for d in onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [batch, 1, 28, 28]


def test_export_checks_real_images_from_an_image_folder(tmp_path, weights, capsys):
    """An ImageFolder's images are read with the model's preprocessing and compared too (issue 19, point 10)."""
    import numpy as np
    import torch
    from PIL import Image

    from edge.data import InputSpec, load_dataset
    from edge.export import REAL_IMAGES
    from edge.models import create_model, data_config

    folder = tmp_path / "images"
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (folder / label).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / label / f"{i}.png")
    out = tmp_path / "m.onnx"
    assert main(["export", TINY, "--weights", weights, "--data", str(folder), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {v["inputs"] for v in report["verification"]} == {"random", "real"}
    assert all(v["passed"] for v in report["verification"]) and out.is_file()
    # the real inputs are the folder's 6 RGB PNGs as the model reads them: gray, resized to 28x28, normalised
    data = load_dataset(str(folder), "test")
    config = data_config(create_model(TINY))
    x = data.inputs(InputSpec.from_data_config(config), REAL_IMAGES)
    load = data.preprocess_for(InputSpec.from_data_config(config))
    assert x.shape == (6, 1, 28, 28) and torch.equal(x[4], load(data.paths[4]))
    assert x.std() > 0.1  # real pixels, not zeros
