import json

from edge.cli import main
from tests.conftest import TINY


def test_plan_for_the_orin_estimate_names_the_model_it_wrote(weights, tmp_path, capsys):
    """`edge plan --backend estimate` plans on the Orin Nano estimator (no table to measure) and its --json
    names the compressed model (OUT/model) that `edge finetune` takes, beside the run folder."""
    out = tmp_path / "plan"
    assert main(["plan", TINY, "--weights", weights, "--budget", "0.8x", "--backend", "estimate", "--power-mode",
                 "15W", "--data", "fmnist-mini", "--samples", "16", "--holdout", "16", "--out", str(out),
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["out"] == str(out) and record["model_path"] == str(out / "model")
    assert (out / "model" / "edge-model.json").is_file()
    target = record["target"]
    assert (target["backend"], target["device"], target["power_mode"], target["precision"]) == \
        ("estimate", "Jetson Orin Nano 8GB", "15W", "fp16")
    assert record["table"] == "latency-table.json" and (out / "latency-table.json").is_file()
    assert record["result"]["chosen"]["predicted_ms"] <= 0.8 * record["result"]["original"]["predicted_ms"]


def test_estimate_refuses_a_device_it_does_not_know(weights, tmp_path, capsys):
    assert main(["plan", TINY, "--weights", weights, "--budget", "0.8x", "--backend", "estimate",
                 "--target-device", "Raspberry Pi", "--data", "fmnist-mini", "--out", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert "--backend estimate for Raspberry Pi" in err and "Jetson Orin Nano 8GB" in err
    assert not (tmp_path / "plan").exists()
