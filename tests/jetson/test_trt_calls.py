"""TensorRT calls held to what the real bindings do (pyCore.cpp, 10.3): where TensorRT's messages go, and
the calls that return None instead of raising. Against FakeTensorRT (tests/fake_tensorrt.py)."""

import json
import sys

import pytest

from edge.cli import main
from jetson.engine import build_engine_bytes
from jetson.errors import JetsonError
from jetson.runner import RunOptions, run
from jetson.trt_backend import TensorRTEngineBackend
from tests.edge.trt.test_build import tiny_onnx
from tests.fake_tensorrt import make_fake_tensorrt


@pytest.fixture
def fake_trt(monkeypatch):
    def install(**kwargs):
        module = make_fake_tensorrt("10.3", **kwargs)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        return module
    return install


def spec():
    from jetson.bundle import BuildSpec

    return BuildSpec(precision="fp32")


# D5: trt.Logger is pyCore's DefaultLogger, which writes to std::cout

def test_the_fake_default_logger_prints_on_stdout_as_pycore_does(fake_trt, capfd):
    trt = fake_trt()
    trt.Logger(trt.Logger.WARNING).log(trt.ILogger.WARNING, "careful")
    out, err = capfd.readouterr()
    assert out.endswith("[TRT] [W] careful\n") and err == ""


def test_edge_build_json_keeps_tensorrt_warnings_off_stdout(fake_trt, tmp_path, capfd, monkeypatch):
    """Issue 29 D5: `edge build --json` prints only JSON on stdout; TensorRT's warning goes to stderr."""
    from edge.trt import cuda as cuda_module
    from tests.edge.trt.test_build import NANO_MODEL

    trt = fake_trt()
    model_file = tmp_path / "device-tree-model"
    model_file.write_bytes(NANO_MODEL.encode() + b"\x00")
    monkeypatch.setattr(cuda_module, "DEVICE_TREE_MODEL", str(model_file))
    monkeypatch.setattr(cuda_module, "load_cudart", lambda: trt.cuda)
    model = tiny_onnx(tmp_path / "m.onnx")
    assert main(["build", str(model), "--out", str(tmp_path / "m.engine"), "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["precision"] == "fp32"
    assert "[TRT] [W] [fake] a warning while building" in err


def test_the_device_builder_and_backend_keep_tensorrt_off_stdout(fake_trt, tmp_path, capfd):
    trt = fake_trt()
    build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), log=lambda message: None)
    with pytest.raises(JetsonError, match="could not deserialise"):
        TensorRTEngineBackend(b"not an engine", trt.cuda, label="garbage")
    out, err = capfd.readouterr()
    assert out == ""
    assert "[TRT] [W] [fake] a warning while building" in err and "[TRT] [E] 1: [runtime.cpp::parsePlan" in err


# D7: create_execution_context() and create_timing_cache(blob) return None

def test_a_stale_timing_cache_is_replaced_by_an_empty_one_and_said(fake_trt, tmp_path):
    """A cache from another TensorRT: create_timing_cache returns None ("Magic tag does not match")."""
    fake_trt()
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"\x00\x01 a TensorRT 8.6 timing cache")
    said = []
    engine, facts = build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), timing_cache=cache, log=said.append)
    assert engine.startswith(b"FAKE-ENGINE")
    assert facts["timing_cache"]["hit"] is False and facts["timing_cache"]["stale"] == "TensorRT cannot read it"
    assert any("was not used (TensorRT cannot read it" in line and "building with an empty one" in line
               for line in said)
    assert cache.read_bytes() == b"FAKE-CACHE:10.3.0.30:5"  # replaced by this build's
    _, again = build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), timing_cache=cache, log=said.append)
    assert again["timing_cache"]["hit"] is True and "stale" not in again["timing_cache"]


def test_no_execution_context_fails_with_the_reason(fake_trt, tmp_path):
    trt = fake_trt(fail_contexts=1)
    engine, _ = build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), log=lambda message: None)
    with pytest.raises(JetsonError, match="could not create an execution context for a.fp32") as e:
        TensorRTEngineBackend(engine, trt.cuda, label="a.fp32")
    assert "1 MiB of device memory" in str(e.value) and "free device memory" in str(e.value)
    assert trt.cuda.leaks() == {}
    TensorRTEngineBackend(engine, trt.cuda, label="a.fp32").close()  # the next one gets its memory
    assert trt.cuda.leaks() == {}


def test_a_variant_without_an_execution_context_fails_and_the_run_goes_on(bundle, fake_device, tmp_path,
                                                                          monkeypatch):
    """Issue 29 D7 in the runner: one variant failed with TensorRT's reason (not exit 3), the next one done."""
    trt = make_fake_tensorrt("10.3", fail_contexts=1, cuda=fake_device.cuda)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 1
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["exit_code"] == 1 and summary["finished"]
    assert summary["variants"]["a.fp32"]["status"] == "failed"
    assert "could not create an execution context" in summary["variants"]["a.fp32"]["error"]
    assert summary["variants"]["b.fp32"]["status"] == "done"
    assert trt.cuda.leaks() == {}


# FakeTensorRT's callbacks behave as pyCore's trampolines (tests/fake_tensorrt.py names the source)

def test_exceptions_in_callbacks_are_printed_and_dropped_and_a_raising_step_cancels(fake_trt, tmp_path, capfd):
    trt = fake_trt()

    class RaisingLogger(trt.ILogger):
        def log(self, severity, msg):
            raise KeyboardInterrupt  # what a Ctrl-C handler would raise inside the callback

    engine, _ = build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), logger=RaisingLogger(),
                                   log=lambda message: None)
    assert engine.startswith(b"FAKE-ENGINE")  # the build went on
    assert "[ERROR] Exception caught in log(): KeyboardInterrupt" in capfd.readouterr().err

    def raising() -> bool:
        raise RuntimeError("in step_complete")

    with pytest.raises(JetsonError, match="could not build"):
        build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), keep_building=raising, log=lambda message: None)
    assert "[ERROR] Exception caught in step_complete(): RuntimeError: in step_complete" in capfd.readouterr().err
    assert trt.calls[-1] == ("build cancelled",)


def test_a_false_from_step_complete_cancels_the_build(fake_trt, tmp_path):
    trt = fake_trt(build_seconds=0.2)
    asked = []

    def keep_building() -> bool:
        asked.append(True)
        return len(asked) < 2

    with pytest.raises(JetsonError, match="could not build"):
        build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), keep_building=keep_building,
                           log=lambda message: None)
    assert len(asked) == 2 and trt.calls[-1] == ("build cancelled",)


def test_an_exception_in_the_layer_profiler_is_dropped(fake_trt, tmp_path, capfd):
    trt = fake_trt()
    engine, _ = build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), log=lambda message: None)
    backend = TensorRTEngineBackend(engine, trt.cuda, label="a", layer_runs=2)

    class RaisingProfiler(trt.IProfiler):
        def report_layer_time(self, layer_name, ms):
            raise ValueError("profiler")

    backend.context.profiler = RaisingProfiler()
    backend._enqueue()  # the enqueue succeeds; the profiler's exception is printed and dropped
    backend.close()
    assert "[ERROR] Exception caught in report_layer_time(): ValueError: profiler" in capfd.readouterr().err
    assert trt.cuda.leaks() == {}


def test_ctrl_c_during_edge_build_cancels_the_build_and_raises_after_it(tmp_path, monkeypatch):
    """The host's `edge build` meets D3 too: a KeyboardInterrupt raised into TensorRT's callbacks is swallowed;
    its handler notes Ctrl-C, the progress monitor cancels, KeyboardInterrupt comes when the build returns."""
    import signal
    import threading

    from edge.trt import BuildConfig, build_engine
    from tests.edge.trt.test_build import FAKE_DEVICE

    trt = make_fake_tensorrt("10.3", build_seconds=30.0)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    # SIGINT as a Python started at a terminal has it: a test command started in the background by a shell without
    # job control runs with SIGINT ignored (POSIX), and Python then leaves it ignored
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    main_thread = threading.main_thread().ident
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(main_thread, signal.SIGINT))  # Ctrl-C, at the main thread
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            build_engine(tiny_onnx(tmp_path / "m.onnx"), tmp_path / "m.engine", BuildConfig(),
                         display=lambda phase: None, device=FAKE_DEVICE)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, started_with)
    assert trt.calls[-1] == ("build cancelled",) and not (tmp_path / "m.engine").exists()


def test_a_jetson_whose_device_tree_is_masked_says_engines_are_not_shared(tmp_path, monkeypatch):
    """Issue 29 (smaller points): in Docker /sys/firmware is masked, /proc/device-tree/model unreadable; the
    device identity then differs from the same board outside the container, and the record says so."""
    from jetson import device

    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n")
    monkeypatch.setattr(device, "NV_TEGRA_RELEASE", str(release))
    monkeypatch.setattr(device, "DEVICE_TREE_MODEL", str(tmp_path / "masked" / "model"))
    record = device.host_record()
    assert record["l4t"] == "36.4.3" and record["device_model"] is None
    assert "a container masks /sys/firmware" in record["device_model_note"]
    assert str(tmp_path / "masked" / "model") in record["device_model_note"]
    model = tmp_path / "model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\x00")
    monkeypatch.setattr(device, "DEVICE_TREE_MODEL", str(model))
    assert "device_model_note" not in device.host_record()


def test_the_fake_leaves_the_signal_mask_as_it_found_it(fake_trt, tmp_path):
    """The fake blocks signals only while it stands in for native code: a mask left behind would be inherited
    by every child process a later test starts (and signals sent to them would never arrive)."""
    import signal

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    fake_trt(build_seconds=0.1)
    build_engine_bytes(tiny_onnx(tmp_path / "m.onnx"), spec(), log=lambda message: None, keep_building=lambda: True)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
