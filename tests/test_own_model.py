"""A user's own ViT on their own images, end to end, each step a real ``edge`` command in its own process.

The model is ``timm:deit_tiny_patch16_224,num_classes=10`` (224 px, RGB) with random weights saved to a
``.safetensors`` file (pretrained weights cannot be downloaded here); the images a generated RGB JPEG
ImageFolder with ``train/`` and ``val/`` (tests/rgb_folder.py). Every command runs with Fashion-MNIST
unreadable (tests/no_fmnist.py): none may fall back to the bundled data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.edge.deploy.conftest import ssh_args, sshd  # noqa: F401 - sshd: the loopback device fixture
from tests.no_fmnist import MARKER
from tests.rgb_folder import make_rgb_folder

REPO = Path(__file__).resolve().parents[1]
MODEL = "timm:deit_tiny_patch16_224,num_classes=10"


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's files: weights and an image folder (24 training and 12 validation images per class)."""
    import torch

    import edge._compat  # noqa: F401 - before timm
    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    root = tmp_path_factory.mktemp("user")
    torch.manual_seed(0)
    save_safetensors(create_model(MODEL).state_dict(), root / "vit.safetensors")
    make_rgb_folder(root / "images")
    return root


def edge(*args: str, cwd: Path, expect: int = 0) -> subprocess.CompletedProcess:
    """``edge ARGS`` in a new process with Fashion-MNIST unreadable, without a terminal or stdin."""
    env = {**os.environ, "EDGE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "EDGE_DATA_WORKERS": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.no_fmnist", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=900)
    shown = f"edge {' '.join(args)}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    assert MARKER not in done.stderr, shown
    assert done.returncode == expect, shown
    return done


def test_every_verb_runs_on_the_users_model_and_folder_and_reads_no_fashion_mnist(user, tmp_path, sshd):  # noqa: F811
    w, data = ["--weights", str(user / "vit.safetensors")], ["--data", str(user / "images")]
    run = tmp_path
    edge("analyze", MODEL, *w, *data, "--samples", "20", "--out", str(run / "analysis"), cwd=run)
    for name, plan in (("linear", "linear:10-11"), ("dwconv", "dwconv:blocks=10+11"), ("attnrm", "attnrm:blocks=11"),
                       ("wpac", "wpac:keep=0.5:blocks=10+11")):
        edge("compress", MODEL, *w, *data, "--plan", plan, "--samples", "40", "--out", str(run / name), cwd=run)
    planned = edge("plan", MODEL, *w, *data, "--backend", "estimate", "--budget", "0.8x", "--samples", "40",
                   "--holdout", "20", "--out", str(run / "plan"), "--json", cwd=run)
    assert json.loads(planned.stdout)["result"]["chosen"]["plan"]
    edge("finetune", str(run / "dwconv"), *data, "--max-steps", "2", "--batch-size", "8", "--eval-samples", "20",
         "--out", str(run / "tuned"), cwd=run)
    edge("export", str(run / "tuned"), *data, "--out", str(run / "tuned.onnx"), cwd=run)
    edge("clean", str(run / "tuned.onnx"), "--out", str(run / "clean.onnx"), cwd=run)
    fp16 = edge("quantize", str(run / "clean.onnx"), "--precision", "fp16", *data, "--gate-images", "60",
                "--out", str(run / "fp16.onnx"), "--json", cwd=run)
    checked = json.loads(fp16.stdout)
    assert checked["range_check"]["done"] and checked["range_check"]["samples"] == 240   # all there is, said
    assert checked["check"]["data"].endswith("images/val")
    int8 = edge("quantize", str(run / "clean.onnx"), "--precision", "int8", *data, "--samples", "40",
                "--gate-images", "60", "--accept-loss", "--out", str(run / "int8.onnx"), "--json", cwd=run)
    assert json.loads(int8.stdout)["calibration"]["data"] == str(user / "images")
    edge("bundle", str(run / "clean.onnx"), "--out", str(run / "bundle"), "--precision", "fp32,fp16", *data,
         "--samples", "40", "--gate-images", "16", "--warmup", "2", "--warmup-time", "0.05", "--iterations", "10",
         "--duration", "0.1", "--energy-duration", "0.1", "--idle", "0.3", cwd=run)
    gate = json.loads((run / "bundle" / "manifest.json").read_text())
    assert str(user / "images") in json.dumps(gate)   # the device gate carries the user's images
    server = sshd({})
    device = server.devices[0]
    edge("deploy", str(run / "bundle"), "--host", str(device.host), *ssh_args(server), "--backend", "ort",
         "--out", str(run / "deployed"), cwd=run)


def test_a_model_that_is_not_bundled_needs_data_and_the_error_names_the_flag(user, tmp_path):
    w = ["--weights", str(user / "vit.safetensors")]
    for args in (("eval", MODEL, *w), ("compress", MODEL, *w, "--plan", "linear:10-11", "--out", str(tmp_path / "c")),
                 ("analyze", MODEL, *w, "--out", str(tmp_path / "a"))):
        done = edge(*args, cwd=tmp_path, expect=2)
        assert "--data is needed" in done.stderr and "fix: pass --data DIR" in done.stderr
        assert not (tmp_path / "c").exists() and not (tmp_path / "a").exists()


def test_every_span_kind_and_auto_linear_on_the_users_folder(user, tmp_path):
    """Block approximation's every kind (identity, skip, affine and the trained mlp and resmlp translators) and
    the planner's auto-linear, each with its default options, on the 224-px model and the RGB folder."""
    w, data = ["--weights", str(user / "vit.safetensors")], ["--data", str(user / "images")]
    for name, plan in (("spans", "identity:0-1,skip:2-3,affine:4-5,mlp:6-7,resmlp:8-9"), ("auto", "auto-linear:2")):
        edge("compress", MODEL, *w, *data, "--plan", plan, "--samples", "40", "--out", str(tmp_path / name),
             cwd=tmp_path)
        assert (tmp_path / name / "edge-model.json").is_file()


def test_wpac_refuses_a_head_that_is_not_the_folders_classes(user, tmp_path):
    """A 1000-class head on a 10-class folder: the folder's labels would index other classes. Refused with the fix;
    the label-free criterion runs."""
    done = edge("compress", "timm:deit_tiny_patch16_224", "--data", str(user / "images"), "--plan",
                "wpac:keep=0.5:blocks=11", "--samples", "20", "--out", str(tmp_path / "w"), cwd=tmp_path, expect=2)
    assert "head has 1000 outputs" in done.stderr and "criterion=magnitude" in done.stderr
    assert not (tmp_path / "w").exists()
    edge("compress", "timm:deit_tiny_patch16_224", "--data", str(user / "images"), "--plan",
         "wpac:keep=0.5:criterion=magnitude:blocks=11", "--samples", "20", "--out", str(tmp_path / "w"), cwd=tmp_path)
