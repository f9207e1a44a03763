"""Under --json, stdout is one JSON document and nothing else, in every verb (issue 19).

Each verb runs in-process (``edge.cli.main``) on small inputs: a 20-image IDX data set cut from
fmnist-mini, one exported graph, a few steps or samples. stdout is captured at the file-descriptor
level, so a print from a library (ONNX Runtime's calibrators print their progress) is caught too.
`edge pipeline` (about a minute even on a tiny recipe) is marked slow.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from edge.cli import main

PER_CLASS = {"train": 4, "t10k": 2}
TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=64,num_heads=2"


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(struct.pack(">i", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def tiny_idx(folder: Path) -> Path:
    """4 training and 2 test images per class from fmnist-mini, as IDX files (a --data folder)."""
    from edge.data.fmnist import load_fmnist_mini

    folder.mkdir()
    for prefix, split in (("train", "train"), ("t10k", "test")):
        data = load_fmnist_mini(split)
        labels = data.labels.numpy()
        keep = np.concatenate([np.flatnonzero(labels == c)[: PER_CLASS[prefix]] for c in range(10)])
        _write_idx(folder / f"{prefix}-images-idx3-ubyte", data.images.numpy()[keep])
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels[keep])
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("json")
    data = tiny_idx(root / "tiny")
    assert main(["export", "fmnist-deit-tiny", "--out", str(root / "ref.onnx")]) == 0
    return root, data


def estimated_table(path: Path) -> Path:
    """The Orin Nano estimator's table of every part a plan on TINY can make (nothing timed: fast)."""
    from edge.latency.grid import GridConfig, grid_parts
    from edge.latency.orin import estimate_table
    from edge.models import create_model

    if not path.exists():
        estimate_table(grid_parts(create_model(TINY), GridConfig("full")), "MAXN_SUPER").save(path)
    return path


def run_json(argv: list[str], capfd, code: int = 0) -> dict:
    assert main([*argv, "--json"]) == code
    out = capfd.readouterr().out
    return json.loads(out)  # one document: anything before or after it fails here


def argv_of(case: str, root: Path, data: Path) -> list[str]:
    onnx, d = str(root / "ref.onnx"), str(data)
    return {
        "info": ["info"],
        "models": ["models", "fmnist-deit-tiny"],
        "train": ["train", "fmnist-deit-tiny", "--data", d, "--max-steps", "1", "--batch-size", "20",
                  "--out", str(root / "train")],
        "eval": ["eval", onnx, "--data", d],
        "analyze": ["analyze", "fmnist-deit-tiny", "--data", d, "--samples", "10", "--out", str(root / "analysis")],
        "compress": ["compress", "fmnist-deit-tiny", "--plan", "linear:9-10", "--data", d, "--samples", "10",
                     "--out", str(root / "compressed")],
        "finetune": ["finetune", str(root / "compressed"), "--data", d, "--max-steps", "1", "--batch-size", "20",
                     "--out", str(root / "tuned")],
        "export": ["export", "fmnist-deit-tiny", "--data", d, "--out", str(root / "again.onnx")],
        "clean": ["clean", onnx, "--out", str(root / "ref.clean.onnx")],
        "verify": ["verify", onnx, onnx, "--data", d],
        # the accuracy gate on 50 images, not 500: what is checked here is stdout (tests/edge/precision: the gate)
        "quantize-fp16": ["quantize", onnx, "--precision", "fp16", "--data", d, "--samples", "10",
                          "--gate-images", "50", "--out", str(root / "fp16.onnx")],
        **{f"quantize-int8-{method}": ["quantize", onnx, "--precision", "int8", "--method", method, "--data", d,
                                       "--samples", "10", "--gate-images", "50", "--no-cache",
                                       "--out", str(root / f"{method}.onnx")]
           for method in ("minmax", "entropy", "percentile")},
        "check": ["check", onnx, "--trt", "10.16"],
        "build": ["build", onnx, "--out", str(root / "ref.engine"), "--trtexec"],
        "profile": ["profile", onnx, "--warmup", "1", "--iterations", "5"],
        "bundle": ["bundle", onnx, "--precision", "fp32", "--out", str(root / "bundle")],
        "plan": ["plan", TINY, "--budget", "0.8x", "--data", d, "--samples", "10", "--holdout", "10",
                 "--table", str(estimated_table(root / "orin.json")), "--out", str(root / "plan")],
    }[case]


# in this order: finetune needs compress's artifact
CASES = ["info", "models", "train", "eval", "analyze", "compress", "finetune", "export", "clean", "verify",
         "quantize-fp16", "quantize-int8-minmax", "quantize-int8-entropy", "quantize-int8-percentile", "check", "build",
         "profile", "bundle", "plan"]


# CI time: percentile prints through the same ONNX Runtime calibrator code as entropy (run by default)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "quantize-int8-percentile" else c
                                  for c in CASES])
def test_json_is_all_of_stdout(case, work, capfd):
    root, data = work
    capfd.readouterr()
    result = run_json(argv_of(case, root, data), capfd)
    assert isinstance(result, dict) and result


def test_deploy_json_is_all_of_stdout_also_when_the_device_fails(work, capfd):
    """No device answers on port 1: exit 1, the result (with the failure) is still the whole of stdout."""
    root, _ = work
    bundle = root / "bundle-deploy"
    assert main(["bundle", str(root / "ref.onnx"), "--precision", "fp32", "--out", str(bundle)]) == 0
    capfd.readouterr()
    result = run_json(["deploy", str(bundle), "--host", "user@127.0.0.1:1", "--connect-timeout", "1",
                       "--out", str(root / "devices")], capfd, code=1)
    assert result["failed"]


@pytest.mark.slow  # about a minute on 2 cores, even on this recipe
def test_pipeline_json_is_all_of_stdout(work, capfd):
    root, data = work
    recipe = root / "tiny.yaml"
    recipe.write_text(f"data: {data}\nanalysis: {{enabled: false}}\ncalibration: {{samples: 10}}\n"
                      "profile: {warmup: 1, rounds: 2, sessions: 1, iterations: 2}\n"
                      "variants:\n  - name: original\n  - name: linear-9-10\n    plan: linear:9-10\n")
    capfd.readouterr()
    assert run_json(["pipeline", "--recipe", str(recipe), "--out", str(root / "pipeline")], capfd)["variants"]


def test_every_verb_is_covered():
    from edge.cli import COMMANDS

    verbs = {c.__name__.rsplit(".", 1)[1].removesuffix("_cmd") for c in COMMANDS}
    covered = {c.split("-")[0] for c in CASES} | {"deploy", "pipeline"}
    assert verbs == covered
