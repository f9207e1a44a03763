"""trtexec interop: the command edge prints, and parsers of trtexec's real output formats.

Formats from /work/shared/reference/JETSON-TENSORRT.md ("trtexec"): the performance summary as
TensorRT 10.3-11 print it (timestamp + [I] prefix), --exportTimes and --exportProfile JSON.
"""

import json

import pytest

from edge.errors import EdgeError
from edge.profile.trtexec_output import parse_profile, parse_summary, parse_times, trtexec_result
from edge.trt import BuildConfig
from edge.trt.trtexec_command import banner_version, left_out, shape_arguments, trtexec_command

STAT = ("min = {0} ms, max = 5.82495 ms, mean = 4.29966 ms, median = 4.29718 ms, percentile(90%) = 4.30725 ms, "
        "percentile(95%) = 4.31128 ms, percentile(99%) = 4.32874 ms")
LOG = "\n".join([
    "[11/08/2026-10:21:30] [I] Starting inference",
    "[11/08/2026-10:21:33] [I] ",
    "[11/08/2026-10:21:33] [I] === Performance summary ===",
    "[11/08/2026-10:21:33] [I] Throughput: 234.19 qps",
    f"[11/08/2026-10:21:33] [I] Latency: {STAT.format('4.27838')}",
    f"[11/08/2026-10:21:33] [I] Enqueue Time: {STAT.format('0.51')}",
    f"[11/08/2026-10:21:33] [I] H2D Latency: {STAT.format('0.01')}",
    f"[11/08/2026-10:21:33] [I] GPU Compute Time: {STAT.format('4.2')}",
    f"[11/08/2026-10:21:33] [I] D2H Latency: {STAT.format('0.02')}",
    "[11/08/2026-10:21:33] [I] Total Host Walltime: 3.00082 s",
    "[11/08/2026-10:21:33] [I] Total GPU Compute Time: 2.96536 s",
    "[11/08/2026-10:21:33] [W] * GPU compute time is unstable, with coefficient of variance = 2.5%.",
    "[11/08/2026-10:21:33] [I] Explanations of the performance metrics are printed in the verbose logs.",
    "[11/08/2026-10:21:33] [I] ",
    "&&&& PASSED TensorRT.trtexec [TensorRT v100300] # trtexec --onnx=m.onnx",
])


def times_records(latencies):
    out, t = [], 0.0
    for latency in latencies:
        out.append({"startEnqMs": t, "endEnqMs": t + 0.5, "startH2dMs": t + 0.5, "endH2dMs": t + 0.6,
                    "startComputeMs": t + 0.6, "endComputeMs": t + latency - 0.1, "startD2hMs": t + latency - 0.1,
                    "endD2hMs": t + latency, "h2dMs": 0.1, "computeMs": latency - 0.7, "d2hMs": 0.1,
                    "latencyMs": latency})
        t += latency + 1.0
    return out


def test_summary_block_with_timestamps():
    s = parse_summary(LOG)
    assert s["throughput_qps"] == 234.19
    assert s["latency"] == {"min_ms": 4.27838, "max_ms": 5.82495, "mean_ms": 4.29966, "median_ms": 4.29718,
                            "p90_ms": 4.30725, "p95_ms": 4.31128, "p99_ms": 4.32874}
    assert s["gpu_compute"]["min_ms"] == 4.2 and s["enqueue"]["min_ms"] == 0.51 and s["d2h"]["min_ms"] == 0.02
    assert s["host_walltime_s"] == 3.00082 and s["gpu_compute_total_s"] == 2.96536
    assert s["gpu_compute_cv_warning"] == pytest.approx(0.025)


def test_summary_without_timestamps_and_missing_block():
    bare = "\n".join(line.split("] ", 1)[1] for line in LOG.splitlines()[2:6])
    assert parse_summary(bare)["latency"]["p99_ms"] == 4.32874
    with pytest.raises(EdgeError, match="Performance summary"):
        parse_summary("[I] Engine built in 12 s\n")


def test_export_times_into_the_profile_schema(tmp_path):
    path = tmp_path / "times.json"
    path.write_text(json.dumps(times_records([4.0, 5.0, 6.0, 7.0])))
    parsed = parse_times(path)
    assert parsed["latency"]["iterations"] == 4 and parsed["latency"]["mean_ms"] == pytest.approx(5.5)
    assert parsed["gpu_compute"]["median_ms"] == pytest.approx(4.8) and parsed["h2d"]["max_ms"] == pytest.approx(0.1)
    assert parsed["enqueue"]["mean_ms"] == pytest.approx(0.5)
    with pytest.raises(EdgeError, match="exportTimes"):
        parse_times([{"name": "x"}])


def test_export_profile_rows():
    rows = parse_profile([{"count": 100},
                          {"name": "fc1", "timeMs": 10.0, "averageMs": 0.1, "medianMs": 0.1, "percentage": 20.0},
                          {"name": "attn", "timeMs": 40.0, "averageMs": 0.4, "medianMs": 0.39, "percentage": 80.0}])
    assert [r["name"] for r in rows] == ["attn", "fc1"]
    assert rows[0] == {"name": "attn", "time_ms": 40.0, "average_ms": 0.4, "median_ms": 0.39, "percentage": 80.0}


def test_result_has_the_edge_profile_keys(tmp_path):
    result = trtexec_result(LOG, times_records([4.0, 5.0]), [{"count": 1}, {"name": "a", "timeMs": 1.0,
                            "averageMs": 1.0, "medianMs": 1.0, "percentage": 100.0}], precision="fp16")
    for key in ("backend", "device", "precision", "batch", "latency", "gpu_latency", "layers"):
        assert key in result
    for key in ("min_ms", "mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "throughput_qps"):
        assert key in result["latency"]
    assert result["latency"]["iterations"] == 2  # exported times win over the summary's rounded figures
    from_log = trtexec_result(LOG)
    assert from_log["latency"]["median_ms"] == 4.29718 and from_log["latency"]["throughput_qps"] == 234.19


def test_command_matches_the_build_config():
    strong = trtexec_command("m.onnx", "m.engine", BuildConfig(precision="fp16", workspace_mib=1024,
                                                               optimization_level=4, timing_cache="t.cache"))
    assert strong[:3] == ["trtexec", "--onnx=m.onnx", "--saveEngine=m.engine"]
    assert "--stronglyTyped" in strong and "--fp16" not in strong
    assert "--memPoolSize=workspace:1024M" in strong and "--builderOptimizationLevel=4" in strong
    assert "--timingCacheFile=t.cache" in strong and "--useCudaGraph" in strong
    assert "--exportTimes=m.times.json" in strong and "--exportProfile=m.profile.json" in strong
    weak = trtexec_command("m.onnx", "m.engine", BuildConfig(precision="fp16", strongly_typed=False), benchmark=False)
    assert "--fp16" in weak and "--stronglyTyped" not in weak and "--useCudaGraph" not in weak
    dynamic = trtexec_command("m.onnx", "m.engine", BuildConfig(min_batch=1, opt_batch=8, max_batch=32))
    filled = shape_arguments(dynamic, [-1, 1, 28, 28])
    assert "--minShapes=input:1x1x28x28" in filled and "--maxShapes=input:32x1x28x28" in filled


def test_trtexec_command_of_a_strongly_typed_fp16_build_points_at_the_fp16_graph(tmp_path, capsys, monkeypatch):
    """trtexec --stronglyTyped takes the precision from the file: the fp16 variant is written and named."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edge.cli import main
    from edge.trt import trtexec_command as trtexec_module

    monkeypatch.setattr(trtexec_module, "find_trtexec", lambda: None)  # as on a host without TensorRT
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["pixels", "w"], ["logits"])], "g",
                              [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], [w])
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(source))
    engine = tmp_path / "m.engine"
    assert main(["build", str(source), "--precision", "fp16", "--batch", "1", "--trtexec", "--out", str(engine),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    argv = result["command"]
    fp16 = tmp_path / "m.float16.onnx"
    assert f"--onnx={fp16}" in argv and "--stronglyTyped" in argv
    assert result["onnx_written"] == str(fp16)  # reported, and named in --trtexec's help (issue 19)
    assert "--shapes=pixels:1x8" in argv  # the graph's own input name
    converted = onnx.load(str(fp16))
    assert TensorProto.FLOAT16 in {t.data_type for t in converted.graph.initializer}
    assert not engine.exists()


def test_version_from_the_trtexec_banner():
    """trtexec's first line: "&&&& RUNNING TensorRT.trtexec [TensorRT v100300] # ..." (logging.h, defineTest)."""
    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v100300] # trtexec --help") == (10, 3, 0)
    assert banner_version("&&&& PASSED TensorRT.trtexec [TensorRT v101600] # trtexec") == (10, 16, 0)
    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v110000] [b114] # trtexec") == (11, 0, 0)
    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # trtexec") == (8, 6, 1)
    assert banner_version("[I] Engine built") is None


def test_tiling_level_is_passed_only_to_trtexec_10_8_and_later():
    """--tilingOptimizationLevel exists from 10.8 (sampleOptions.cpp); trtexec 10.3 stops with "Unknown option"."""
    config = BuildConfig(tiling_optimization_level=2)
    assert "--tilingOptimizationLevel=2" in trtexec_command("m.onnx", "m.engine", config, version=(10, 8, 0))
    assert "--tilingOptimizationLevel=2" in trtexec_command("m.onnx", "m.engine", config, version=(11, 0, 0))
    for version in ((10, 3, 0), (10, 7, 0), None):
        argv = trtexec_command("m.onnx", "m.engine", config, version=version)
        assert not any(a.startswith("--tilingOptimizationLevel") for a in argv)
        assert "10.8" in left_out(config, version)["--tilingOptimizationLevel"]


def test_flags_that_are_no_ops_in_trtexec_11_are_left_out_there():
    """trtexec 11: --stronglyTyped, --useCudaGraph, --noDataTransfers, --useSpinWait, --separateProfileRun are
    deprecated no-ops (their behaviour is the default); 10.x needs them."""
    no_ops = {"--stronglyTyped", "--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun"}
    old = trtexec_command("m.onnx", "m.engine", BuildConfig(), version=(10, 3, 0))
    new = trtexec_command("m.onnx", "m.engine", BuildConfig(), version=(11, 0, 0))
    assert no_ops <= set(old) and not no_ops & set(new)
    assert "--dumpProfile" in new and "--profilingVerbosity=detailed" in new and "--exportTimes=m.times.json" in new


def test_weakly_typed_trtexec_commands_check_the_version_and_calibrate(tmp_path):
    """--fp16/--int8/--best are gone from trtexec 11; --int8 without --calib quantizes with placeholder scales."""
    with pytest.raises(EdgeError, match="removed in TensorRT 11") as e:
        trtexec_command("m.onnx", "m.engine", BuildConfig(precision="fp16", strongly_typed=False), version=(11, 0, 0))
    assert "drop --weakly-typed" in str(e.value)
    onnx_path = str(tmp_path / "m.onnx")
    int8 = BuildConfig(precision="int8", strongly_typed=False)
    with pytest.raises(EdgeError, match="needs a calibration cache") as e:
        trtexec_command(onnx_path, "m.engine", int8, version=(10, 3, 0))
    assert "placeholder scales" in str(e.value) and "--weakly-typed --data" in str(e.value)
    cache = tmp_path / "m.onnx.calib.cache"  # what `edge build --weakly-typed --precision int8` writes
    cache.write_bytes(b"TRT-100300-EntropyCalibration2")
    argv = trtexec_command(onnx_path, "m.engine", int8, version=(10, 3, 0))
    assert "--int8" in argv and f"--calib={cache}" in argv
    best = trtexec_command(onnx_path, "m.engine", BuildConfig(precision="best", strongly_typed=False,
                                                              calibration_cache=str(cache)), version=(10, 3, 0))
    assert "--best" in best and f"--calib={cache}" in best


def test_exported_times_are_batch_aware_and_keep_trtexec_throughput():
    """Each --exportTimes record is one inference of the whole batch: images/s = batch / latency; trtexec's own
    throughput (which overlaps inferences) stays beside the figures computed from the exported times."""
    parsed = parse_times(times_records([4.0, 4.0]), batch=8)
    assert parsed["latency"]["throughput_qps"] == pytest.approx(250.0)
    assert parsed["latency"]["throughput_images_per_s"] == pytest.approx(2000.0)
    result = trtexec_result(LOG, times_records([4.0, 4.0]), batch=8)
    latency = result["latency"]
    assert latency["throughput_images_per_s"] == pytest.approx(2000.0) and latency["iterations"] == 2
    assert latency["trtexec_throughput_qps"] == 234.19
    assert latency["trtexec_throughput_images_per_s"] == pytest.approx(234.19 * 8)


FAKE_TRTEXEC = r"""#!{python}
# FakeTrtexec: NOT trtexec. Prints trtexec 10.3's banner and performance summary on stdout, its [W] lines on
# stderr (as trtexec does), and writes the --exportTimes/--exportProfile files it is asked for.
import json, sys
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
print("&&&& RUNNING TensorRT.trtexec [TensorRT v100300] # trtexec", flush=True)
if "--help" in sys.argv:
    sys.exit(0)
if "--tilingOptimizationLevel" in args:
    print("[E] Unknown option: --tilingOptimizationLevel", file=sys.stderr)
    sys.exit(1)
print({summary!r}, flush=True)
print("[11/08/2026-10:21:33] [W] * GPU compute time is unstable, with coefficient of variance = 12.5%.",
      file=sys.stderr, flush=True)
print("&&&& PASSED TensorRT.trtexec [TensorRT v100300] # trtexec", flush=True)
json.dump({times!r}, open(args["--exportTimes"], "w"))
json.dump([{{"count": 2}}, {{"name": "fc", "timeMs": 8.0, "averageMs": 4.0, "medianMs": 4.0, "percentage": 100.0}}],
          open(args["--exportProfile"], "w"))
"""


def test_trtexec_run_reads_its_warnings_from_stderr(tmp_path, capsys, monkeypatch):
    """The coefficient-of-variance warning is a [W] line on trtexec's stderr: it must reach the result."""
    import sys

    from edge.cli import main
    from edge.trt import trtexec_command as trtexec_module

    summary = "\n".join(line for line in LOG.splitlines() if "[W]" not in line and "&&&&" not in line)
    script = tmp_path / "trtexec"
    script.write_text(FAKE_TRTEXEC.format(python=sys.executable, summary=summary, times=times_records([4.0, 6.0])))
    script.chmod(0o755)
    monkeypatch.setattr(trtexec_module, "find_trtexec", lambda: str(script))
    source = tiny_graph(tmp_path / "m.onnx")
    engine = tmp_path / "m.engine"
    assert main(["build", str(source), "--trtexec", "--tiling-level", "2", "--out", str(engine), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["summary"]["gpu_compute_cv_warning"] == pytest.approx(0.125)
    assert any("coefficient of variance = 12.5%" in w for w in result["warnings"])
    assert result["trtexec_version"] == "10.3.0" and "--tilingOptimizationLevel" in result["left_out"]
    assert result["latency"]["median_ms"] == pytest.approx(5.0) and result["latency"]["trtexec_throughput_qps"]


def tiny_graph(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["pixels", "w"], ["logits"])], "g",
                              [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    return path


def test_edge_build_gives_trtexec_its_plugin_library_through_dynamic_plugins():
    """edge's plugin library exports getCreators: trtexec registers it only through --dynamicPlugins
    (IPluginRegistry::loadLibrary, samples/common/sampleEngines.cpp at v10.3.0 ~1249); --staticPlugins only
    dlopens it (samples/trtexec/trtexec.cpp ~300) and the parse fails with "Plugin not found"."""
    argv = trtexec_command("m.onnx", "m.engine", BuildConfig(plugins=("/p/libedge_plugins.so",)), benchmark=False)
    assert "--dynamicPlugins=/p/libedge_plugins.so" in argv
    assert not any(a.startswith("--staticPlugins") for a in argv)


def test_the_fake_trtexec_registers_a_getcreators_library_only_through_dynamic_plugins(tmp_path, monkeypatch):
    import subprocess

    from tests.fake_tensorrt import FAKE_NVCC_MAGIC
    from tests.jetson.fakes import install_fakes
    from tests.jetson.test_plugin_build import plugin_graph

    fakes = install_fakes(tmp_path / "device")
    for name, value in fakes.variables().items():
        monkeypatch.setenv(name, value)
    library = tmp_path / "libedge_plugins.so"
    library.write_bytes(FAKE_NVCC_MAGIC + json.dumps({"creators": ["TokenDepthwiseConv"]}).encode())
    graph = plugin_graph(tmp_path / "dw.onnx")
    engine = tmp_path / "dw.engine"
    for flag, code in (("--staticPlugins", 1), ("--dynamicPlugins", 0)):
        done = subprocess.run(["trtexec", f"--onnx={graph}", f"--saveEngine={engine}", f"{flag}={library}"],
                              capture_output=True, text=True)
        assert done.returncode == code, done.stdout
    assert engine.is_file()
