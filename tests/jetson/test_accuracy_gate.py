"""The accuracy gate (jetson.accuracy_gate): the comparison and its thresholds, batching, and the runner marking
a variant whose engine computes wrong outputs ``wrong`` while the others go on (FakeTensorRT's
FAKE_TENSORRT_WRONG_OUTPUTS; ONNX Runtime runs for real)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from edge.bundle import BundleConfig, make_bundle

from jetson.accuracy_gate import (
    PASS,
    THRESHOLDS,
    WRONG,
    GateSpec,
    Thresholds,
    judge,
    run_in_batches,
    thresholds_for,
)
from jetson.bundle import Protocol, read_bundle
from jetson.errors import JetsonError
from jetson.runner import RunOptions, run
from tests.edge.trt.test_build import tiny_onnx
from tests.fake_tensorrt import WRONG_OUTPUTS


def logits(images=32, classes=10, seed=0):
    return np.random.default_rng(seed).standard_normal((images, classes)).astype(np.float32)


def test_identical_outputs_pass_with_zero_error():
    ref = logits()
    verdict = judge({"logits": ref.copy()}, {"logits": ref}, THRESHOLDS["fp32"], "a.fp32")
    assert verdict["status"] == PASS and verdict["failures"] == []
    assert verdict["top1_agreement"] == 1.0 and verdict["max_abs_error"] == 0.0 and verdict["max_rel_error"] == 0.0


def test_tf32_sized_noise_passes_fp32_but_not_fp32_without_tf32():
    ref = logits()
    scale = float(np.abs(ref).max())
    noisy = ref + np.float32(3e-3 * scale) * np.sign(logits(seed=1))  # 3e-3 of the scale: TF32's order, x3
    assert judge({"logits": noisy}, {"logits": ref}, thresholds_for("fp32", tf32=True), "a.fp32")["status"] == PASS
    strict = judge({"logits": noisy}, {"logits": ref}, thresholds_for("fp32", tf32=False), "a.fp32")
    assert strict["status"] == WRONG and strict["failures"] == ["logits: max rel error 0.003 > 0.001"]
    assert strict["max_rel_error"] == pytest.approx(3e-3, rel=1e-3)


def test_fp16_error_bound_and_int8_judged_by_agreement_only():
    ref = logits()
    off = ref * 1.2  # 20 % of the scale everywhere, the same arg-max
    assert judge({"logits": off}, {"logits": ref}, thresholds_for("fp16"), "a.fp16")["status"] == WRONG
    int8 = judge({"logits": off}, {"logits": ref}, thresholds_for("int8"), "a.int8")
    assert int8["status"] == PASS and int8["top1_agreement"] == 1.0


def test_top1_agreement_below_the_threshold_is_wrong():
    ref = logits(images=10)
    flipped = ref.copy()
    flipped[:3] = -flipped[:3]  # 3 of 10 images get another top-1: agreement 0.7
    verdict = judge({"logits": flipped}, {"logits": ref}, Thresholds(0.8, None), "a.int8")
    assert verdict["status"] == WRONG and verdict["top1_agreement"] == pytest.approx(0.7)
    assert verdict["failures"] == ["logits: top-1 agreement 0.700 < 0.8"]


def test_nan_outputs_are_wrong_even_where_no_error_bound_applies():
    ref = logits()
    broken = ref.copy()
    broken[0, 0] = np.nan
    broken[1, 1] = np.inf
    verdict = judge({"logits": broken}, {"logits": ref}, Thresholds(None, None), "a.int8")
    assert verdict["status"] == WRONG
    assert verdict["outputs"]["logits"]["non_finite"] == 2
    assert "logits: 2 non-finite values (NaN or infinity)" in verdict["failures"]
    assert np.isfinite(verdict["max_abs_error"])  # figures of the finite values: JSON holds them


def test_features_without_a_class_axis_are_judged_by_error_alone():
    ref = logits()[:, :1]
    verdict = judge({"feature": ref}, {"feature": ref}, THRESHOLDS["fp16"], "a.fp16")
    assert verdict["status"] == PASS and verdict["top1_agreement"] is None


def test_a_shape_mismatch_is_an_error_naming_the_variant_and_the_output():
    with pytest.raises(JetsonError, match=r"b\.fp16: the engine's output 'logits' has shape \[32, 5\]") as e:
        judge({"logits": logits(classes=5)}, {"logits": logits()}, THRESHOLDS["fp16"], "b.fp16")
    assert "make the bundle again" in e.value.fix
    with pytest.raises(JetsonError, match=r"b\.fp16: the engine has no output 'logits'"):
        judge({"other": logits()}, {"logits": logits()}, THRESHOLDS["fp16"], "b.fp16")


def test_batches_of_a_fixed_engine_batch_pad_the_last_chunk_and_drop_the_padding():
    images = np.arange(10, dtype=np.float32).reshape(10, 1)
    seen = []

    def engine(chunk):
        seen.append(chunk["x"][:, 0].tolist())
        return {"y": chunk["x"] * 2}

    out = run_in_batches(engine, {"x": images}, 4, "a.fp32")
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 9, 9]]  # the last chunk padded with its last image
    assert out["y"][:, 0].tolist() == [2 * i for i in range(10)]


def test_an_output_without_the_batch_first_is_refused():
    with pytest.raises(JetsonError, match="output 'y' has shape \\[3\\]"):
        run_in_batches(lambda chunk: {"y": np.zeros(3)}, {"x": np.zeros((4, 1))}, 4, "a.fp32")


def test_thresholds_from_a_manifest_are_type_checked():
    spec = {"inputs": {"x": "gate/inputs/1.npy"}, "reference": {"y": "gate/a/reference_0.npy"}, "images": 4,
            "data": "random", "source": "a.onnx", "thresholds": {"min_top1_agreement": "high", "max_rel_error": 1}}
    with pytest.raises(JetsonError, match="threshold min_top1_agreement is 'high'"):
        GateSpec.from_json(spec, "variant a")


def test_the_bundle_carries_images_and_the_source_graphs_float32_outputs(bundle):
    loaded = read_bundle(bundle)
    gate = loaded.variants[0].gate
    assert gate is not None and gate.images == 32 and gate.data == "fmnist-mini:test"
    assert gate.thresholds == THRESHOLDS["fp32"]
    images = np.load(bundle / gate.inputs["input"])
    reference = np.load(bundle / gate.reference["logits"])
    assert images.shape == (32, 16) and images.dtype == np.float32 and reference.shape == (32, 4)
    assert loaded.variants[1].gate.inputs == gate.inputs  # equal images written once


def test_ort_engines_pass_the_gate_for_real(bundle):
    assert run(RunOptions(bundle=bundle, backend="ort", energy="off")) == 0
    for variant in ("a.fp32", "b.fp32"):
        accuracy = json.loads((bundle / "results" / f"{variant}.json").read_text())["accuracy"]
        assert accuracy["status"] == PASS and accuracy["top1_agreement"] == 1.0
        assert accuracy["max_rel_error"] < 1e-5 and accuracy["images"] == 32


@pytest.fixture
def two_graphs(tmp_path) -> Path:
    """Variants a (batch 1) and b (static batch 3: the gate's 32 images in 11 chunks, the last one padded)."""
    graphs = [tiny_onnx(tmp_path / "a.onnx"), tiny_onnx(tmp_path / "b.onnx", batch="3")]
    make_bundle(graphs, tmp_path / "bundle", BundleConfig(check_data="fmnist-mini", precisions=("fp32",),
                                                          protocol=Protocol(
        warmup=2, warmup_s=None, iterations=20, duration_s=None, energy_duration_s=None, idle_s=0.3)))
    return tmp_path / "bundle"


def test_a_fake_engine_with_wrong_outputs_is_marked_wrong_and_the_others_go_on(two_graphs, fake_device, tmp_path,
                                                                                  monkeypatch):
    bundle = two_graphs
    monkeypatch.setenv(WRONG_OUTPUTS, "b.fp32")
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 0
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert {i: (v["status"], v["accuracy"]) for i, v in summary["variants"].items()} == {
        "a.fp32": ("done", PASS), "b.fp32": ("done", WRONG)}
    right = json.loads((bundle / "results" / "a.fp32.json").read_text())
    wrong = json.loads((bundle / "results" / "b.fp32.json").read_text())
    assert right["accuracy"]["status"] == PASS and right["accuracy"]["max_rel_error"] < 1e-6
    assert wrong["accuracy"]["status"] == WRONG and wrong["accuracy"]["top1_agreement"] < 0.2
    assert any("top-1 agreement" in f for f in wrong["accuracy"]["failures"])
    assert wrong["accuracy"]["batch"] == 3 and wrong["accuracy"]["images"] == 32
    assert wrong["latency"]["iterations"] == 20  # measured (and shown as wrong), not a lost variant
    assert fake_device.cuda.leaks() == {}
    log = (bundle / "results" / "logs" / "run.log").read_text()
    assert "b.fp32: accuracy gate wrong on 32 images" in log and "its latency is no speedup" in log


def test_the_report_shows_the_wrong_variant_and_the_host_accepts_the_gates_fields(two_graphs, fake_device, tmp_path,
                                                                                   monkeypatch):
    from edge.deploy.results import FetchedDevice, fetched_devices
    from edge.deploy.untrusted import check_results
    from edge.pipeline.device_report import device_html, device_markdown, device_section

    monkeypatch.setenv(WRONG_OUTPUTS, "b.fp32")
    assert run(RunOptions(bundle=two_graphs, energy="off", cache_dir=tmp_path / "cache")) == 0
    check_results(two_graphs / "results", "nvidia@jetson")  # the runner's own fields pass the host's check
    device = tmp_path / "fetched" / "jetson"
    device.mkdir(parents=True)
    (device / "deploy.json").write_text(json.dumps({"host": "nvidia@jetson", "label": "jetson", "status": "ok",
                                                    "error": None}))
    (device / "results").symlink_to(two_graphs / "results")
    fetched = fetched_devices(tmp_path / "fetched")
    assert [type(f) for f in fetched] == [FetchedDevice]
    section = device_section(fetched, tmp_path)
    assert section["wrong"] == ["jetson: b.fp32"]
    rows = {v["id"]: v["accuracy"] for v in section["devices"][0]["variants"]}
    assert rows["a.fp32"]["status"] == "pass" and rows["b.fp32"]["status"] == "wrong"
    markdown = "\n".join(device_markdown(section))
    assert "| jetson | b | fp32 | tensorrt | wrong | wrong (top-1 " in markdown
    assert "| jetson | a | fp32 | tensorrt | done | pass (top-1 1.000, rel 0) |" in markdown
    assert "Wrong: jetson: b.fp32: the engine computes other outputs than its graph, so its latency is no " \
           "speedup" in markdown
    assert "<td class=\"text\">wrong</td>" in device_html(section)


@pytest.mark.parametrize("field, value, named", [
    ("status", "fine", "accuracy.status is str 'fine'"),
    ("max_rel_error", "0.1", "accuracy.max_rel_error is str '0.1'"),
    ("failures", ["ok", 3], "accuracy.failures[1] is int '3'"),
    ("outputs", {"logits": {"non_finite": "none"}}, "accuracy.outputs.logits.non_finite is str 'none'"),
])
def test_hostile_gate_fields_are_refused_naming_the_file_and_field(bundle, tmp_path, field, value, named):
    from edge.deploy.ssh import DeployError
    from edge.deploy.untrusted import check_results

    assert run(RunOptions(bundle=bundle, backend="ort", energy="off")) == 0
    path = bundle / "results" / "a.fp32.json"
    result = json.loads(path.read_text())
    result["accuracy"][field] = value
    path.write_text(json.dumps(result))
    with pytest.raises(DeployError, match=re.escape(f"results/a.fp32.json: {named}")):
        check_results(bundle / "results", "nvidia@jetson")


def test_a_run_summary_with_an_unknown_verdict_is_refused(bundle):
    from edge.deploy.ssh import DeployError
    from edge.deploy.untrusted import check_results

    assert run(RunOptions(bundle=bundle, backend="ort", energy="off", variants=("a.fp32",))) == 0
    path = bundle / "results" / "run.json"
    summary = json.loads(path.read_text())
    summary["variants"]["a.fp32"]["accuracy"] = {"status": "pass"}
    path.write_text(json.dumps(summary))
    with pytest.raises(DeployError, match=r"run.json: variants.a.fp32.accuracy is dict"):
        check_results(bundle / "results", "nvidia@jetson")


def test_gate_images_0_bundles_no_gate_and_the_runner_says_so(tmp_path, capsys):
    make_bundle([tiny_onnx(tmp_path / "a.onnx")], tmp_path / "bundle", BundleConfig(
        precisions=("fp32",), gate_images=0, protocol=Protocol(iterations=2, duration_s=None, warmup_s=None,
                                                               energy_duration_s=None)))
    assert not (tmp_path / "bundle" / "gate").exists() and read_bundle(tmp_path / "bundle").variants[0].gate is None
    assert run(RunOptions(bundle=tmp_path / "bundle", backend="ort", energy="off")) == 0
    assert json.loads((tmp_path / "bundle" / "results" / "a.fp32.json").read_text())["accuracy"] is None
    assert "a.fp32: no accuracy gate" in capsys.readouterr().err


def test_edge_bundle_gate_images_sets_the_count(tmp_path, capsys):
    from edge.cli import main

    graph = tiny_onnx(tmp_path / "a.onnx", batch="4")
    assert main(["bundle", str(graph), "--out", str(tmp_path / "bundle"), "--precision", "fp32",
                 "--gate-images", "6", "--gate-data", "fmnist-mini", "--json"]) == 0
    gate = json.loads(capsys.readouterr().out)["variants"][0]["gate"]
    assert gate["images"] == 6 and gate["thresholds"] == THRESHOLDS["fp32"].to_json()
    assert np.load(tmp_path / "bundle" / gate["reference"]["logits"]).shape == (6, 4)  # 2 chunks of 4, padded


def test_no_tf32_bundles_take_the_strict_fp32_thresholds(tmp_path):
    make_bundle([tiny_onnx(tmp_path / "a.onnx")], tmp_path / "bundle",
                BundleConfig(check_data="fmnist-mini", precisions=("fp32",), tf32=False, gate_images=4))
    assert read_bundle(tmp_path / "bundle").variants[0].gate.thresholds == THRESHOLDS["fp32-no-tf32"]


def test_a_reference_of_another_shape_fails_that_variant_naming_it_and_the_others_go_on(two_graphs, fake_device,
                                                                                       tmp_path):
    from jetson.bundle import MANIFEST, sha256_file

    manifest = json.loads((two_graphs / MANIFEST).read_text())
    relative = manifest["variants"][0]["gate"]["reference"]["logits"]
    np.save(two_graphs / relative, logits(classes=5))  # as if the gate files belonged to another graph
    manifest["files"][relative] = {"sha256": sha256_file(two_graphs / relative),
                                   "bytes": (two_graphs / relative).stat().st_size}
    (two_graphs / MANIFEST).write_text(json.dumps(manifest))
    assert run(RunOptions(bundle=two_graphs, energy="off", cache_dir=tmp_path / "cache")) == 1
    summary = json.loads((two_graphs / "results" / "run.json").read_text())
    assert summary["variants"]["a.fp32"]["status"] == "failed"
    assert "a.fp32: the engine's output 'logits' has shape [32, 4], the reference [32, 5]" in \
        summary["variants"]["a.fp32"]["error"]
    assert summary["variants"]["b.fp32"]["status"] == "done" and summary["variants"]["b.fp32"]["accuracy"] == PASS


def test_the_hosts_figures_travel_in_the_manifest_and_stand_beside_the_engines():
    """edge quantize's gate of the graph (ONNX Runtime on the host) round-trips through the manifest; the device's
    verdict sets its top-1 agreement beside the engine's, judged by the thresholds alone."""
    from jetson.accuracy_gate import summary_line, versus_host

    host = {"top1_agreement": 0.984, "rel_l2": 0.024, "images": 500, "data": "fmnist-mini:test", "passed": True}
    spec = {"inputs": {"x": "gate/inputs/1.npy"}, "reference": {"y": "gate/a/reference_0.npy"}, "images": 32,
            "data": "fmnist-mini:test", "source": "a.onnx", "thresholds": THRESHOLDS["int8"].to_json(), "host": host}
    loaded = GateSpec.from_json(spec, "variant a")
    assert loaded.host == host and GateSpec.from_json(loaded.to_json(), "variant a") == loaded
    assert GateSpec.from_json({**spec, "host": None}, "variant a").host is None
    assert GateSpec.from_json({k: v for k, v in spec.items() if k != "host"}, "variant a").host is None  # older bundles
    with pytest.raises(JetsonError, match="host figures are list"):
        GateSpec.from_json({**spec, "host": [0.98]}, "variant a")

    ref = logits(images=10)
    flipped = ref.copy()
    flipped[:1] = -flipped[:1]  # 1 of 10 flips: 0.9, below the graph's 0.984 but within int8's 0.8
    verdict = judge({"logits": flipped}, {"logits": ref}, THRESHOLDS["int8"], "a.int8")
    compared = versus_host(verdict, host)
    assert compared == {"device_top1_agreement": pytest.approx(0.9), "host_top1_agreement": 0.984,
                        "host_images": 500, "difference": pytest.approx(0.9 - 0.984)}
    assert verdict["status"] == PASS
    line = summary_line("a.int8", {**verdict, "images": 10, "versus_host": compared})
    assert "top-1 agreement 0.900" in line and "its graph on the host 0.984 on 500 images" in line
    assert versus_host(verdict, None) is None and versus_host(verdict, {"rel_l2": 0.1}) is None
