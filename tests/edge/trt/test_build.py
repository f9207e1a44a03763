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
from tests.fake_tensorrt import FAKE_DEVICE, FakeCudart, make_fake_tensorrt


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
def fake_trt(monkeypatch):
    """Install a FakeTensorRT of a feature set as `tensorrt`; returns the module."""
    def install(feature_set="10.3", **kwargs):
        module = make_fake_tensorrt(feature_set, **kwargs)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
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
    assert request["flags"] == 1 << 1  # 1 << STRONGLY_TYPED, nothing else
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
    assert layers["Layers"][0]["Name"] == "fake layer"


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


class CalibratingCudart(FakeCudart):
    """FakeCudart plus the buffer the legacy calibrator allocates (nothing is copied: the fake never calibrates)."""

    def cudaMalloc(self, nbytes: int):
        return 0, 4096

    def cudaFree(self, pointer: int):
        return (0,)


def test_legacy_int8_calibrates_on_the_images_edge_build_supplies(tmp_path, fake_trt, monkeypatch, capsys):
    """edge build hands calib's seeded sampler to the builder; edge.trt itself never imports calib."""
    import calib.data
    from edge.trt import cuda as cuda_module

    fake_trt("10.3")
    monkeypatch.setattr(cuda_module, "load_cudart", lambda: CalibratingCudart())
    sampled = []
    sampler = calib.data.calibration_images

    def recording_sampler(*args):
        sampled.append(sampler(*args))
        return sampled[-1]

    monkeypatch.setattr(calib.data, "calibration_images", recording_sampler)
    model, out = tiny_onnx(tmp_path / "m.onnx"), tmp_path / "m.engine"
    assert main(["build", str(model), "--precision", "int8", "--weakly-typed", "--data", "fmnist-mini",
                 "--samples", "20", "--out", str(out), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert len(sampled) == 1 and sampled[0].shape == (20, 1, 4, 4) and sampled[0].dtype == np.float32
    assert request_of(out)["calibrator"] == "EntropyCalibrator" and request_of(out)["builder_flags"] == ["INT8"]
    assert manifest["knobs"]["honoured"]["int8_calibrator"] == "IInt8EntropyCalibrator2 (legacy)"
    with pytest.raises(EdgeError, match="no calibration_images") as e:  # the library call without them
        build(tmp_path, BuildConfig(precision="int8", strongly_typed=False, calibration_data="fmnist-mini"))
    assert "calib.data.calibration_images" in str(e.value)


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
    assert request_of(out)["pools"] == {"WORKSPACE": 2048 << 20}  # 2 GiB default for an 8 GB Orin Nano
    out, manifest = build(tmp_path, BuildConfig(workspace_mib=512, optimization_level=5))
    request = request_of(out)
    assert request["pools"] == {"WORKSPACE": 512 << 20} and request["optimization_level"] == 5
    assert manifest["knobs"]["honoured"]["workspace_mib"] == 512
    with pytest.raises(EdgeError, match="workspace"):
        build(tmp_path, BuildConfig(workspace_mib=0))


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
    fake_trt("10.3")
    engine, manifest = build(tmp_path)
    from edge.trt import cuda as cuda_module

    monkeypatch.setattr(cuda_module, "load_cudart", lambda: FakeCudart("NVIDIA H100", 9, 0))
    from edge.profile.tensorrt import TensorRTBackend

    with pytest.raises(EdgeError, match="built for another TensorRT or GPU") as e:
        TensorRTBackend(engine)
    text = str(e.value)
    assert "compute_capability 8.7" in text and "compute_capability 9.0" in text and "edge build" in text
    monkeypatch.setattr(cuda_module, "load_cudart", lambda: FakeCudart())
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
