"""``--device`` of compress, plan and analyze: the passes over the images on a GPU, everything else on the CPU.

On this CPU-only machine the tests check the plumbing: a GPU asked for where torch sees none is refused before
anything is written, ``auto`` is the CPU here and gives the very same model, the device is recorded, and plan's
old meaning of ``--device`` (the target's name) is pointed to ``--target-device``. Where torch sees a CUDA GPU,
the last test compresses with every method on both and compares (results equal to float32 rounding: the passes
run in float32 on either, the statistics and fits in float64 on the CPU).
"""

from __future__ import annotations

import json

import pytest
import torch

from edge.cli import main
from edge.compress.artifact import load_artifact
from edge.runtime import computing_on
from tests.conftest import TINY

NO_GPU = "needs a CUDA GPU (torch.cuda.is_available() is False here): run on a lent GPU machine"
PLANS = ("linear:2-3", "dwconv:blocks=1", "attnrm:blocks=2", "wpac:blocks=1:mlp=0.5:qk=0.5:v=0.5",
         "auto-linear:1")


def _compress(weights: str, plan: str, out, device: str) -> int:
    return main(["compress", TINY, "--weights", weights, "--plan", plan, "--data", "fmnist-mini", "--samples", "32",
                 "--device", device, "--out", str(out)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the refusal cannot happen")
@pytest.mark.parametrize("verb", ["compress", "plan", "analyze"])
def test_a_gpu_asked_for_where_there_is_none_is_refused_before_anything_is_written(verb, weights, tmp_path, capsys):
    out = tmp_path / "out"
    extra = {"compress": ["--plan", "linear:2-3"], "plan": ["--budget", "0.8x", "--backend", "estimate"],
             "analyze": []}[verb]
    assert main([verb, TINY, "--weights", weights, *extra, "--data", "fmnist-mini", "--samples", "16",
                 "--device", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--device cuda asked for, but torch sees no CUDA GPU" in err and "use --device cpu" in err
    assert not out.exists()


def test_auto_is_the_cpu_here_and_gives_the_same_model_recorded_with_its_device(weights, tmp_path):
    assert _compress(weights, "auto-linear:1", tmp_path / "cpu", "cpu") == 0
    assert _compress(weights, "auto-linear:1", tmp_path / "auto", "auto") == 0
    cpu, auto = load_artifact(tmp_path / "cpu"), load_artifact(tmp_path / "auto")
    for (name, a), (_, b) in zip(cpu[0].state_dict().items(), auto[0].state_dict().items()):
        assert torch.equal(a, b), name
    manifest = json.loads((tmp_path / "auto" / "edge-model.json").read_text())
    assert manifest["config"]["device"] == "auto" and "gpu" not in manifest["hardware"]


def test_plan_points_a_target_name_given_to_device_to_target_device(weights, tmp_path, capsys):
    assert main(["plan", TINY, "--weights", weights, "--budget", "0.8x", "--backend", "estimate", "--device",
                 "Jetson Orin Nano 8GB", "--data", "fmnist-mini", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "'Jetson Orin Nano 8GB' is not a device" in err and "the target device's name is --target-device" in err


def test_computing_on_the_models_own_device_changes_nothing():
    model = torch.nn.Linear(3, 2)
    before = model.weight
    with computing_on(model, "cpu") as put, computing_on(model, None) as same:
        x = torch.ones(1, 3)
        assert put(x) is x and same(x) is x
    assert model.weight is before and model.weight.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("plan", PLANS)
def test_every_method_compresses_the_same_on_a_gpu_as_on_the_cpu(plan, weights, tmp_path):
    assert _compress(weights, plan, tmp_path / "cpu", "cpu") == 0
    assert _compress(weights, plan, tmp_path / "gpu", "cuda") == 0
    cpu, gpu = (json.loads((tmp_path / d / "edge-model.json").read_text()) for d in ("cpu", "gpu"))
    assert cpu["plan"] == gpu["plan"]   # an auto step chooses the same blocks
    a, b = load_artifact(tmp_path / "cpu")[0].state_dict(), load_artifact(tmp_path / "gpu")[0].state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert b[name].device.type == "cpu", name   # the model comes back to the CPU
        scale = float(a[name].abs().max()) or 1.0
        assert float((a[name] - b[name]).abs().max()) <= 1e-3 * scale, name
