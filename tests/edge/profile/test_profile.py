import json

import numpy as np
import pytest

from edge.cli import main
from edge.errors import EdgeError
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


def test_cpu_contention_tells_own_work_from_other_work():
    """A spinning child process is other work; spinning in this process is our own."""
    import subprocess
    import sys
    import time

    from edge.profile.contention import CpuContention

    with CpuContention() as own:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
    mine = own.result()
    assert mine["own_cpu_share"] > 0.1 and mine["seconds"] >= 1.0
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 2.5\n"
                                "while time.monotonic() < end: pass"])
    try:
        time.sleep(0.3)
        with CpuContention() as other:
            time.sleep(1.5)
    finally:
        spinner.wait()
    theirs = other.result()
    assert theirs["own_cpu_share"] < 0.05
    assert theirs["other_cpu_share"] > 0.2 and theirs["busy"] is True  # the child held a core for the whole block


@pytest.mark.parametrize("busy, other, stolen", [(((100.0, 10.0), (110.0, 13.0)), 0.9, 0.3),
                                                 ((None, None), None, None)])
def test_contention_names_the_share_the_vms_host_stole(monkeypatch, busy, other, stolen):
    from edge.profile import contention

    samples = iter([(busy[0], 5.0, 0.0), (busy[1], 6.0, 5.0)])  # 5 s on 2 CPUs: 10 CPU-seconds, 1 of them ours
    monkeypatch.setattr(contention.CpuContention, "_sample", staticmethod(lambda: next(samples)))
    monkeypatch.setattr(contention.os, "cpu_count", lambda: 2)
    with contention.CpuContention() as block:
        pass
    result = block.result()
    assert result["own_cpu_share"] == pytest.approx(0.1)
    assert result["other_cpu_share"] == (None if other is None else pytest.approx(other))
    assert result["stolen_cpu_share"] == (None if stolen is None else pytest.approx(stolen))


def test_profile_records_contention():
    from edge.profile import ProfileConfig, profile

    class Sleeper:
        name = "sleeper"

        def describe(self):
            return {"backend": "sleeper", "device": "cpu", "precision": "none", "batch": 1, "threads": 1}

        def weight_bytes(self):
            return 0

        def infer(self):
            pass

        def close(self):
            pass

    result = profile(Sleeper(), ProfileConfig(warmup=1, iterations=5))
    assert set(result["contention"]) >= {"other_cpu_share", "own_cpu_share", "busy", "cpus"}


def _matmul_graph(path, weight_nodes, initializers):
    """x [1, 4] @ W [4, 4], W made by ``weight_nodes`` from ``initializers`` (fp16 or int8 storage)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [*weight_nodes, helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_ort_weight_bytes_count_each_initializer_by_its_type(tmp_path):
    """16 float16 weights are 32 bytes; 16 int8 weights with a float32 scale and an int8 zero point 21."""
    from onnx import TensorProto, helper, numpy_helper

    from edge.profile import OrtBackend

    w16 = numpy_helper.from_array(np.eye(4, dtype=np.float16), "w16")
    fp16 = _matmul_graph(tmp_path / "fp16.onnx", [helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT)],
                         [w16])
    int8 = _matmul_graph(tmp_path / "int8.onnx", [helper.make_node("DequantizeLinear", ["w8", "scale", "zero"], ["w"])],
                         [numpy_helper.from_array(np.eye(4, dtype=np.int8), "w8"),
                          numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
                          numpy_helper.from_array(np.array(0, np.int8), "zero")])
    fp32 = _matmul_graph(tmp_path / "fp32.onnx", [helper.make_node("Identity", ["w32"], ["w"])],
                         [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w32")])
    for path, expected in ((fp16, 32), (int8, 16 + 4 + 1), (fp32, 64)):
        backend = OrtBackend(path, threads=1)
        assert backend.weight_bytes() == expected, path.name
        backend.close()


@pytest.mark.parametrize("spinning, entry", [(True, None), (False, "1")])
def test_ort_backend_can_keep_its_threads_from_spinning(tmp_path, spinning, entry):
    """Side by side, an idle session's spinning pool would take the cores from the one being timed: its threads
    stop spinning when a call returns; within a call they spin (never spinning costs a wake-up per operator)."""
    from onnx import helper, numpy_helper

    from edge.profile import OrtBackend

    path = _matmul_graph(tmp_path / "m.onnx", [helper.make_node("Identity", ["w32"], ["w"])],
                         [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w32")])
    backend = OrtBackend(path, threads=2, spinning=spinning)
    config = backend.session.get_session_options().get_session_config_entry
    with pytest.raises(RuntimeError, match="does not have configuration"):
        config("session.intra_op.allow_spinning")   # ONNX Runtime's default, spinning within a call, either way
    if entry is None:  # ONNX Runtime's default: spinning after a call too, the key not set at all
        with pytest.raises(RuntimeError, match="does not have configuration"):
            config("session.force_spinning_stop")
    else:
        assert config("session.force_spinning_stop") == entry
    backend.close()


def test_side_by_side_sessions_do_not_spin_by_default():
    from edge.profile.sidebyside import SideBySideConfig

    assert SideBySideConfig().spinning is False


def test_a_missing_engine_is_named_before_tensorrt_is_looked_for(tmp_path):
    """Issue 19, point 6: not "TensorRT was not found" for a path that does not exist."""
    from edge.profile.tensorrt import TensorRTBackend

    with pytest.raises(EdgeError, match="missing.engine does not exist"):
        TensorRTBackend(tmp_path / "missing.engine")
