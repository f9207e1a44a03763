"""Graphs edge did not export (issue 30, point 7): a torch.onnx export of a timm ViT, which records none of edge
export's metadata, goes through `edge clean`, `edge quantize` (fp16 without data; int8 and the fp16 range check
with --data and the input options), `edge bundle`, `edge eval` and `edge verify`; where the preprocessing cannot
be inferred, the error names the graph, what is missing and the option that supplies it."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from edge.cli import main
from edge.onnx_metadata import metadata_of
from tests.launch import run_edge

# Fashion-MNIST's statistics (edge.data.FMNIST_MEAN/STD), the way a user of another exporter gives them
FMNIST_INPUT = ("--mean", "0.286", "--std", "0.353")
TINY_VIT = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, depth=2, embed_dim=32, num_heads=2)


def export_timm_vit(path: Path, bundled: str | None = None) -> Path:
    """A timm ViT exported by torch.onnx (TorchScript exporter, opset 17), not by `edge export`: the bundled
    model's architecture and weights (``bundled``, e.g. fmnist-deit-tiny), else a seeded 2-block ViT on 28x28."""
    import torch

    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    import timm

    if bundled:
        from edge.models.weights_io import read_state_dict
        from edge.models.zoo import BUNDLED

        model = timm.create_model(BUNDLED[bundled].arch, pretrained=False, **BUNDLED[bundled].kwargs)
        model.load_state_dict(read_state_dict(BUNDLED[bundled].weights))
    else:
        model = tiny_vit()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation and tracer warnings
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), torch.zeros(1, 1, 28, 28), str(path), dynamo=False, opset_version=17,
                          input_names=["pixels"], output_names=["logits"])
    return path


def tiny_vit():
    """The seeded 2-block timm ViT on 28x28 one-channel images (random weights)."""
    import torch

    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY_VIT)


def edge(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """The real `edge` entry point in a process of its own (tests/launch.py), with a private calibration cache."""
    env = {**os.environ, "EDGE_NO_PROGRESS": "1", "EDGE_CACHE_DIR": str(cache)}
    return run_edge(list(args), env=env, timeout=600)


def run_json(*args: str, cache: Path) -> dict:
    result = edge(*args, "--json", cache=cache)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def recorded(path: Path) -> dict[str, str]:
    return metadata_of(onnx.load(str(path), load_external_data=False))


@pytest.mark.slow  # the reference model through four CLI calls with calibration and gate (~70 s); the fast tests here cover each step
def test_a_torch_onnx_vit_goes_through_clean_fp16_int8_and_bundle(tmp_path):
    cache = tmp_path / "cache"
    foreign = export_timm_vit(tmp_path / "deit.onnx", bundled="fmnist-deit-tiny")
    assert recorded(foreign) == {} and onnx.load(str(foreign)).producer_name == "pytorch"

    clean = tmp_path / "deit.clean.onnx"
    cleaned = run_json("clean", str(foreign), "--out", str(clean), cache=cache)
    assert all(v["max_abs"] <= 1e-4 for v in cleaned["verification"])
    assert cleaned["report"]["nodes_after"] < cleaned["report"]["nodes_before"]

    # fp16 without data: converted, checked on random inputs, no range check, and both are said
    fp16 = run_json("quantize", str(clean), "--precision", "fp16", "--out", str(tmp_path / "deit.fp16.onnx"),
                    cache=cache)
    meta = recorded(tmp_path / "deit.fp16.onnx")
    assert meta["edge.precision"] == "float16" and "edge.input_size" not in meta
    assert json.loads(meta["edge.fp16_range_check"])["done"] is False
    assert "--input-size, --mean, --std" in fp16["range_check"]["reason"]
    assert fp16["check"]["outputs"] == "random inputs" and "top1_agreement" not in fp16["check"]
    assert fp16["check"]["max_abs"] < 0.05

    # int8: calibrated on fmnist-mini with the input options
    int8_path = tmp_path / "deit.int8.onnx"
    int8 = run_json("quantize", str(clean), "--precision", "int8", "--data", "fmnist-mini", "--samples", "16",
                    "--input-size", "28x28", *FMNIST_INPUT, "--no-cache", "--out", str(int8_path), cache=cache)
    meta = recorded(int8_path)
    assert meta["edge.precision"] == "int8"
    assert json.loads(meta["edge.calibration"])["data"] == "fmnist-mini"
    assert json.loads(meta["edge.calibration"])["samples"] == 16
    assert json.loads(meta["edge.input_size"]) == [1, 28, 28]
    ops = [n.op_type for n in onnx.load(str(int8_path)).graph.node]
    assert ops.count("QuantizeLinear") == int8["quantize_nodes"] > 0
    assert int8["check"]["outputs"] == "class scores" and int8["check"]["top1_agreement"] >= 0.9

    # bundle: every precision made from the foreign float32 graph, the gate on images
    out = tmp_path / "bundle"
    manifest = run_json("bundle", str(clean), "--out", str(out), "--precision", "fp32,fp16,int8",
                        "--data", "fmnist-mini", "--samples", "16", "--gate-images", "8", *FMNIST_INPUT, cache=cache)
    assert [(v["name"], v["precision"]) for v in manifest["variants"]] == [("deit", p)
                                                                          for p in ("fp32", "fp16", "int8")]
    assert all(v["source"] == str(clean) for v in manifest["variants"])
    by_precision = {v["precision"]: v for v in manifest["variants"]}
    assert by_precision["int8"]["calibration"]["data"] == "fmnist-mini"
    assert by_precision["int8"]["calibration"]["samples"] == 16
    assert all(v["gate"]["data"] == "fmnist-mini:test" and v["gate"]["source"] == str(clean)
               for v in manifest["variants"])
    for precision, graph_precision in (("fp32", None), ("fp16", "float16"), ("int8", "int8")):
        meta = recorded(out / by_precision[precision]["graph"])
        assert meta.get("edge.precision") == graph_precision
        assert json.loads(meta["edge.mean"]) == [0.286]   # the device side knows the preprocessing too
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["variants"] == manifest["variants"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return export_timm_vit(tmp_path_factory.mktemp("foreign") / "tiny.onnx")


@pytest.fixture(scope="module")
def dynamic(tiny) -> Path:
    """The tiny graph with its input's channels, height and width declared dynamic (as Hugging Face exporters write
    pixel_values): nothing can be read from its shape."""
    model = onnx.load(str(tiny))
    for axis, name in ((1, "channels"), (2, "height"), (3, "width")):
        model.graph.input[0].type.tensor_type.shape.dim[axis].dim_param = name
    path = tiny.with_name("dynamic.onnx")
    onnx.save(model, str(path))
    return path


def error_of(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return captured.err


def test_int8_without_mean_and_std_names_them_and_writes_nothing(tiny, tmp_path, capsys):
    out = tmp_path / "q.onnx"
    err = error_of(capsys, "quantize", str(tiny), "--precision", "int8", "--data", "fmnist-mini", "--samples", "8",
                   "--out", str(out))
    assert f"{tiny} records no preprocessing (edge export's metadata), so --mean and --std must be given" in err
    assert "found: input 'pixels' of shape [1, 1, 28, 28]" in err      # the size came from the shape
    assert "fix: pass --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225" in err
    assert not out.exists()


def test_a_dynamic_input_shape_needs_the_input_size_too(dynamic, tmp_path, capsys):
    err = error_of(capsys, "quantize", str(dynamic), "--precision", "int8", "--data", "fmnist-mini",
                   "--out", str(tmp_path / "q.onnx"))
    assert "so --input-size and --mean and --std must be given" in err
    assert "input 'pixels' of shape [1, ?, ?, ?]" in err and "fix: pass --input-size 3x224x224 --mean" in err
    # HxW cannot say the channel count where the shape does not either
    err = error_of(capsys, "quantize", str(dynamic), "--precision", "int8", "--input-size", "28x28", *FMNIST_INPUT,
                   "--out", str(tmp_path / "q.onnx"))
    assert f"--input-size 28x28 for {dynamic} gives no channel count" in err and "fix: pass --input-size Cx28x28" in err
    # fp16 without data checks on random inputs of the graph's shape: a dynamic one cannot make them
    err = error_of(capsys, "quantize", str(dynamic), "--precision", "fp16", "--out", str(tmp_path / "h.onnx"))
    assert "input 'pixels' has shape [1, ?, ?, ?] and the graph records no preprocessing" in err
    assert "fix: pass --input-size 3x224x224 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225" in err
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "h.onnx").exists()


def test_clean_declares_the_input_size_of_a_dynamic_graph_and_quantize_reads_it(dynamic, tmp_path, capsys):
    out = tmp_path / "dynamic.clean.onnx"
    err = error_of(capsys, "clean", str(dynamic), "--out", str(out))   # random inputs of 2 channels, 2 x 2: refused
    assert "pixels [1, 2, 2, 2]" in err and "edge clean --input-size CxHxW" in err and not out.exists()
    assert main(["clean", str(dynamic), "--input-size", "1x28x28", "--out", str(out), "--json"]) == 0
    assert all(v["max_abs"] <= 1e-4 for v in json.loads(capsys.readouterr().out)["verification"])
    dims = onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 1, 28, 28]
    int8 = tmp_path / "dynamic.int8.onnx"   # the size now comes from the shape: --mean and --std suffice
    # (a random-weight ViT's near-tied logits flip under int8: the accuracy gate is not what this test is about)
    assert main(["quantize", str(out), "--precision", "int8", "--data", "fmnist-mini", "--samples", "8",
                 *FMNIST_INPUT, "--no-cache", "--cache-dir", str(tmp_path), "--accept-loss", "--out", str(int8)]) == 0
    assert json.loads(recorded(int8)["edge.input_size"]) == [1, 28, 28]
    capsys.readouterr()
    err = error_of(capsys, "clean", str(dynamic), "--input-size", "28x28", "--out", str(out))
    assert "gives no channel count" in err and "fix: pass --input-size Cx28x28" in err


def test_input_options_that_do_not_fit_the_graph_are_refused(tiny, tmp_path, capsys):
    err = error_of(capsys, "quantize", str(tiny), "--precision", "int8", "--input-size", "1x32x28", *FMNIST_INPUT,
                   "--out", str(tmp_path / "q.onnx"))
    assert "input size 1x32x28 does not fit input 'pixels' of shape [1, 1, 28, 28]" in err
    assert "found: H 32 where the graph has 28" in err and "fix: pass --input-size 1x28x28" in err
    err = error_of(capsys, "clean", str(tiny), "--input-size", "3x28x28", "--out", str(tmp_path / "c.onnx"))
    assert "found: C 3 where the graph has 1" in err and "fix: pass --input-size 1x28x28" in err
    err = error_of(capsys, "quantize", str(tiny), "--precision", "int8", "--mean", "0.1,0.2", "--std", "0.3",
                   "--out", str(tmp_path / "q.onnx"))
    assert "--mean 0.1,0.2" in err and "expected: 1 or 3 values (the input has 1 channel)" in err


@pytest.mark.parametrize("argv, message", [
    (("--mean", "123.675"), "divide by 255 (e.g. --mean 123.675 -> --mean 0.485)"),
    (("--std", "0"), "a value <= 0"),
    (("--std", "0.2,x"), "one number or one per channel"),
    (("--input-size", "3x224x224x1"), "CxHxW (e.g. 3x224x224) or HxW"),
    (("--input-size", "0x28"), "a value below 1"),
])
def test_bad_input_options_are_usage_errors(tiny, tmp_path, capsys, argv, message):
    assert main(["quantize", str(tiny), "--precision", "fp16", *argv, "--out", str(tmp_path / "h.onnx")]) == 2
    assert message in capsys.readouterr().err


def test_fp16_of_a_foreign_graph_matches_float32_on_random_inputs(tiny, tmp_path, capsys):
    out = tmp_path / "tiny.fp16.onnx"
    assert main(["quantize", str(tiny), "--precision", "fp16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "against float32 on 500 seeded random inputs" in printed and "no range check was done" in printed
    from edge.check.compare import ort_session

    x = np.random.default_rng(1).standard_normal((1, 1, 28, 28)).astype(np.float32)
    a, b = (ort_session(str(p)).run(None, {"pixels": x})[0] for p in (tiny, out))
    np.testing.assert_allclose(b, a, atol=2e-2, rtol=0)


def test_fp16_range_check_runs_with_the_input_options(tiny, tmp_path, capsys):
    out = tmp_path / "tiny.fp16.onnx"
    assert main(["quantize", str(tiny), "--precision", "fp16", "--data", "fmnist-mini", "--samples", "16",
                 *FMNIST_INPUT, "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["range_check"]["done"] and result["range_check"]["samples"] == 16
    assert result["check"]["outputs"] == "class scores" and result["check"]["images"] == 500   # the gate's
    meta = recorded(out)
    assert json.loads(meta["edge.fp16_range_check"])["done"] is True
    assert json.loads(meta["edge.input_size"]) == [1, 28, 28]   # read from the graph's static input shape
    assert json.loads(meta["edge.mean"]) == [0.286] and json.loads(meta["edge.std"]) == [0.353]


def test_bundle_refuses_int8_of_a_foreign_graph_without_mean_and_std_before_any_work(tiny, tmp_path, capsys):
    out = tmp_path / "b"
    err = error_of(capsys, "bundle", str(tiny), "--out", str(out), "--precision", "fp32,int8", "--data",
                   "fmnist-mini", "--samples", "8")
    assert f"{tiny} records no preprocessing" in err and "--mean and --std must be given" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


# ------------------------------------------------------------------------------------- edge eval, edge verify

TINY_SPEC = "timm:vit_tiny_patch16_224," + ",".join(f"{k}={v}" for k, v in TINY_VIT.items())
TIMM_INPUT = ("--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5")   # timm's data config of vit_tiny_patch16_224


@pytest.fixture(scope="module")
def edge_exported(tiny) -> Path:
    """The tiny graph's weights exported by `edge export` (timm:ARCH and the weights): it records the preprocessing
    of timm's data config (1x28x28, mean and std 0.5 per RGB channel, averaged on one channel)."""
    from edge.models.weights_io import save_safetensors

    weights = tiny.with_name("tiny.safetensors")
    save_safetensors(tiny_vit().state_dict(), weights)
    out = tiny.with_name("tiny.edge.onnx")
    assert main(["export", TINY_SPEC, "--weights", str(weights), "--out", str(out), "--no-verify"]) == 0
    meta = recorded(out)
    assert json.loads(meta["edge.input_size"]) == [1, 28, 28] and json.loads(meta["edge.mean"]) == [0.5] * 3
    return out


def eval_json(capsys, *argv: str) -> dict:
    assert main(["eval", *argv, "--data", "fmnist-mini", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_of_a_foreign_graph_with_the_input_options_equals_the_edge_export(tiny, edge_exported, capsys):
    reference = eval_json(capsys, str(edge_exported))
    foreign = eval_json(capsys, str(tiny), "--input-size", "28x28", *TIMM_INPUT)
    assert foreign["samples"] == reference["samples"] == 2000
    assert foreign["correct"] == reference["correct"]                    # the same images, the same predictions
    assert foreign["loss"] == pytest.approx(reference["loss"], abs=1e-5)  # and the same logits
    assert foreign["per_class_accuracy"] == reference["per_class_accuracy"]
    # other statistics are another preprocessing: the loss moves by 10x the tolerance above (random weights: the
    # loss stays near ln 10 whatever the input), a check that the options are used at all
    other = eval_json(capsys, str(tiny), *FMNIST_INPUT)
    assert abs(other["loss"] - reference["loss"]) > 1e-4


def test_eval_of_a_foreign_graph_names_the_options_it_needs(tiny, dynamic, capsys):
    err = error_of(capsys, "eval", str(tiny), "--data", "fmnist-mini")
    assert f"{tiny} records no preprocessing (edge export's metadata), so --mean and --std must be given" in err
    assert "fix: pass --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225" in err and "edge export`" not in err
    err = error_of(capsys, "eval", str(dynamic), "--data", "fmnist-mini", *FMNIST_INPUT)
    assert "so --input-size must be given" in err and "input 'pixels' of shape [1, ?, ?, ?]" in err
    err = error_of(capsys, "eval", str(tiny), "--data", "fmnist-mini", "--input-size", "1x32x32", *FMNIST_INPUT)
    assert "found: H 32 where the graph has 28, W 32 where the graph has 28" in err
    err = error_of(capsys, "eval", "fmnist-deit-tiny", "--data", "fmnist-mini", *FMNIST_INPUT)
    assert "--input-size, --mean and --std for fmnist-deit-tiny" in err and "expected: an .onnx graph" in err


def test_verify_two_foreign_graphs_with_the_input_options(tiny, tmp_path, capsys):
    fp16 = tmp_path / "tiny.fp16.onnx"   # no options: it records no preprocessing either
    assert main(["quantize", str(tiny), "--precision", "fp16", "--out", str(fp16)]) == 0
    assert "edge.mean" not in recorded(fp16)
    capsys.readouterr()
    fp16_tolerance = ("--max-abs", "0.01", "--rel-l2", "0.01")
    assert main(["verify", str(tiny), str(fp16), "--data", "fmnist-mini", *FMNIST_INPUT, *fp16_tolerance,
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["input_size"] == [1, 28, 28] and result["outputs"] == "class scores"
    assert [c["inputs"] for c in result["comparisons"]] == ["random", "real"]
    assert all(0 < c["max_abs"] < 0.01 for c in result["comparisons"]) and result["top1_agreement"]["real"] >= 0.75
    # fp32's default tolerance: fp16 is beyond it, exit status 1
    assert main(["verify", str(tiny), str(fp16), "--data", "fmnist-mini", *FMNIST_INPUT]) == 1
    assert "beyond tolerance" in capsys.readouterr().err
    # a graph against itself: exactly equal, on real images normalised by the options
    assert main(["verify", str(tiny), str(tiny), "--data", "fmnist-mini", *FMNIST_INPUT, "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert all(c["max_abs"] == 0 for c in same["comparisons"]) and same["top1_agreement"]["real"] == 1.0


def test_verify_a_foreign_graph_against_its_edge_export_reads_the_recorded_side(tiny, edge_exported, capsys):
    assert main(["verify", str(edge_exported), str(tiny), "--data", "fmnist-mini", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and all(c["max_abs"] <= 1e-4 for c in result["comparisons"])


def test_verify_of_two_foreign_graphs_names_the_options_they_need(tiny, dynamic, capsys):
    err = error_of(capsys, "verify", str(tiny), str(tiny), "--data", "fmnist-mini")
    assert f"{tiny} records no preprocessing (edge export's metadata), so --mean and --std must be given" in err
    assert "fix: pass --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225" in err and "edge export`" not in err
    err = error_of(capsys, "verify", str(dynamic), str(dynamic), "--data", "fmnist-mini")
    assert "so --input-size and --mean and --std must be given" in err
    err = error_of(capsys, "verify", str(tiny), str(tiny), "--mean", "0.1,0.2", "--std", "0.3")
    assert "--mean 0.1,0.2" in err and "expected: 1 or 3 values (the input has 1 channel)" in err
    err = error_of(capsys, "verify", "fmnist-deit-tiny", "fmnist-deit-tiny", *FMNIST_INPUT)
    assert "expected: an .onnx side" in err
