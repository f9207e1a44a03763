"""benchmarks/outlier_stats.py on fmnist-mini: the reference model has no outliers, a planted and spread
copy of it has them, and the record carries the published figures with their sources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edge.data import ArrayPreprocess, InputSpec, load_dataset
from edge.models import create_model, data_config
from edge.models.layernorm_spread import spread_layernorm_channels
from edge.models.massive import plant_massive_activations
from edge.models.weights_io import save_safetensors
from edge.train.outliers import OutlierConfig, planted_site, subset

ROOT = Path(__file__).resolve().parents[2]


def outlier_weights(path: Path) -> Path:
    model = create_model("fmnist-deit-tiny")
    preprocess = ArrayPreprocess(InputSpec.from_data_config(data_config(model)))
    gate_x = preprocess(subset(load_dataset("fmnist-mini", "train"), 500, 1).images)
    plant_massive_activations(model, planted_site(OutlierConfig(), 192), gate_x)
    spread_layernorm_channels(model, 6, 8.0, 32.0, seed=0)
    save_safetensors({k: v.to(torch.float16) for k, v in model.state_dict().items()}, path)
    return path


@pytest.mark.slow  # both 12-block models on real images (~20 s)
def test_benchmark_tells_the_reference_from_the_outlier_model(tmp_path):
    out = tmp_path / "stats.json"
    weights = outlier_weights(tmp_path / "outliers.safetensors")
    run = subprocess.run([sys.executable, "benchmarks/outlier_stats.py", "--data", "fmnist-mini", "--images", "200",
                          "--calibration", "100",
                          "--outliers-weights", str(weights), "--json-out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    reference = record["models"]["fmnist-deit-tiny"]["summary"]
    outliers = record["models"]["fmnist-deit-tiny-outliers"]["summary"]
    assert record["models"]["fmnist-deit-tiny"]["images"] == 200
    assert not reference["meets_targets"] and reference["massive_blocks"] == []
    assert outliers["meets_targets"] and outliers["massive_blocks"] == list(range(2, 12))
    assert outliers["max_channel_ratio"] > 10 * reference["max_channel_ratio"]
    assert all(entry["source"] for entry in record["published"])
    assert "meets issue 30's targets: True" in run.stdout
    # per-tensor INT8 of the residual stream (simulated): harmless on the reference, ruinous with the outliers
    plain = record["models"]["fmnist-deit-tiny"]["simulated_int8"]
    planted = record["models"]["fmnist-deit-tiny-outliers"]["simulated_int8"]
    assert plain["int8_per_tensor_residual_stream"] >= plain["float32"] - 0.02
    assert planted["int8_per_tensor_residual_stream"] <= planted["float32"] - 0.3
