"""edge under ``torchrun --nproc_per_node 2`` on the CPU (gloo) against edge in one process.

* Statistics: every process streams its share of the calibration set in float64 and the sums are
  all-reduced, so the result equals one process's to rounding (measured: at most 6e-15 relative;
  WPAC's token-weighted covariances and Taylor sums 1.1e-16).
  Asserted: within 1e-10 of the one-process value, relative where the value is above 1 in size.
* Training: both runs draw the same global batch of 16 each step; two processes train on 8 rows
  each and DistributedDataParallel averages their gradients. The only difference is the order of
  float additions (two half-batch sums, then their mean, against one full-batch sum), about 1e-7
  relative in a gradient. AdamW divides each gradient by its running RMS, so an entry whose true
  gradient is 0 (the attention's key bias: softmax ignores a constant added to every key) moves by
  rounding noise scaled up to a learning-rate-sized step, differently in each run; every other
  weight follows its gradient. Measured (lr 1e-3, 5-6 steps): distillation of a dwconv artifact
  1.6e-7 max abs; dilution of an attnrm artifact 1.1e-6 max abs, key bias 2.9e-5.
* Writing: only the main process writes (the output folder is the one-process run's) and prints.
* Ending: every process meets at a barrier after a run that ended well and then leaves with os._exit
  (distributed.end_process); before that, 1 launch in 6 of the statistics worker aborted at exit.

Each launch starts two Python processes that import torch and timm (about 10 s on 2 idle cores).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from edge import distributed
from edge.cli import main
from edge.compress import CompressConfig, compress, save_artifact
from edge.errors import EdgeError
from edge.models import create_model
from edge.models.weights_io import save_safetensors
from edge.train import check_global_batch
from tests.edge.compress.conftest import TINY, teacher_weights  # noqa: F401 (a fixture)
from tests.edge.distributed_worker import TINY as TINY4
from tests.edge.distributed_worker import statistics

ROOT = Path(__file__).resolve().parents[2]
STATISTICS_TOLERANCE = 1e-10
FINETUNE = ["--data", "fmnist-mini", "--train-samples", "48", "--batch-size", "16", "--eval-samples", "100",
            "--threads", "1", "--amp", "off", "--lr", "1e-3", "--warmup-steps", "2", "--device", "cpu",
            "--checkpoint-every", "2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(args: list[str], cwd: Path, failed_with: int | None = None) -> tuple[list[str], list[str]]:
    """Run ``torchrun --nproc_per_node 2 ARGS`` in ``cwd``; the stdout and stderr of rank 0 and rank 1.

    Every process must succeed; with ``failed_with``, torchrun must instead report a process that exited
    with that status (its failure summary's first ``exitcode``) and none that aborted."""
    logs = cwd / "torchrun-logs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EDGE_NO_PROGRESS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), "--log-dir", str(logs), "--redirects", "3", *args]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    ranks = [next(logs.glob(f"*/attempt_0/{rank}")) for rank in (0, 1)]
    out = [(r / "stdout.log").read_text() for r in ranks]
    err = [(r / "stderr.log").read_text() for r in ranks]
    report = f"{' '.join(command)}\nexit {result.returncode}\n{result.stderr[-3000:]}\n" \
             f"rank 0: {err[0][-3000:]}\nrank 1: {err[1][-3000:]}"
    if failed_with is None:
        assert result.returncode == 0, report
    else:
        codes = re.findall(r"exitcode\s*:\s*(-?\d+)", result.stderr)
        assert result.returncode == 1 and codes and int(codes[0]) == failed_with, report
        assert "SIGABRT" not in result.stderr, report
    return out, err


def assert_same(one, two, path: str = "") -> None:
    """Equal structure; numbers within STATISTICS_TOLERANCE, relative where larger than 1 in size."""
    if isinstance(one, dict):
        assert set(one) == set(two), path
        for key in one:
            assert_same(one[key], two[key], f"{path}/{key}")
    elif isinstance(one, list):
        assert len(one) == len(two), path
        for i, (a, b) in enumerate(zip(one, two)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(one, torch.Tensor):
        assert one.dtype == two.dtype == torch.float64 and one.shape == two.shape, path
        error = ((one - two).abs() / one.abs().clamp_min(1.0)).max().item()
        assert error <= STATISTICS_TOLERANCE, f"{path}: {error:.3g}"
    elif isinstance(one, float):
        assert abs(one - two) <= STATISTICS_TOLERANCE * max(1.0, abs(one)), f"{path}: {one} != {two}"
    else:
        assert one == two, f"{path}: {one} != {two}"


def test_statistics_of_two_processes_equal_one_process(tmp_path):
    torch.manual_seed(0)
    weights = tmp_path / "tiny.safetensors"
    save_safetensors(create_model(TINY4).state_dict(), weights)
    out, _ = torchrun(["-m", "tests.edge.distributed_worker", str(weights), str(tmp_path / "two.pt")], tmp_path)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert two.pop("world_size") == 2 and out == ["", ""]
    one = statistics(str(weights))
    assert one["block_moments"]["samples"] == 37 and one["attention"]["samples"] == 37
    assert one["wpac"]["3"]["images"] == 37 and one["wpac"]["3"]["v"]["rows"] == 37 * 17
    assert_same(one, two)


@pytest.fixture(scope="module")
def artifacts(teacher_weights, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """The tiny teacher compressed two ways: every attention a depthwise conv, and block 1's attention removed."""
    source = {"model": TINY, "weights": str(teacher_weights), "img_size": None}
    folder = tmp_path_factory.mktemp("compressed")
    out = {}
    for name, plan in (("dwconv", "dwconv:blocks=0+1:init=gaussian"), ("attnrm", "attnrm:blocks=1"),
                       ("wpac", "wpac:keep=1:align=8:mlp_align=32")):
        model, manifest = compress(create_model(TINY, weights=teacher_weights), source,
                                   CompressConfig(plan=plan, data="fmnist-mini", samples=24))
        out[name] = save_artifact(model, folder / name, manifest)
    return out


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _finetune_both(artifact: Path, tmp_path: Path, extra: list[str], capsys) -> tuple[dict, dict, list, list]:
    """One process (in this one) and two (torchrun) on the same recipe: their weights, rank outputs."""
    assert main(["finetune", str(artifact), "--out", str(tmp_path / "one"), *FINETUNE, *extra]) == 0
    capsys.readouterr()
    work = tmp_path / "work"
    work.mkdir()
    out, err = torchrun(["-m", "edge", "finetune", str(artifact), "--out", str(work / "two"), "--json", *FINETUNE,
                         *extra], work)
    # only the main process wrote: the folder holds what the one-process run wrote, nothing else beside it
    # (a finished run keeps no checkpoint)
    assert _files(work / "two") == _files(tmp_path / "one") == ["edge-model.json", "model.safetensors"]
    assert sorted(p.name for p in work.iterdir()) == ["torchrun-logs", "two"]
    return load_file(str(tmp_path / "one" / "model.safetensors")), load_file(str(work / "two" / "model.safetensors")), \
        out, err


def test_distillation_of_two_processes_equals_one_process_and_one_writes(artifacts, tmp_path, capsys):
    one, two, out, err = _finetune_both(artifacts["dwconv"], tmp_path, ["--epochs", "2"], capsys)
    assert out[1] == "", "rank 1 printed on stdout"
    assert "accuracy" not in err[1] and "finetune" not in err[1], "rank 1 logged progress"
    record = json.loads(out[0])
    assert record["processes"] == 2 and record["steps"] == 6 and record["artifact"] is not None
    assert one.keys() == two.keys()
    for name in one:   # measured 1.6e-7 at most (lr 1e-3, 6 steps)
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6, msg=name)
    tuned = json.loads((tmp_path / "one" / "edge-model.json").read_text())["finetune"][-1]
    assert "processes" not in tuned
    for a, b in zip(tuned["history"], record["history"]):   # sharded held-out evaluation: the same counts
        assert (a["samples"], a["accuracy"]) == (b["samples"], b["accuracy"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


@pytest.mark.slow
def test_dilution_of_two_processes_equals_one_process(artifacts, tmp_path, capsys):
    """Dilution: the copied attention trains while M > 0 and gets no gradient at M = 0 (DDP finds it unused)."""
    one, two, out, _ = _finetune_both(artifacts["attnrm"], tmp_path, ["--dilute", "--steps", "5"], capsys)
    assert out[1] == ""
    assert json.loads(out[0])["phases"]["dilution"]["M"] == 0.0
    _assert_trained_weights_close(one, two, lr=1e-3, steps=5, dim=32)   # measured 1.1e-6; key bias 2.9e-5


@pytest.mark.slow
def test_piad_of_two_processes_equals_one_process(artifacts, tmp_path, capsys):
    """PIAD: the units ranked on each process's share of the proxy images (sums added), the same sub-network
    sampled on both processes each step; the same dropout list and order, weights as distillation's."""
    extra = ["--piad", "--piad-target", "0.5", "--piad-samples", "32", "--epochs", "2", "--piad-epochs", "2"]
    one, two, out, _ = _finetune_both(artifacts["wpac"], tmp_path, extra, capsys)
    assert out[1] == ""
    record = json.loads(out[0])
    assert record["processes"] == 2 and record["phases"]["piad"]["listed_macs_saved"] >= 0.5
    supernets = [json.loads((folder / "edge-model.json").read_text())["supernet"]
                 for folder in (tmp_path / "one", tmp_path / "work" / "two")]
    assert supernets[0]["order"] == supernets[1]["order"] and supernets[0]["trained"] == supernets[1]["trained"]
    _assert_trained_weights_close(one, two, lr=1e-3, steps=6, dim=32)


def test_a_verb_failing_on_every_process_exits_with_its_status_not_an_abort(artifacts, tmp_path):
    """Both processes join the group, then refuse a global batch of 1 (one row for two processes): each
    prints the error and exits 2 (bad input); no barrier is awaited after an error, and no process aborts
    at exit (edge ends a torchrun process with os._exit, see distributed.end_process)."""
    _, err = torchrun(["-m", "edge", "finetune", str(artifacts["dwconv"]), "--out", str(tmp_path / "two"),
                       *FINETUNE, "--batch-size", "1"], tmp_path, failed_with=2)
    failed = [rank for rank in (0, 1) if "edge finetune: error:" in err[rank]]
    assert failed, f"no process printed the error: {err}"
    for rank in failed:
        assert "batch of 1 image" in err[rank] and "terminate called" not in err[rank]
    assert not (tmp_path / "two").exists()


def test_global_batch_must_give_every_process_a_row(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    check_global_batch(48, 16)
    check_global_batch(34, 16)                   # the last batch of an epoch has 2 images, one per process
    with pytest.raises(EdgeError, match="batch of 1 image"):
        check_global_batch(48, 1)
    with pytest.raises(EdgeError, match="batch of 1 image.*49 training images"):
        check_global_batch(49, 16)


def _assert_trained_weights_close(one: dict, two: dict, lr: float, steps: int, dim: int) -> None:
    """Every weight within 1e-5; the attention's key bias (exact gradient 0) within ``lr * steps``."""
    assert one.keys() == two.keys()
    for name in one:
        if name.endswith("attn.qkv.bias"):
            key = slice(dim, 2 * dim)
            torch.testing.assert_close(two[name][key], one[name][key], rtol=0, atol=lr * steps, msg=name)
            one[name][key] = two[name][key]
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_train_of_two_processes_equals_one_process(tmp_path, capsys):
    args = [TINY, "--data", "fmnist-mini", "--train-samples", "64", "--batch-size", "16", "--epochs", "1",
            "--warmup-steps", "2", "--threads", "1", "--amp", "off", "--save-dtype", "float32"]
    assert main(["train", *args, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    work = tmp_path / "work"
    work.mkdir()
    out, _ = torchrun(["-m", "edge", "train", *args, "--out", str(work / "two"), "--json"], work)
    assert out[1] == "" and json.loads(out[0])["processes"] == 2
    assert _files(work / "two") == _files(tmp_path / "one")
    _assert_trained_weights_close(load_file(str(tmp_path / "one" / "model.safetensors")),
                                  load_file(str(work / "two" / "model.safetensors")), lr=1e-3, steps=4, dim=32)


@pytest.mark.slow
def test_compress_of_two_processes_equals_one_process(tmp_path, capsys):
    """NOSE (entropy moments) and the affine fit (attention moments) from two processes' shares."""
    torch.manual_seed(0)
    weights = tmp_path / "tiny.safetensors"
    save_safetensors(create_model(TINY4).state_dict(), weights)
    args = [TINY4, "--weights", str(weights), "--plan", "attnrm:auto=2:init=affine", "--data", "fmnist-mini",
            "--samples", "37"]
    assert main(["compress", *args, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    work = tmp_path / "work"
    work.mkdir()
    out, _ = torchrun(["-m", "edge", "compress", *args, "--out", str(work / "two"), "--json"], work)
    assert out[1] == ""
    assert _files(work / "two") == _files(tmp_path / "one")
    manifests = [json.loads((folder / "edge-model.json").read_text()) for folder in (tmp_path / "one", work / "two")]
    assert manifests[0]["plan"] == manifests[1]["plan"] == json.loads(out[0])["plan"]
    one, two = (load_file(str(folder / "model.safetensors")) for folder in (tmp_path / "one", work / "two"))
    for name in one:   # measured 3.6e-12: maps solved in float64 from sums equal to 1e-15
        torch.testing.assert_close(two[name], one[name], rtol=1e-6, atol=1e-9, msg=name)


RGB = "timm:vit_tiny_patch16_224,img_size=32,patch_size=8,num_classes=10,depth=2,embed_dim=32,num_heads=2"


def test_finetune_on_an_image_folder_of_two_processes_equals_one_process(tmp_path, capsys, monkeypatch):
    """A user's RGB JPEG folder streamed from disk (timm's training transform, a worker per process): each process
    reads only its rows of every global batch, each image augmented with its step's and row's seed, so two
    processes train the weights of one."""
    from tests.rgb_folder import make_rgb_folder

    monkeypatch.setenv("EDGE_DATA_WORKERS", "1")
    images = make_rgb_folder(tmp_path / "images", train=8, val=4, size=40)
    torch.manual_seed(0)
    weights = tmp_path / "rgb.safetensors"
    save_safetensors(create_model(RGB).state_dict(), weights)
    teacher = tmp_path / "teacher.safetensors"
    save_safetensors(create_model(RGB).state_dict(), teacher)   # other random weights
    recipe = [RGB, "--weights", str(weights), "--teacher-weights", str(teacher), "--data", str(images),
              "--batch-size", "16", "--max-steps", "4",
              "--eval-samples", "20", "--threads", "1", "--amp", "off", "--lr", "1e-3", "--warmup-steps", "2",
              "--device", "cpu"]
    assert main(["finetune", *recipe, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    work = tmp_path / "work"
    work.mkdir()
    torchrun(["-m", "edge", "finetune", *recipe, "--out", str(work / "two")], work)
    one = load_file(str(tmp_path / "one" / "model.safetensors"))
    two = load_file(str(work / "two" / "model.safetensors"))
    assert one.keys() == two.keys()
    start = load_file(str(weights))
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-4   # it trained
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6, msg=name)
