"""Builder and TensorRT-backend logic against FakeTensorRT (tests/fake_tensorrt.py), never real TensorRT.

What these check is the calls edge makes and the decisions it takes per TensorRT feature set
(10.3 on JetPack 6 vs 11.x); no engine is built and nothing is timed.
"""

import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.cli import main
from edge.errors import EdgeError
from edge.trt import BuildConfig, build_engine, detect_features
from edge.trt.manifest import check_compatible, manifest_path, read_manifest
from tests.fake_cuda import FakeCudaRuntime
from tests.fake_tensorrt import make_fake_tensorrt

#: the identity FakeCudaRuntime gives on an Orin Nano 8GB (what device_identity reads there)
NANO_MODEL = "NVIDIA Jetson Orin Nano Developer Kit"
FAKE_DEVICE = {"gpu": "Orin", "compute_capability": "8.7", "sm_count": 8, "memory_gib": 7,
               "memory_bytes": 7620 << 20, "device_model": NANO_MODEL, "cuda_driver": "12.6",
               "cuda_runtime": "12.6", "cuda_python_runtime": "12.6", "l4t": "36.4.3"}


def tiny_onnx(path, batch="1"):
    """input [B,16] -> MatMul -> Add -> LayerNormalization -> MatMul -> logits [B,4] (float32, edge metadata)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b1"),
             numpy_helper.from_array(np.ones(8, np.float32), "g"),
             numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
             numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["input", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
             helper.make_node("LayerNormalization", ["hb", "g", "beta"], ["n"], name="ln", axis=-1),
             helper.make_node("MatMul", ["n", "w2"], ["logits"], name="head")]
    dim = int(batch) if batch.isdigit() else batch
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [dim, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [dim, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in {"edge.input_size": "[1, 4, 4]", "edge.mean": "[0.5]", "edge.std": "[0.5]"}.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def fake_trt(monkeypatch, tmp_path):
    """Install a FakeTensorRT of a feature set as `tensorrt`, and its FakeCudaRuntime as cuda-python's runtime
    on an Orin Nano (device tree included); returns the TensorRT module (its runtime: ``module.cuda``)."""
    from edge.trt import cuda as cuda_module

    model = tmp_path / "device-tree-model"
    model.write_bytes(NANO_MODEL.encode() + b"\x00")
    monkeypatch.setattr(cuda_module, "DEVICE_TREE_MODEL", str(model))

    def install(feature_set="10.3", **kwargs):
        module = make_fake_tensorrt(feature_set, **kwargs)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        monkeypatch.setattr(cuda_module, "load_cudart", lambda: module.cuda)
        return module
    return install


def request_of(engine_path):
    """What the fake builder was asked (the fake 'engine' is that request as JSON)."""
    return json.loads(engine_path.read_bytes()[len(b"FAKE-ENGINE"):])


def build(tmp_path, config=None, model=None, **kwargs):
    model = model or tiny_onnx(tmp_path / "m.onnx")
    out = tmp_path / "m.engine"
    manifest = build_engine(model, out, config or BuildConfig(), display=lambda phase: None, device=FAKE_DEVICE,
                            **kwargs)
    return out, manifest


def test_without_tensorrt_build_says_how_to_install_and_other_commands_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    model = tiny_onnx(tmp_path / "m.onnx")
    assert main(["build", str(model), "--out", str(tmp_path / "m.engine")]) == 2
    err = capsys.readouterr().err
    assert "TensorRT was not found" in err and "JetPack" in err and "x86" in err
    assert not (tmp_path / "m.engine").exists() and not manifest_path(tmp_path / "m.engine").exists()
    import edge.trt  # noqa: F401  - importable without TensorRT
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensorrt"] is None


def test_type_stubs_alone_are_not_tensorrt(monkeypatch):
    import types

    stubs_only = types.ModuleType("tensorrt")  # what `tensorrt-stubs` in site-packages imports as
    monkeypatch.setitem(sys.modules, "tensorrt", stubs_only)
    from edge.trt import load_tensorrt

    with pytest.raises(EdgeError, match="type stubs only"):
        load_tensorrt()


def test_feature_sets_10_3_and_11(fake_trt):
    old, new = detect_features(fake_trt("10.3")), detect_features(fake_trt("11.0"))
    assert old.strongly_typed and new.strongly_typed
    assert old.has_builder_flag("FP16") and old.has_builder_flag("INT8") and old.int8_calibrator
    assert not new.has_builder_flag("FP16") and not new.has_builder_flag("INT8") and not new.int8_calibrator
    assert not old.tiling_optimization_level and new.tiling_optimization_level
    assert not old.editable_timing_cache and new.editable_timing_cache


@pytest.mark.parametrize("feature_set", ["10.3", "11.0"])
def test_strongly_typed_is_the_default_and_fp16_uses_the_fp16_onnx(tmp_path, fake_trt, feature_set):
    trt = fake_trt(feature_set)
    out, manifest = build(tmp_path, BuildConfig(precision="fp16"))
    request = request_of(out)
    # 10.3: 1 << STRONGLY_TYPED (= 1), nothing else; 11: no flag (STRONGLY_TYPED = 0 is deprecated, always on)
    assert request["flags"] == {"10.3": 1 << 1, "11.0": 0}[feature_set]
    assert request["builder_flags"] == []  # no weak-typing flag on a strongly typed build
    assert request["precision"] == "float16"  # the graph parsed is the fp16 variant
    parsed = [c for c in trt.calls if c[0] == "parse"]
    assert parsed[0][2] == ["float16"]
    assert manifest["strongly_typed"] and manifest["onnx"]["variant"] == "float16"
    assert manifest["onnx"]["conversion"].startswith("fp16 in memory")
    assert manifest["runtime"]["tensorrt"] == trt.__version__ and manifest["runtime"]["gpu"] == FAKE_DEVICE["gpu"]
    assert manifest["shapes"]["input"]["shape"] == [1, 16] and manifest["shapes"]["logits"]["io"] == "output"
    assert len(manifest["onnx"]["sha256"]) == 64 and manifest["engine"]["bytes"] == out.stat().st_size
    layers = json.loads((tmp_path / "m.engine.layers.json").read_text())
    assert layers["Layers"][0]["Name"] == "fake gemm"
    # TensorRT 11's inspector names the engine's inputs and outputs "I/O Tensors" (10.x: "Bindings")
    assert layers[{"10.3": "Bindings", "11.0": "I/O Tensors"}[feature_set]] == ["input", "logits"]


def test_legacy_weakly_typed_fp16_sets_the_builder_flag_on_10_3(tmp_path, fake_trt):
    fake_trt("10.3")
    out, manifest = build(tmp_path, BuildConfig(precision="fp16", strongly_typed=False))
    request = request_of(out)
    assert request["flags"] == 0 and request["builder_flags"] == ["FP16"] and request["precision"] == "float32"
    assert manifest["knobs"]["honoured"]["builder_flags"] == ["FP16"]


def test_legacy_flags_are_refused_on_11_with_the_way_out(tmp_path, fake_trt):
    fake_trt("11.0")
    with pytest.raises(EdgeError, match="removed in TensorRT 11") as e:
        build(tmp_path, BuildConfig(precision="fp16", strongly_typed=False))
    assert "strongly typed" in str(e.value)
    assert not (tmp_path / "m.engine").exists()


def test_legacy_int8_needs_the_calibrator_class(tmp_path, fake_trt):
    fake_trt("10.3")
    trt = sys.modules["tensorrt"]
    del trt.IInt8EntropyCalibrator2  # a 10.x build without the deprecated calibrator
    with pytest.raises(EdgeError, match="no INT8 calibrator"):
        build(tmp_path, BuildConfig(precision="int8", strongly_typed=False, calibration_data="fmnist-mini"))


def test_legacy_int8_calibrates_on_the_images_edge_build_supplies(tmp_path, fake_trt, monkeypatch, capsys):
    """edge build hands calib's seeded sampler to the builder; edge.trt itself never imports calib."""
    import edge.precision.calibration

    fake_trt("10.3")
    sampled = []
    sampler = edge.precision.calibration.calibration_images

    def recording_sampler(*args):
        sampled.append(sampler(*args))
        return sampled[-1]

    monkeypatch.setattr(edge.precision.calibration, "calibration_images", recording_sampler)
    model, out = tiny_onnx(tmp_path / "m.onnx"), tmp_path / "m.engine"
    assert main(["build", str(model), "--precision", "int8", "--weakly-typed", "--data", "fmnist-mini",
                 "--samples", "20", "--out", str(out), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert len(sampled) == 1 and sampled[0].shape == (20, 1, 4, 4) and sampled[0].dtype == np.float32
    assert request_of(out)["calibrator"] == "EntropyCalibrator" and request_of(out)["builder_flags"] == ["INT8"]
    assert manifest["knobs"]["honoured"]["int8_calibrator"] == "IInt8EntropyCalibrator2 (legacy)"
    with pytest.raises(EdgeError, match="no calibration_images") as e:  # the library call without them
        build(tmp_path, BuildConfig(precision="int8", strongly_typed=False, calibration_data="fmnist-mini"))
    assert "edge.precision.calibration.calibration_images" in str(e.value)


def test_strongly_typed_int8_asks_for_the_qdq_graph(tmp_path, fake_trt):
    fake_trt("11.0")
    with pytest.raises(EdgeError, match="Q/DQ graph") as e:
        build(tmp_path, BuildConfig(precision="int8"))
    assert "edge quantize" in str(e.value)


def test_parser_failure_names_each_node(tmp_path, fake_trt):
    fake_trt("10.3", unsupported_ops=("LayerNormalization", "MatMul"))
    with pytest.raises(EdgeError) as e:
        build(tmp_path)
    text = str(e.value)
    assert "cannot parse" in text and "(3 errors)" in text
    assert "node 0 (fc1: MatMul): No importer registered for op: MatMul" in text
    assert "node 2 (ln: LayerNormalization)" in text and "node 3 (head: MatMul)" in text
    assert not (tmp_path / "m.engine").exists()


def test_workspace_limit_default_and_option(tmp_path, fake_trt):
    fake_trt("10.3")
    out, manifest = build(tmp_path)
    # 2 GiB workspace and 3 GiB tactic memory by default for an 8 GB Orin Nano (jetson.bundle says why)
    assert request_of(out)["pools"] == {"WORKSPACE": 2048 << 20, "TACTIC_DRAM": 3072 << 20}
    assert manifest["knobs"]["honoured"]["tactic_dram_mib"] == 3072
    out, manifest = build(tmp_path, BuildConfig(workspace_mib=512, optimization_level=5, tactic_dram_mib=None))
    request = request_of(out)
    assert request["pools"] == {"WORKSPACE": 512 << 20} and request["optimization_level"] == 5
    assert manifest["knobs"]["honoured"]["workspace_mib"] == 512 and "tactic_dram_mib" not in manifest["knobs"][
        "honoured"]
    with pytest.raises(EdgeError, match="workspace"):
        build(tmp_path, BuildConfig(workspace_mib=0))
    with pytest.raises(EdgeError, match="--tactic-dram 3072 MiB below --workspace 4096 MiB"):
        build(tmp_path, BuildConfig(workspace_mib=4096))  # raise --tactic-dram with it
    out, manifest = build(tmp_path, BuildConfig(workspace_mib=4096, tactic_dram_mib=4096))
    assert request_of(out)["pools"] == {"WORKSPACE": 4096 << 20, "TACTIC_DRAM": 4096 << 20}


def test_timing_cache_round_trip_and_mismatch(tmp_path, fake_trt):
    fake_trt("10.3")
    cache = tmp_path / "orin.cache"
    _, first = build(tmp_path, BuildConfig(timing_cache=str(cache)))
    assert first["timing_cache"]["hit"] is False and cache.read_bytes() == b"FAKE-CACHE:10.3.0.30:5"
    _, second = build(tmp_path, BuildConfig(timing_cache=str(cache)))
    assert second["timing_cache"]["hit"] is True and second["timing_cache"]["loaded_bytes"] == len(b"FAKE-CACHE:"
                                                                                                     b"10.3.0.30:5")
    assert cache.read_bytes() == b"FAKE-CACHE:10.3.0.30:10"  # loaded, extended, saved
    fake_trt("11.0")
    with pytest.raises(EdgeError, match="timing cache"):
        build(tmp_path, BuildConfig(timing_cache=str(cache)))


def test_tiling_level_is_honoured_only_where_it_exists(tmp_path, fake_trt):
    fake_trt("10.3")
    _, manifest = build(tmp_path, BuildConfig(tiling_optimization_level=2))
    assert "tiling_optimization_level" in manifest["knobs"]["not_available"]
    fake_trt("11.0")
    out, manifest = build(tmp_path, BuildConfig(tiling_optimization_level=2))
    assert manifest["knobs"]["honoured"]["tiling_optimization_level"] == 2 and request_of(out)["tiling"] == "TILING_2"


def test_dynamic_batch_gets_an_optimisation_profile(tmp_path, fake_trt):
    fake_trt("10.3")
    model = tiny_onnx(tmp_path / "dyn.onnx", batch="batch")
    out, manifest = build(tmp_path, BuildConfig(min_batch=1, opt_batch=8, max_batch=32), model=model)
    assert request_of(out)["profiles"] == [{"input": [[1, 16], [8, 16], [32, 16]]}]
    assert manifest["shapes"]["profile"]["input"]["max"] == [32, 16]
    with pytest.raises(EdgeError, match="static batch"):
        build(tmp_path, BuildConfig(batch=4))  # the default tiny graph has a static batch


def test_failed_build_writes_nothing(tmp_path, fake_trt):
    fake_trt("10.3", fail_build=True)
    with pytest.raises(EdgeError, match="could not build"):
        build(tmp_path)
    assert not list(tmp_path.glob("m.engine*"))


def test_profile_refuses_an_engine_built_for_another_gpu_or_tensorrt(tmp_path, fake_trt, monkeypatch):
    trt = fake_trt("10.3")
    engine, manifest = build(tmp_path)
    from edge.trt import cuda as cuda_module

    h100 = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multiProcessorCount": 132,
            "totalGlobalMem": 80 << 30}
    monkeypatch.setattr(cuda_module, "load_cudart", lambda: FakeCudaRuntime(h100))
    from edge.profile.tensorrt import TensorRTBackend

    with pytest.raises(EdgeError, match="built for another TensorRT or GPU") as e:
        TensorRTBackend(engine)
    text = str(e.value)
    assert "compute_capability 8.7" in text and "compute_capability 9.0" in text and "edge build" in text
    monkeypatch.setattr(cuda_module, "load_cudart", lambda: trt.cuda)
    fake_trt("11.0")
    with pytest.raises(EdgeError, match="tensorrt 10.3.0.30"):
        TensorRTBackend(engine)
    # the same identity passes the check
    check_compatible(engine, read_manifest(engine), {"tensorrt": "10.3.0.30", **FAKE_DEVICE})
    engine.write_bytes(engine.read_bytes() + b"x")
    with pytest.raises(EdgeError, match="sha256"):
        check_compatible(engine, read_manifest(engine), {"tensorrt": "10.3.0.30", **FAKE_DEVICE})


def test_layer_table_shares_and_order():
    from edge.profile.tensorrt import layer_table

    rows = layer_table({"a": [1.0, 1.0], "b": [3.0, 5.0]}, runs=2)
    assert [r["name"] for r in rows] == ["b", "a"]
    assert rows[0]["average_ms"] == 4.0 and rows[0]["median_ms"] == 4.0 and rows[0]["percentage"] == 80.0


def int8_onnx(path):
    """The tiny graph tagged as `edge quantize --precision int8` output (the fake parser reads only the tag)."""
    from edge.onnx_metadata import set_precision_metadata

    model = onnx.load(str(tiny_onnx(path)))
    set_precision_metadata(model, "int8")
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("feature_set", ["10.3", "11.0"])
def test_best_builds_the_int8_qdq_graph(tmp_path, fake_trt, feature_set):
    """best = the int8 Q/DQ graph, float16 where it is not quantized (INT8+FP16), never an fp16 conversion."""
    trt = fake_trt(feature_set)
    out, manifest = build(tmp_path, BuildConfig(precision="best"), model=int8_onnx(tmp_path / "m.int8.onnx"))
    assert request_of(out)["precision"] == "int8" and manifest["onnx"]["variant"] == "int8"
    assert manifest["onnx"]["conversion"] is None
    trt.calls.clear()
    with pytest.raises(EdgeError, match="strongly typed best build needs the Q/DQ graph") as e:
        build(tmp_path, BuildConfig(precision="best"))  # a float32 graph
    assert "edge quantize" in str(e.value) and "float16 elsewhere" in str(e.value)
    assert ("build",) not in trt.calls


def test_cuda_python_and_the_device_are_checked_before_the_build(tmp_path, fake_trt, monkeypatch):
    """A missing cuda-python must stop `edge build` before TensorRT's minutes-long build, not throw the engine away."""
    from edge.trt import cuda as cuda_module

    real_loader = cuda_module.load_cudart
    trt = fake_trt("10.3")
    monkeypatch.setattr(cuda_module, "load_cudart", real_loader)
    monkeypatch.setitem(sys.modules, "cuda", None)  # cuda-python not installed
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    model, out = tiny_onnx(tmp_path / "m.onnx"), tmp_path / "m.engine"
    with pytest.raises(EdgeError, match="cuda-python was not found") as e:
        build_engine(model, out, BuildConfig(), display=lambda phase: None)
    assert "cuda-python>=12.6,<13" in str(e.value)
    assert ("build",) not in trt.calls and not out.exists()
    monkeypatch.setattr(cuda_module, "load_cudart", lambda: trt.cuda)
    (tmp_path / "folder.engine").mkdir()
    with pytest.raises(EdgeError, match="is a folder"):
        build_engine(model, tmp_path / "folder.engine", BuildConfig(), display=lambda phase: None)
    assert ("build",) not in trt.calls
    build_engine(model, out, BuildConfig(), display=lambda phase: None)  # device=None: read through cuda-python
    assert trt.calls.count(("build",)) == 1 and read_manifest(out)["runtime"]["sm_count"] == 8


def test_legacy_calibrator_batches_at_the_network_input_shape(tmp_path, fake_trt, monkeypatch):
    """TensorRT 10 reads each calibration batch at the input's shape: batch 1 here (it used to get 8 images)."""
    trt = fake_trt("10.3")
    images = np.random.default_rng(0).standard_normal((20, 1, 4, 4)).astype(np.float32)
    out, manifest = build(tmp_path, BuildConfig(precision="int8", strongly_typed=False, calibration_data="d",
                                                calibration_samples=20),
                          calibration_images=lambda *args: images)
    calibration = request_of(out)["calibration"]
    assert calibration == {"batches": 20, "images": 20, "shapes": {"input": [1, 16]}}
    assert manifest["knobs"]["honoured"]["calibration_shape"] == [1, 16]
    assert (tmp_path / "m.onnx.calib.cache").read_bytes() == b"FAKE-CALIBRATION"
    assert trt.cuda.copies.count(("cudaMemcpyHostToDevice", 16 * 4)) == 20


def test_dynamic_graph_calibrates_at_the_calibration_profile(tmp_path, fake_trt):
    """A dynamic batch needs a calibration profile; TensorRT calibrates at its opt shape (batch 4 here)."""
    fake_trt("10.3")
    model = tiny_onnx(tmp_path / "dyn.onnx", batch="batch")
    images = np.random.default_rng(0).standard_normal((10, 1, 4, 4)).astype(np.float32)
    config = BuildConfig(precision="int8", strongly_typed=False, calibration_data="d", calibration_samples=10,
                         min_batch=1, opt_batch=4, max_batch=8)
    out, manifest = build(tmp_path, config, model=model, calibration_images=lambda *args: images)
    assert request_of(out)["calibration"] == {"batches": 2, "images": 8, "shapes": {"input": [4, 16]}}
    config.opt_batch = config.max_batch = 16
    with pytest.raises(EdgeError, match="fewer than one calibration batch"):
        build(tmp_path, config, model=model, calibration_images=lambda *args: images)


def test_profiler_registers_plugins_before_deserialising(tmp_path, fake_trt, monkeypatch):
    """An engine with TensorRT plugin layers and a plugin library loads in a fresh process only after both are
    registered, as at build time (the fake's registry is per module, TensorRT's per process)."""
    from edge.profile.tensorrt import TensorRTBackend

    library = tmp_path / "libmy_plugin.so"
    library.write_bytes(b"not really a library")
    fake_trt("10.3", plugin_layers=("LayerNormalization",))
    engine, manifest = build(tmp_path, BuildConfig(plugins=(str(library),)))
    assert manifest["plugins"] == [str(library)]
    trt = fake_trt("10.3", plugin_layers=("LayerNormalization",))  # a new process: nothing registered yet
    backend = TensorRTBackend(engine, layer_runs=0)
    assert ("init_libnvinfer_plugins", "") in trt.calls and ("load_library", str(library)) in trt.calls
    assert backend.plugins == [str(library)]
    backend.close()
    library.unlink()
    fake_trt("10.3", plugin_layers=("LayerNormalization",))
    with pytest.raises(EdgeError, match="libmy_plugin.so, which does not exist here") as e:
        TensorRTBackend(engine)
    assert "--plugin" in str(e.value)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_profiler_runs_the_engine_on_the_fake_gpu(tmp_path, fake_trt, cuda_graph):
    """The execution lines (buffers, copies, stream, events, CUDA graph, layer profiler, release) on FakeCudaRuntime."""
    from edge.profile.tensorrt import TensorRTBackend

    trt = fake_trt("11.0")
    model = tiny_onnx(tmp_path / "dyn.onnx", batch="batch")
    engine, _ = build(tmp_path, BuildConfig(min_batch=1, opt_batch=4, max_batch=8), model=model)
    cuda = trt.cuda
    backend = TensorRTBackend(engine, batch=4, cuda_graph=cuda_graph, layer_runs=3)
    assert backend.batch == 4 and backend.io["logits"]["shape"] == [4, 4]
    assert {cuda.allocation_size(p) for p in backend.buffers.values()} == {4 * 16 * 4, 4 * 4 * 4}
    assert cuda.copies == [("cudaMemcpyHostToDevice", 4 * 16 * 4)]  # the input, filled once
    for _ in range(5):
        backend.infer()
    assert backend.gpu_ms == [1.0] * 5  # the fake layers' 0.75 + 0.25 ms per inference, timed by the events
    report = backend.report()
    assert report["gpu_latency"]["median_ms"] == 1.0 and report["gpu_latency"]["throughput_images_per_s"] == 4000.0
    assert [(r["name"], r["average_ms"]) for r in report["layers"]] == [("fake gemm", 0.75), ("fake norm", 0.25)]
    assert backend.describe()["cuda_graph"] is cuda_graph
    backend.close()
    assert cuda.leaks() == {}
    with pytest.raises(EdgeError, match="outside the engine's optimisation profile"):
        TensorRTBackend(engine, batch=16)


def test_feature_detection_finds_python_plugins_without_importing_them(tmp_path, fake_trt, monkeypatch):
    """Importing tensorrt.plugin logs an "experimental" warning on every run: detection must not import it."""
    package = tmp_path / "pkg" / "tensorrt"
    package.mkdir(parents=True)
    (package / "plugin.py").write_text("raise AssertionError('tensorrt.plugin was imported')\n")
    trt = fake_trt("11.0")
    trt.__path__ = [str(package)]  # the real module is a package; tensorrt.plugin is a submodule
    monkeypatch.delitem(sys.modules, "tensorrt.plugin", raising=False)
    assert detect_features(trt).python_plugins
    assert "tensorrt.plugin" not in sys.modules
    assert not detect_features(fake_trt("10.3")).python_plugins  # no such submodule


def test_tf32_is_not_a_removed_weak_typing_flag(fake_trt):
    """TensorRT 11 kept BuilderFlag.TF32: only FP16/INT8/BF16/FP8/... and the precision constraints went."""
    new = fake_trt("11.0")
    assert hasattr(new.BuilderFlag, "TF32")
    features = detect_features(new)
    assert features.weak_typing_flags == () and features.always_strongly_typed
    assert not detect_features(fake_trt("10.3")).always_strongly_typed


def test_two_builds_with_one_plugin_library_in_one_process_register_it_once(tmp_path, fake_trt):
    """TensorRT's plugin registry is process-wide and refuses creators registered already (loadLibrary returns
    nullptr, include/NvInferRuntimeCommon.h at v10.3.0): a second build in the same process reuses the first
    registration; a library TensorRT refuses is named."""
    library = tmp_path / "libmy_plugin.so"
    library.write_bytes(b"not really a library")
    trt = fake_trt("10.3")
    build(tmp_path, BuildConfig(plugins=(str(library),)))
    build(tmp_path, BuildConfig(plugins=(str(library),)))
    assert trt.calls.count(("load_library", str(library))) == 1
    from tests.fake_tensorrt import FAKE_NVCC_MAGIC

    first, second = tmp_path / "libfirst.so", tmp_path / "libsecond.so"  # two libraries with one creator
    for path in (first, second):
        path.write_bytes(FAKE_NVCC_MAGIC + b'{"creators": ["TokenDepthwiseConv"]}')
    build(tmp_path, BuildConfig(plugins=(str(first),)))
    with pytest.raises(EdgeError, match="TensorRT could not load the plugin library .*libsecond.so"):
        build(tmp_path, BuildConfig(plugins=(str(second),)))
