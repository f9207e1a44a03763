"""``python3 -m jetson run --builder trtexec`` and TensorRT's own log, against the named fakes:
FAKE trtexec (tests/jetson/bin/fake_trtexec, which "builds" with FakeTensorRT and stops on the
flags its TensorRT version lacks) and FakeTensorRT 10.3 as the runner's ``tensorrt``."""

import json
import sys
from pathlib import Path

import pytest

from jetson.bundle import BuildSpec
from jetson.errors import JetsonError
from jetson.runner import RunOptions, run
from jetson.trtexec import TACTIC_DRAM_NOTE, banner_version, build_argv, shape_flags
from tests.edge.trt.test_build import tiny_onnx
from tests.fake_tensorrt import OUT_OF_MEMORY_VARIABLE, make_fake_tensorrt

GRAPH, ENGINE = Path("/b/graphs/m/fp16.onnx"), Path("/c/building/k/trtexec.engine")
COMMON = ["trtexec", f"--onnx={GRAPH}", f"--saveEngine={ENGINE}", "--skipInference",
          "--memPoolSize=workspace:2048M", "--builderOptimizationLevel=3", "--profilingVerbosity=detailed"]


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_strongly_typed_builds_take_the_precision_from_the_graph(precision):
    """--stronglyTyped and no precision flag (trtexec 10 disables --fp16/--int8 under --stronglyTyped,
    sampleOptions.cpp); trtexec 11 has strong typing always and the flag is a no-op, left out."""
    spec = BuildSpec(precision=precision, calibration_cache="caches/m.calib" if precision == "int8" else None)
    calib = Path("/b/caches/m.calib") if precision == "int8" else None
    argv, notes = build_argv("trtexec", GRAPH, ENGINE, spec, (10, 3, 0), calibration_cache=calib)
    assert argv == [*COMMON, "--stronglyTyped"]
    assert ("--calib" in notes) == (precision == "int8")
    argv, notes = build_argv("trtexec", GRAPH, ENGINE, spec, (11, 0, 0), calibration_cache=calib)
    assert argv == COMMON and "--stronglyTyped" in notes


def test_weakly_typed_builds_get_precision_flags_and_int8_its_calibration_cache_on_10_only():
    fp16 = BuildSpec(precision="fp16", strongly_typed=False)
    assert build_argv("trtexec", GRAPH, ENGINE, fp16, (10, 3, 0))[0] == [*COMMON, "--fp16"]
    assert build_argv("trtexec", GRAPH, ENGINE, BuildSpec(precision="fp32", strongly_typed=False),
                      (10, 3, 0))[0] == COMMON
    int8 = BuildSpec(precision="int8", strongly_typed=False, calibration_cache="caches/m.calib")
    argv, _ = build_argv("trtexec", GRAPH, ENGINE, int8, (10, 3, 0), calibration_cache=Path("/b/caches/m.calib"))
    assert argv == [*COMMON, "--int8", "--calib=/b/caches/m.calib"]
    with pytest.raises(JetsonError, match="needs the bundle's calibration cache"):
        build_argv("trtexec", GRAPH, ENGINE, int8, (10, 3, 0))
    with pytest.raises(JetsonError, match="trtexec 11.0.0 has no --fp16"):
        build_argv("trtexec", GRAPH, ENGINE, fp16, (11, 0, 0))


def test_knobs_plugins_cache_and_shapes_and_the_flags_a_version_lacks():
    spec = BuildSpec(precision="fp16", workspace_mib=512, optimization_level=5, tiling_optimization_level=2,
                     min_batch=1, opt_batch=4, max_batch=8)
    inputs = [{"name": "input", "shape": ["batch", 3, 224, 224], "dtype": "float32"},
              {"name": "mask:0", "shape": [None, 196], "dtype": "bool"},
              {"name": "fixed", "shape": [1, 2], "dtype": "float32"}]
    argv, notes = build_argv("/usr/src/tensorrt/bin/trtexec", GRAPH, ENGINE, spec, (10, 3, 0), inputs=inputs,
                             timing_cache=Path("/c/timing/x.cache"), plugins=[Path("/b/plugins/a.so")])
    assert argv[4:6] == ["--memPoolSize=workspace:512M", "--builderOptimizationLevel=5"]
    assert argv[7:] == ["--stronglyTyped", "--timingCacheFile=/c/timing/x.cache", "--staticPlugins=/b/plugins/a.so",
                        "--minShapes=input:1x3x224x224,'mask:0':1x196",
                        "--optShapes=input:4x3x224x224,'mask:0':4x196",
                        "--maxShapes=input:8x3x224x224,'mask:0':8x196"]
    assert "exists from TensorRT 10.8" in notes["--tilingOptimizationLevel"]  # 10.3 stops on it: left out
    argv, notes = build_argv("trtexec", GRAPH, ENGINE, spec, (10, 8, 0))
    assert "--tilingOptimizationLevel=2" in argv and notes == {"tactic_dram_mib": TACTIC_DRAM_NOTE}
    assert shape_flags(inputs[2:], spec) == []  # a static graph needs no shapes
    assert shape_flags(inputs[:1], BuildSpec(precision="fp32", batch=2))[0] == "--minShapes=input:2x3x224x224"
    with pytest.raises(JetsonError, match="dynamic dimensions besides the batch"):
        shape_flags([{"name": "x", "shape": [1, "h", 4]}], spec)
    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v100300] [b26]") == (10, 3, 0)


def test_trtexec_has_no_tactic_dram_pool_so_the_cap_is_listed_as_not_applied(fake_jetson, tmp_path):
    """trtexec's --memPoolSize takes workspace, dlaSRAM, dlaLocalDRAM, dlaGlobalDRAM and tacticSharedMem only
    (samples/common/sampleOptions.cpp at v10.3.0, ~1146-1173): the cap cannot be passed, and is said."""
    import subprocess

    spec = BuildSpec(precision="fp32", tactic_dram_mib=3072)
    argv, notes = build_argv("trtexec", GRAPH, ENGINE, spec, (10, 3, 0))
    assert not any("tactic" in a.lower() for a in argv)
    assert "not applied" in notes["tactic_dram_mib"] and "--builder python" in notes["tactic_dram_mib"]
    assert "tactic_dram_mib" not in build_argv("trtexec", GRAPH, ENGINE, BuildSpec(precision="fp32",
                                                                                   tactic_dram_mib=None),
                                               (10, 3, 0))[1]
    # the fake trtexec refuses the pool as the real one does
    graph = tiny_onnx(tmp_path / "m.onnx")
    done = subprocess.run(["trtexec", f"--onnx={graph}", f"--saveEngine={tmp_path / 'm.engine'}",
                           "--memPoolSize=workspace:512M,tacticDRAM:3072M"], capture_output=True, text=True)
    assert done.returncode == 1 and "Unknown memory pool: tacticDRAM" in done.stdout
    assert not (tmp_path / "m.engine").exists()


# the runner, with FAKE trtexec on PATH (fake_jetson) and FakeTensorRT 10.3 (fake_device)

def trtexec_calls(fakes) -> list[list[str]]:
    return [c for c in fakes.calls() if c[0] == "trtexec" and "--help" not in c]


def test_the_runner_builds_with_trtexec_caches_under_its_own_key_and_benchmarks(bundle, fake_device, fake_jetson,
                                                                              tmp_path):
    cache = tmp_path / "cache"
    options = RunOptions(bundle=bundle, energy="off", cache_dir=cache, variants=("a.fp32",), builder="trtexec")
    assert run(options) == 0
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    engine = result["engine"]
    assert engine["builder"] == "trtexec" and engine["cached"] is False
    assert engine["trtexec"]["version"] == "10.3.0" and engine["trtexec"]["log"] == "logs/a.fp32.trtexec.log"
    # the argv trtexec got: the bundle's graph and build config, the device's timing cache, a list (no shell)
    [argv] = trtexec_calls(fake_jetson)
    assert argv[1:] == [f"--onnx={bundle / 'graphs/a/fp32.onnx'}", argv[2], "--skipInference",
                        "--memPoolSize=workspace:2048M", "--builderOptimizationLevel=3",
                        "--profilingVerbosity=detailed", "--stronglyTyped",
                        f"--timingCacheFile={argv[-1].split('=', 1)[1]}"]
    assert argv[2].startswith(f"--saveEngine={cache / 'building'}") and argv[-1].endswith(".cache")
    assert Path(argv[-1].split("=", 1)[1]).read_bytes() == b"FAKE-CACHE:10.3.0.30:5"  # trtexec wrote it
    assert list((cache / "building").iterdir()) == []  # its work folder removed
    # the engine trtexec wrote was cached, then deserialised and timed by the same path as the Python builder's
    request = json.loads(Path(engine["path"]).read_bytes()[len(b"FAKE-ENGINE"):])
    assert request["flags"] == 1 << 1 and request["pools"] == {"WORKSPACE": 2048 << 20}
    assert result["gpu_latency"]["median_ms"] == 1.0 and result["latency"]["iterations"] == 20
    log = (bundle / "results" / "logs" / "a.fp32.trtexec.log").read_text()
    assert log.startswith("# ") and "&&&& PASSED TensorRT.trtexec [TensorRT v100300]" in log
    manifest = json.loads(Path(f"{engine['path']}.json").read_text())
    assert manifest["built_by"] == "jetson runner (trtexec)" and manifest["builder"] == "trtexec"
    # the bundle's tactic-DRAM cap (3072 MiB) was not applied, and the manifest says so instead of recording it
    assert manifest["knobs"]["not_available"] == {"tactic_dram_mib": TACTIC_DRAM_NOTE}
    assert "tactic_dram_mib" not in manifest["knobs"]["honoured"] and engine["knobs"] == manifest["knobs"]
    # a second run takes it from the cache; the Python builder has engines of its own
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=cache, variants=("a.fp32",), builder="trtexec",
                          force=True)) == 0
    again = json.loads((bundle / "results" / "a.fp32.json").read_text())["engine"]
    assert again["cached"] is True and again["cache_key"] == engine["cache_key"]
    assert len(trtexec_calls(fake_jetson)) == 1
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=cache, variants=("a.fp32",))) == 0
    python = json.loads((bundle / "results" / "a.fp32.json").read_text())["engine"]
    assert python["builder"] == "python" and python["cached"] is False and python["cache_key"] != engine["cache_key"]


def test_a_failing_trtexec_fails_the_variant_and_keeps_its_log(bundle, fake_device, fake_jetson, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_FAIL", "1")
    options = RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", builder="trtexec")
    assert run(options) == 1
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert {k: v["status"] for k, v in summary["variants"].items()} == {"a.fp32": "failed", "b.fp32": "failed"}
    error = summary["variants"]["a.fp32"]["error"]
    log = bundle / "results" / "logs" / "a.fp32.trtexec.log"
    assert f"trtexec failed (exit 1); its whole output: {log}" in error and "Error Code 2: OutOfMemory" in error
    assert "[E] Engine set up failed" in log.read_text() and "&&&& FAILED" in log.read_text()
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    assert result["partial"] is True and result["logs"]["trtexec"] == "logs/a.fp32.trtexec.log"
    assert not list((tmp_path / "cache" / "engines").glob("*.engine"))


def test_a_trtexec_of_another_tensorrt_or_none_is_refused_before_building(bundle, fake_device, fake_jetson,
                                                                         monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "11.0")
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "c", builder="trtexec")) == 2
    error = json.loads((bundle / "results" / "run.json").read_text())["error"]
    assert "is TensorRT 11.0.0, the Python module TensorRT 10.3.0.30" in error and "--trtexec" in error
    assert trtexec_calls(fake_jetson) == []
    assert run(RunOptions(bundle=bundle, energy="off", builder="trtexec", trtexec=str(tmp_path / "none"))) == 2
    assert "was not found" in json.loads((bundle / "results" / "run.json").read_text())["error"]
    with pytest.raises(JetsonError, match="--builder only with --backend tensorrt"):
        RunOptions(bundle=bundle, backend="ort", builder="trtexec")


# TensorRT's own log

def test_tensorrt_messages_go_to_the_variants_log_and_errors_are_summarised(bundle, fake_device, tmp_path, capsys,
                                                                           monkeypatch):
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a.fp32",))) == 0
    result = json.loads((bundle / "results" / "a.fp32.json").read_text())
    assert result["logs"] == {"trt": "logs/a.fp32.trt.log"}
    lines = [line.split("\t") for line in (bundle / "results" / result["logs"]["trt"]).read_text().splitlines()]
    messages = [(severity, text) for _, severity, text in lines]
    assert ("INFO", f"Input filename:   {bundle / 'graphs/a/fp32.onnx'}") in messages  # the parser's
    assert ("INFO", "[MemUsageChange] Init CUDA: CPU +2, GPU +0, now: CPU 31, GPU 3402 (MiB)") in messages  # builder
    assert ("INFO", "Loaded engine size: 0 MiB") in messages  # the runtime's
    assert "TensorRT error" not in capsys.readouterr().err  # nothing to summarise
    # a build that fails: its error on stderr and the run log, all of it in the file
    monkeypatch.setenv(OUT_OF_MEMORY_VARIABLE, "graphs/b/:none")  # the build (in its own process) fails
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "other", variants=("b.fp32",))) == 1
    err = capsys.readouterr().err
    assert "TensorRT error: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory" in err
    trt_log = bundle / "results" / "logs" / "b.fp32.trt.log"
    assert f"TensorRT: 1 errors, 0 warnings, 4 messages in all: {trt_log}" in err
    assert "\tERROR\t[virtualMemoryBuffer.cpp" in trt_log.read_text()
    assert "TensorRT error" in (bundle / "results" / "logs" / "run.log").read_text()


def test_the_python_builder_refuses_a_weakly_typed_config_and_names_trtexec(monkeypatch, tmp_path):
    """It sets no --fp16/--int8 flags and reads no calibration cache, so it must not build one silently."""
    from jetson.engine import build_engine_bytes

    monkeypatch.setitem(sys.modules, "tensorrt", make_fake_tensorrt("10.3"))
    with pytest.raises(JetsonError, match="(?s)weakly typed.*--builder trtexec"):
        build_engine_bytes(tmp_path / "m.onnx", BuildSpec(precision="fp16", strongly_typed=False))
