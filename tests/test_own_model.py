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
from pathlib import Path

import pytest

from tests.edge.deploy.conftest import ssh_args, sshd  # noqa: F401 - sshd: the loopback device fixture
from tests.launch import run_edge
from tests.no_fmnist import MARKER
from tests.rgb_folder import make_rgb_folder

REPO = Path(__file__).resolve().parents[1]
MODEL = "timm:deit_tiny_patch16_224,num_classes=10"
GUIDE = "docs/your-own-model.md"


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's files: weights and an image folder (8 training and 4 validation images per class).

    The weights are random but for a confident head (one class's bias raised): a random ViT's logits are so close
    that float16 rounding flips some answers and the accuracy gate (rightly) refuses its FP16 graph; a trained
    model's answers have margins, which this stands in for."""
    import torch

    import edge._compat  # noqa: F401 - before timm
    from edge.models import create_model
    from edge.models.weights_io import save_safetensors

    root = tmp_path_factory.mktemp("user")
    torch.manual_seed(0)
    state = create_model(MODEL).state_dict()
    state["head.bias"][3] += 8.0
    save_safetensors(state, root / "vit.safetensors")
    make_rgb_folder(root / "images", train=8, val=4)
    return root


def edge(*args: str, cwd: Path, expect: int = 0) -> subprocess.CompletedProcess:
    """``edge ARGS`` in a new process with Fashion-MNIST unreadable, without a terminal or stdin."""
    env = {**os.environ, "EDGE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "EDGE_DATA_WORKERS": "1",
           "PYTHONPATH": str(REPO)}
    done = run_edge(list(args), module="tests.no_fmnist", cwd=cwd, env=env, timeout=900)
    shown = f"edge {' '.join(args)}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    assert MARKER not in done.stderr, shown
    assert done.returncode == expect, shown
    return done


def guide_commands(user: Path) -> list[list[str]]:
    """The commands of docs/your-own-model.md, in order, with the user's files for its stand-in names."""
    from tests.test_readme import bash_commands

    commands = bash_commands((REPO / GUIDE).read_text(encoding="utf-8"), GUIDE)
    assert commands and all(c.is_edge for c in commands)
    files = {"vit.safetensors": str(user / "vit.safetensors"), "~/my-photos": str(user / "images")}
    return [[files.get(word, word) for word in c.argv[1:]] for c in commands]


def test_the_guide_runs_on_the_users_model_and_folder_reading_no_fashion_mnist_then_deploys(user, tmp_path,
                                                                                          sshd):  # noqa: F811
    """docs/your-own-model.md, every command in its own process (analyze, the four methods, plan on the Orin
    estimate, finetune, export, clean, FP16 with its range check, INT8 calibrated and gated, bundle), then a deploy
    to the loopback device; what each read is the user's folder."""
    import onnx

    from edge.onnx_metadata import CALIBRATION, FP16_RANGE_CHECK, metadata_of

    verbs = []
    for argv in guide_commands(user):
        edge(*argv, cwd=tmp_path)
        verbs.append(argv[0])
    assert verbs.count("compress") == 4 and {"analyze", "plan", "finetune", "quantize", "bundle"} <= set(verbs)
    plan = json.loads((tmp_path / "runs/mine-plan/plan.json").read_text())
    assert plan["result"]["chosen"]["plan"] and plan["model"]["weights"] == str(user / "vit.safetensors")
    ranges = json.loads(metadata_of(onnx.load(str(tmp_path / "runs/mine.fp16.onnx"), load_external_data=False))
                        [FP16_RANGE_CHECK])
    assert ranges["done"] and ranges["data"] == str(user / "images") and ranges["samples"] == 80  # all there is
    calibration = json.loads(metadata_of(onnx.load(str(tmp_path / "runs/mine.int8.onnx"),
                                                   load_external_data=False))[CALIBRATION])
    assert calibration["data"] == str(user / "images") and calibration["samples"] == 20
    manifest = (tmp_path / "bundles/mine/manifest.json").read_text()
    assert f"{user / 'images'}:test" in manifest   # the device gate carries the user's validation images
    server = sshd({})
    device = server.devices[0]
    edge("deploy", str(tmp_path / "bundles/mine"), "--host", str(device.host), *ssh_args(server), "--backend", "ort",
         "--out", str(tmp_path / "deployed"), cwd=tmp_path)


@pytest.mark.slow   # a minute of 224-px fits: `bash scripts/test.sh -m slow` (the guide's test covers the rest)
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


def test_a_model_that_is_not_bundled_needs_data_and_the_error_names_the_flag(user, tmp_path):
    w = ["--weights", str(user / "vit.safetensors")]
    for args in (("eval", MODEL, *w), ("compress", MODEL, *w, "--plan", "linear:10-11", "--out", str(tmp_path / "c")),
                 ("analyze", MODEL, *w, "--out", str(tmp_path / "a"))):
        done = edge(*args, cwd=tmp_path, expect=2)
        assert "--data is needed" in done.stderr and "fix: pass --data DIR" in done.stderr
        assert not (tmp_path / "c").exists() and not (tmp_path / "a").exists()
