import json

import numpy as np
import pytest

from edge.cli import main
from edge.profile import ProfileConfig, latency_stats, profile

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"


def test_latency_stats_on_known_values():
    values = np.arange(1, 101, dtype=float)  # 1..100 ms
    s = latency_stats(values, batch=4)
    assert (s["min_ms"], s["max_ms"], s["mean_ms"]) == (1.0, 100.0, 50.5)
    assert s["median_ms"] == pytest.approx(50.5) and s["p90_ms"] == pytest.approx(90.1)
    assert s["p99_ms"] == pytest.approx(99.01) and s["std_ms"] == pytest.approx(np.std(values, ddof=1))
    assert s["cv"] == pytest.approx(s["std_ms"] / 50.5)
    assert s["throughput_qps"] == pytest.approx(1000 / 50.5) and s["throughput_images_per_s"] == pytest.approx(
        4000 / 50.5)
    with pytest.raises(ValueError):
        latency_stats([], 1)


class FakeCountingBackend:
    """A fake backend that only counts calls (no timing is asserted)."""

    name = "fake"

    def __init__(self):
        self.calls = 0

    def describe(self):
        return {"backend": self.name, "device": "none", "precision": "none", "batch": 2, "threads": 1}

    def weight_bytes(self):
        return 123

    def infer(self):
        self.calls += 1

    def close(self):
        pass


def test_profile_runs_warmup_then_iterations():
    backend = FakeCountingBackend()
    result = profile(backend, ProfileConfig(warmup=7, iterations=31))
    assert backend.calls == 38 and result["latency"]["iterations"] == 31
    assert result["warmup"]["iterations"] == 7 and result["weight_bytes"] == 123 and result["batch"] == 2


def test_profile_cli_ort_and_torch(tmp_path, capsys):
    onnx_path = tmp_path / "m.onnx"
    assert main(["export", TINY, "--out", str(onnx_path)]) == 0
    capsys.readouterr()
    assert main(["profile", str(onnx_path), "--iterations", "20", "--warmup", "3", "--threads", "1", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert "=== Performance summary ===" in captured.err and "percentile(99%)" in captured.err
    assert result["backend"] == "onnxruntime" and result["threads"] == 1 and result["batch"] == 1
    for key in ("min_ms", "mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "std_ms", "cv",
                "throughput_qps"):
        assert result["latency"][key] >= 0
    assert result["weight_bytes"] > 0 and result["peak_rss_mb"] > 0 and "cpu" in result["hardware"]
    assert main(["profile", TINY, "--backend", "torch", "--iterations", "5", "--warmup", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "torch"


def test_profile_backend_mismatch_is_explained(tmp_path, capsys):
    assert main(["profile", TINY, "--backend", "ort"]) == 2
    assert "export it first" in capsys.readouterr().err
