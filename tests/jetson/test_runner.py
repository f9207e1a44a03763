"""The device runner on a real bundle: ONNX Runtime really runs (--backend ort, in a subprocess where it
matters), TensorRT and CUDA are the named fakes (tests/fake_tensorrt.py, tests/fake_cuda.py), and so
are tegrastats, nvpmodel and jetson_clocks (tests/jetson/bin)."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edge.profile import OrtBackend, ProfileConfig, profile
from jetson import cuda as cuda_module
from jetson.bundle import read_bundle
from jetson.energy import Window, rail_energy
from jetson.errors import JetsonError
from jetson.power import Interrupted
from jetson.runner import RunOptions, run
from jetson.sampler import read_sampler_log
from jetson.stats import latency_stats
from tests.edge.trt.test_build import NANO_MODEL, tiny_onnx
from tests.fake_cuda import AGX_ORIN, FakeCudaRuntime
from tests.jetson.fakes import DATA, child_fakes_path

#: what `edge profile` writes and every device result carries too
PROFILE_KEYS = {"backend", "device", "precision", "batch", "threads", "model", "latency", "warmup", "seconds",
                "weight_bytes", "peak_rss_mb", "clock"}


def runner_env(**extra: str) -> dict:
    """A clean environment: no PYTHONPATH, so `python -m jetson` finds the bundle's own copy."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "EDGE_JETSON_CACHE": extra.pop("cache", ""), **extra}


def test_ort_run_in_a_subprocess_writes_edge_profiles_schema(bundle, tmp_path):
    done = subprocess.run([sys.executable, "-m", "jetson", "run", "--backend", "ort", "--iterations", "30",
                           "--energy", "off"], cwd=bundle, env=runner_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "every file checked" in done.stderr
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    host = profile(OrtBackend(tiny_onnx(tmp_path / "host.onnx")), ProfileConfig(warmup=1, iterations=3))
    assert PROFILE_KEYS <= set(result) and PROFILE_KEYS <= set(host)
    assert set(result["latency"]) == set(host["latency"]) == set(latency_stats([1.0], 1))
    assert result["backend"] == "onnxruntime" and result["precision"] == "fp32" and result["batch"] == 1
    assert result["latency"]["iterations"] == 30 and result["warmup"]["iterations"] == 2
    assert result["partial"] is False and result["power"] is None and result["engine"] is None
    assert result["bundle_sha256"] == read_bundle(bundle).sha256
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["exit_code"] == 0 and summary["partial"] is False and summary["backend"] == "ort"
    assert {k: v["status"] for k, v in summary["variants"].items()} == {"a.fp32": "done", "b.fp32": "done"}
    assert "a.fp32: median" in (bundle / "results" / "logs" / "run.log").read_text()


@pytest.mark.parametrize("damage, named", [
    (lambda b: (b / "graphs/a/fp32.onnx").write_bytes((b / "graphs/a/fp32.onnx").read_bytes() + b"x"),
     "graphs/a/fp32.onnx has"),
    (lambda b: (b / "graphs/b/fp32.onnx").write_bytes(bytes(reversed((b / "graphs/b/fp32.onnx").read_bytes()))),
     "the bundle was altered: graphs/b/fp32.onnx does not match its sha256"),
    (lambda b: (b / "jetson" / "energy.py").unlink(), "the bundle is incomplete: jetson/energy.py is missing"),
    (lambda b: (b / "graphs" / "a" / "extra.onnx").write_bytes(b"x"),
     "the bundle was altered: graphs/a/extra.onnx is not in manifest.json"),
])
def test_a_tampered_or_partial_bundle_is_refused_naming_the_file(bundle, damage, named):
    damage(bundle)
    done = subprocess.run([sys.executable, "-m", "jetson", "run", "--backend", "ort", "--energy", "off"],
                          cwd=bundle, env=runner_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert named in done.stderr
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["variants"] == {} and summary["partial"] is True and named in summary["error"]
    assert not (bundle / "results" / "a.fp32.json").exists()


def test_a_rerun_continues_without_recomputing_what_is_done(bundle):
    options = RunOptions(bundle=bundle, backend="ort", energy="off")
    assert run(options) == 0
    first = {p.name: p.read_text() for p in (bundle / "results").glob("*.fp32.json")}
    (bundle / "results" / "b.fp32.json").write_text(
        json.dumps({**json.loads(first["b.fp32.json"]), "partial": True}))  # as an interrupted run leaves it
    assert run(options) == 0
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert {k: v["status"] for k, v in summary["variants"].items()} == {"a.fp32": "cached", "b.fp32": "done"}
    assert (bundle / "results" / "a.fp32.json").read_text() == first["a.fp32.json"]
    assert json.loads((bundle / "results" / "b.fp32.json").read_text())["partial"] is False
    # another protocol is another config: recomputed
    assert run(RunOptions(bundle=bundle, backend="ort", energy="off", iterations=7)) == 0
    assert json.loads((bundle / "results" / "a.fp32.json").read_text())["latency"]["iterations"] == 7


def test_energy_from_the_replayed_tegrastats_trace_and_the_power_mode_put_back(bundle, fake_jetson):
    options = RunOptions(bundle=bundle, backend="ort", energy="on", duration_s=0.35, power_mode="15W",
                         lock_clocks=True, nvpmodel_conf=fake_jetson.nvpmodel_conf, variants=("a",))
    assert run(options) == 0
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    power = result["power"]
    assert power["total_rail"] == "VDD_IN" and set(power["rails"]) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert power["calls"] == result["latency"]["iterations"] and power["batch"] == 1 and power["samples_idle"] >= 2
    # 0.35 s timed (--duration, which also sets the energy window): a few samples, so marked unreliable
    assert power["reliable"] is False and "fewer than 20" in power["unreliable"]
    assert "a.fp32: energy unreliable: only" in (bundle / "results" / "logs" / "run.log").read_text()
    # the figures are the trapezoidal integral of the samples the log holds, over the recorded windows
    samples = read_sampler_log(bundle / "results" / power["tegrastats_log"])
    timed, idle = Window(*power["timed_window_s"]), Window(*power["idle_window_s"])
    again = rail_energy(samples, "VDD_IN", timed, power["calls"], idle)
    assert power["rails"]["VDD_IN"]["energy_mj"] == pytest.approx(again.energy_mj, rel=1e-12)
    assert power["rails"]["VDD_IN"]["energy_above_idle_per_image_mj"] == pytest.approx(
        again.energy_above_idle_per_image_mj, rel=1e-12)
    # the replayed trace's VDD_IN lies between 4.8 and 6.2 W: so does the mean power
    assert 4800 < power["rails"]["VDD_IN"]["mean_power_mw"] < 6200
    calls = fake_jetson.calls()
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["device"]["power_mode"] == {"name": "25W", "id": 1}  # the fake's mode before the run
    stored = next(c[2] for c in calls if c[:2] == ["jetson_clocks", "--store"])
    assert calls[calls.index(["nvpmodel", "-m", "0"]) + 1:][-4:] == [  # 15W for the run; the clocks, then 25W again
        ["jetson_clocks", "--restore", stored], ["jetson_clocks", "--show"], ["nvpmodel", "-m", "1"],
        ["nvpmodel", "-q"]]
    assert summary["settings"]["clocks"]["locked"]["gpu"]["min_hz"] == 1020000000  # read back, recorded
    assert summary["settings"]["clocks"]["restored"]["gpu"]["min_hz"] == 306000000
    assert summary["settings"]["power_mode"] == {"id": 0, "name": "15W"} and summary["settings"]["clocks_locked"]


def failing_after(n: int, error: BaseException, monkeypatch) -> Callable[[], None]:
    """ONNX Runtime's inference fails from call n+1 on (as a device fault or a signal in mid-benchmark
    would); returns what mends it."""
    from jetson.ort_backend import OrtBackend as DeviceOrt

    real = DeviceOrt.infer
    calls = {"n": 0}

    def infer(self):
        calls["n"] += 1
        if calls["n"] > n:
            raise error
        real(self)

    monkeypatch.setattr(DeviceOrt, "infer", infer)
    return lambda: monkeypatch.setattr(DeviceOrt, "infer", real)


def test_a_failure_in_mid_benchmark_keeps_the_partial_result_and_puts_the_device_back(bundle, fake_jetson,
                                                                                     monkeypatch):
    failing_after(12, JetsonError("the GPU went away"), monkeypatch)
    options = RunOptions(bundle=bundle, backend="ort", energy="off", power_mode="15W",
                         nvpmodel_conf=fake_jetson.nvpmodel_conf)
    assert run(options) == 1
    a = json.loads((bundle / "results" / "a.fp32.json").read_text())
    assert a["partial"] is True and a["error"] == "the GPU went away" and a["latency"]["iterations"] == 10
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["partial"] is True and summary["exit_code"] == 1
    assert summary["variants"]["a.fp32"]["status"] == "failed"
    assert summary["variants"]["b.fp32"]["status"] == "failed"  # every later call fails too
    assert fake_jetson.calls()[-2:] == [["nvpmodel", "-m", "1"], ["nvpmodel", "-q"]]  # the original mode (25W) again


def test_an_interruption_writes_partial_results_and_exits_128_plus_the_signal(bundle, fake_jetson, monkeypatch):
    mend = failing_after(7, Interrupted(signal.SIGTERM), monkeypatch)
    options = RunOptions(bundle=bundle, backend="ort", energy="off", lock_clocks=True)
    assert run(options) == 128 + signal.SIGTERM
    a = json.loads((bundle / "results" / "a.fp32.json").read_text())
    assert a["partial"] is True and a["latency"]["iterations"] == 5 and "SIGTERM" in a["error"]
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["variants"] == {"a.fp32": {"result": "a.fp32.json", "error": a["error"],
                                              "status": "interrupted"}}
    assert fake_jetson.calls()[-2][:2] == ["jetson_clocks", "--restore"]  # then read back with --show
    mend()  # a rerun finishes the job
    assert run(RunOptions(bundle=bundle, backend="ort", energy="off", lock_clocks=True)) == 0
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert {k: v["status"] for k, v in summary["variants"].items()} == {"a.fp32": "done", "b.fp32": "done"}


# TensorRT, against the fakes

def test_tensorrt_builds_once_caches_the_engine_and_times_it_on_the_gpu(bundle, fake_device, tmp_path):
    from edge.trt.manifest import check_compatible, read_manifest

    options = RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a.fp32",))
    assert run(options) == 0
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    assert result["backend"] == "tensorrt" and result["tensorrt"] == "10.3.0.30" and result["cuda_graph"] is True
    assert result["gpu_latency"]["median_ms"] == 1.0  # the fake layers' 0.75 + 0.25 ms, timed by CUDA events
    assert [r["name"] for r in result["layers"]] == ["fake gemm", "fake norm"]
    engine = result["engine"]
    assert engine["cached"] is False and engine["knobs"]["honoured"]["workspace_mib"] == 2048
    assert engine["build_memory"]["peak_rss_mib"] > 0 and fake_device.cuda.leaks() == {}  # built in a child process
    # strongly typed, from the bundle's graph bytes
    request = json.loads(Path(engine["path"]).read_bytes()[len(b"FAKE-ENGINE"):])
    assert request["flags"] == 1 << 1 and request["pools"] == {"WORKSPACE": 2048 << 20, "TACTIC_DRAM": 3072 << 20}
    # the cache entry is an `edge build` engine: its manifest passes edge's check on this device
    summary = json.loads((bundle / "results" / "run.json").read_text())
    manifest = read_manifest(engine["path"])
    check_compatible(engine["path"], manifest, summary["device"]["identity"])
    assert summary["device"]["device_model"] == NANO_MODEL and summary["device"]["sm_count"] == 8
    # a second run (forced) takes the engine from the cache
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a.fp32",),
                          force=True)) == 0
    again = json.loads((bundle / "results" / "a.fp32.json").read_text())["engine"]
    assert again["cached"] is True and again["cache_key"] == engine["cache_key"]


def test_a_cached_engine_from_another_device_is_refused(bundle, fake_device, tmp_path, monkeypatch):
    options = RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a.fp32",))
    assert run(options) == 0
    engine = Path(json.loads((bundle / "results" / "a.fp32.json").read_text())["engine"]["path"])
    manifest_path = Path(f"{engine}.json")
    manifest = json.loads(manifest_path.read_text())
    manifest["runtime"]["sm_count"] = AGX_ORIN["multiProcessorCount"]  # as if copied in from an AGX Orin
    manifest_path.write_text(json.dumps(manifest))
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a.fp32",),
                          force=True)) == 1
    summary = json.loads((bundle / "results" / "run.json").read_text())
    error = summary["variants"]["a.fp32"]["error"]
    assert "was built for another device or TensorRT" in error and "sm_count 8" in error and "sm_count 16" in error


def test_another_gpu_gets_another_cache_key(bundle, fake_device, tmp_path, monkeypatch):
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a",))) == 0
    fake_device.cuda = FakeCudaRuntime(AGX_ORIN)  # 16 SMs, the rest as the Orin Nano
    monkeypatch.setattr(cuda_module, "load_cuda_runtime", lambda binding=None, log=None: fake_device.cuda)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a",),
                          force=True)) == 0
    assert len(list((tmp_path / "cache" / "engines").glob("*.engine"))) == 2


def test_without_tensorrt_the_runner_says_so_and_names_the_ort_backend(bundle, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    assert run(RunOptions(bundle=bundle, energy="off")) == 2
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert "TensorRT was not found" in summary["error"] and "--backend ort" in summary["error"]
    assert "TensorRT was not found" in capsys.readouterr().err


def test_bad_options_are_usage_errors(bundle):
    done = subprocess.run([sys.executable, "-m", "jetson", "run", "--backend", "ort", "--variant", "nope"],
                          cwd=bundle, env=runner_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--variant nope is not in the bundle" in done.stderr
    done = subprocess.run([sys.executable, "-m", "jetson", "run", "--backend", "trtexec"], cwd=bundle,
                          env=runner_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "invalid choice" in done.stderr
    assert DATA.is_dir()


def test_the_runner_finishes_when_its_terminal_is_gone(bundle):
    """Issue 29 D6: an SSH session without a pty drops, sshd sends no SIGHUP, and the runner's stderr and
    stdout pipes have no reader any more: every later write to them raises BrokenPipeError. The runner goes
    on with its log file, finishes both variants and writes run.json with `finished` and `exit_code`."""
    process = subprocess.Popen([sys.executable, "-m", "jetson", "run", "--backend", "ort", "--duration", "1",
                                "--energy", "off"], cwd=bundle, env=runner_env(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stderr:
            if "a.fp32: benchmarking" in line:
                break
        process.stderr.close()  # the parent (sshd) goes away mid-benchmark
        process.stdout.close()
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["exit_code"] == 0 and summary["finished"] and summary["partial"] is False
    assert {k: v["status"] for k, v in summary["variants"].items()} == {"a.fp32": "done", "b.fp32": "done"}
    log = (bundle / "results" / "logs" / "run.log").read_text()
    assert "the terminal is gone (BrokenPipeError" in log and "b.fp32: median" in log
    assert json.loads((bundle / "results" / "b.fp32.json").read_text())["partial"] is False


def test_a_cuda_python_too_new_for_the_driver_is_skipped_and_the_run_goes_on(bundle, tmp_path, monkeypatch):
    """Issue 29 D8 in the runner: `pip install cuda-python` (13.x) on JetPack 6 imports and fails at its first
    call; the runner goes on with the next binding (here pycuda, played by the fake GPU) and records why."""
    from jetson import device as device_module
    from tests.fake_tensorrt import make_fake_tensorrt
    from tests.jetson.test_cudart import install_fake_cuda_python

    trt = make_fake_tensorrt("10.3")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    model = tmp_path / "device-tree-model"
    model.write_bytes(NANO_MODEL.encode() + b"\x00")
    monkeypatch.setattr(device_module, "DEVICE_TREE_MODEL", str(model))
    monkeypatch.setenv("PYTHONPATH", child_fakes_path(os.environ.get("PYTHONPATH")))  # the build's process
    install_fake_cuda_python(monkeypatch, FakeCudaRuntime(runtime=13000, driver=12060))
    monkeypatch.setattr(cuda_module, "PycudaRuntime", lambda: trt.cuda)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a",))) == 0
    summary = json.loads((bundle / "results" / "run.json").read_text())
    skipped = summary["device"]["cuda_bindings_skipped"]
    assert len(skipped) == 1 and skipped[0].startswith("CUDA binding cuda-python skipped: CUDA call "
                                                       "cudaGetDeviceCount failed (cudaErrorInsufficientDriver (35))")
    assert summary["variants"]["a.fp32"]["status"] == "done"


def test_the_gpu_event_latency_leaves_out_every_warm_up_call(bundle, fake_device, tmp_path):
    """Warm-up lasts 2 calls *and* 0.05 s, so it makes many calls: none of them is in the GPU-event figures, as
    trtexec leaves out every warm-up query (samples/common/sampleReporting.cpp at v10.3.0, ~319)."""
    options = RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a.fp32",),
                         warmup_s=0.05)
    assert run(options) == 0
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    assert result["warmup"]["iterations"] > 2  # the time made more calls than the count
    assert result["gpu_latency"]["iterations"] == result["latency"]["iterations"] == 20
