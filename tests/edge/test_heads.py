"""A head that does not match the data is detected (issue 19, point 5): eval refuses, verify and quantize
compare features and say so, each naming --probe."""

import json

import pytest

from edge.cli import main

# a tiny timm ViT on 28x28 grey images with timm's default 1000-class head, and a feature-only one
WIDE = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,depth=1,embed_dim=32,num_heads=2"
FEATURES = WIDE + ",num_classes=0"


@pytest.mark.parametrize("model", [WIDE, FEATURES])
def test_eval_refuses_a_head_of_another_data_set_and_names_probe(model, capsys):
    assert main(["eval", model, "--data", "fmnist-mini"]) == 2
    err = capsys.readouterr().err
    assert "fmnist-mini" in err and "has 10 classes" in err and "--probe" in err
    assert "Traceback" not in err and "accuracy" not in err.split("error")[0]


def _weights(spec: str, path):
    """Random weights saved once, so both sides of a comparison are the same model."""
    from safetensors.torch import save_file

    from edge.models import create_model

    save_file({k: v.contiguous() for k, v in create_model(spec).state_dict().items()}, str(path))
    return str(path)


def test_verify_compares_features_without_top1_agreement(tmp_path, capsys):
    weights = _weights(FEATURES, tmp_path / "f.safetensors")
    assert main(["verify", FEATURES, FEATURES, "--weights", weights, "--data", "fmnist-mini", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["outputs"] == "features" and result["top1_agreement"] == {}
    assert "--probe" in result["note"] and "--probe" in err


def test_quantize_of_a_1000_class_head_reports_no_top1_agreement(tmp_path, capsys):
    graph = tmp_path / "wide.onnx"
    assert main(["export", WIDE, "--out", str(graph), "--data", "fmnist-mini"]) == 0
    capsys.readouterr()
    assert main(["quantize", str(graph), "--precision", "fp16", "--data", "fmnist-mini", "--out",
                 str(tmp_path / "w16.onnx"), "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["check"]
    assert check["outputs"] == "features" and "top1_agreement" not in check and "--probe" in check["note"]


def test_a_matching_head_still_gets_its_top1_agreement(tmp_path, capsys):
    small = WIDE + ",num_classes=10"
    weights = _weights(small, tmp_path / "s.safetensors")
    assert main(["verify", small, small, "--weights", weights, "--data", "fmnist-mini", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["outputs"] == "class scores" and result["top1_agreement"]["real"] == 1.0
