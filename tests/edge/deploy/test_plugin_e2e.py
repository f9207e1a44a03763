"""Issue 31 end to end, with a real plugin graph: the two halves (``edge clean --plugins``, the runner's plugin build)
meet on the reference model.

``edge compress fmnist-deit-tiny --plan dwconv:auto=3`` -> ``edge export`` -> ``edge clean`` (NAME) and
``edge clean --plugins`` (NAME-plugins: 3 TokenDepthwiseConv nodes) -> one bundle of both at fp32 and fp16 (the
fp16 graphs made by ``edge quantize``'s conversion, checked in ONNX Runtime, where the plugin nodes run as the
plugin's numpy reference) -> ``edge deploy --plugin-ratio`` over real SSH to the loopback device, whose nvcc is
FakeNvcc and whose TensorRT is FakeTensorRT 10.3 (tests/edge/deploy/test_deploy_plugins.py says how).

What the device side reports here comes from those fakes: the ``plugin_ratio`` rows exist and are the ratio
of the fetched medians, but FakeTensorRT's latencies are no measurement, so no test reads a speed-up into them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from edge.bundle import BundleConfig, make_bundle
from edge.check.compare import ort_session
from edge.check import plugin_ops
from edge.check.plugin_ops import DOMAIN, TOKEN_DEPTHWISE_CONV
from edge.cli import main
from edge.cli.deploy import _gate_note
from edge.deploy import RunnerOptions, deploy
from edge.check.tensorrt_rules import INFO, check_file
from edge.errors import EdgeError
from jetson import plugin_build
from jetson.accuracy_gate import judge, thresholds_for
from tests.edge.deploy.conftest import PROTOCOL, config, only, statuses

# the reference model compressed, exported, cleaned twice, bundled at two precisions and deployed (~60 s);
# tests/jetson/test_plugin_build.py and tests/edge/deploy/test_deploy_plugins.py cover the steps by default
pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime_extensions", reason="onnxruntime-extensions runs the plugin's reference in ORT "
                    "(pip install -e '.[test]')")

DEVICE = {"FAKE_DEVICE_TENSORRT": "1"}
NAME, TWIN = "dw3", "dw3-plugins"
PRECISIONS = ("fp32", "fp16")
GATE_IMAGES = 16
FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
#: the plugin graph's float32 outputs against the plain graph's (the pass's own tolerance, 1e-5, on logits)
FP32_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    """The user's commands, through the CLI: compress, export, then the plain and the --plugins clean."""
    folder = tmp_path_factory.mktemp("plugin-e2e")
    artifact, export = folder / "dw3", folder / "dw3.onnx"
    paths = {NAME: folder / f"{NAME}.clean.onnx", TWIN: folder / f"{TWIN}.clean.onnx"}
    for argv in (["compress", "fmnist-deit-tiny", "--plan", "dwconv:auto=3", "--data", "fmnist-mini",
                  "--samples", "64", "--out", str(artifact)],
                 ["export", str(artifact), "--out", str(export)],
                 ["clean", str(export), "--out", str(paths[NAME])],
                 ["clean", str(export), "--out", str(paths[TWIN]), "--plugins"]):
        assert main(argv) == 0, argv
    return paths


@pytest.fixture(scope="module")
def bundle(graphs, tmp_path_factory) -> Path:
    """Both graphs in one bundle at fp32 and fp16, with the accuracy gate's files and the TensorRT rules on."""
    out = tmp_path_factory.mktemp("plugin-e2e-bundle") / "bundle"
    make_bundle([graphs[NAME], graphs[TWIN]], out,
                BundleConfig(check_data="fmnist-mini", precisions=PRECISIONS, protocol=PROTOCOL,
                             gate_images=GATE_IMAGES))
    return out


def _plugin_nodes(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == TOKEN_DEPTHWISE_CONV]


def _variants(bundle: Path) -> dict[str, dict]:
    manifest = json.loads((bundle / "manifest.json").read_text())
    return {f"{v['name']}.{v['precision']}": v for v in manifest["variants"]}


def test_the_twin_holds_the_three_plugin_nodes_and_only_it_ships_the_plugin_sources(graphs, bundle):
    assert [n.domain for n in _plugin_nodes(graphs[TWIN])] == [DOMAIN] * 3 and _plugin_nodes(graphs[NAME]) == []
    variants = _variants(bundle)
    assert sorted(variants) == sorted(f"{n}.{p}" for n in (NAME, TWIN) for p in PRECISIONS)
    for precision in PRECISIONS:
        assert variants[f"{TWIN}.{precision}"]["build"]["plugin_sources"] == "plugins/src"
        assert variants[f"{NAME}.{precision}"]["build"]["plugin_sources"] is None
        # the fp16 twin keeps its plugin nodes; the conversion turns their weight attributes to float16, which the
        # creator reads as kFLOAT16 fields (tokenDepthwiseConvPlugin.cpp, readFloats)
        nodes = _plugin_nodes(bundle / variants[f"{TWIN}.{precision}"]["graph"])
        weights = {a.t.data_type for n in nodes for a in n.attribute if a.name in ("weight", "bias")}
        assert len(nodes) == 3 and weights == {FLOAT16 if precision == "fp16" else FLOAT}
    assert (bundle / "plugins" / "src" / "tokenDepthwiseConv" / "tokenDepthwiseConvPlugin.cpp").is_file()


def test_the_bundle_s_tensorrt_rules_take_the_plugin_nodes_as_plugins(bundle):
    """One rule decides: ``plugin`` (information) for each TokenDepthwiseConv node, no error, at both precisions."""
    for variant_id, variant in _variants(bundle).items():
        report = check_file(bundle / variant["graph"], "10.3")
        plugin = [f for f in report["findings"] if f["rule"] == "plugin"]
        assert report["passed"] and report["errors"] == 0, (variant_id, report["findings"])
        assert len(plugin) == (3 if variant["name"] == TWIN else 0), variant_id
        assert all(f["severity"] == INFO and "libedge_plugins.so" in f["what"] for f in plugin)


def test_one_rule_decides_on_plugin_nodes_for_edge_check_and_the_bundle(graphs, tmp_path):
    """The op types edge writes, the runner ships a library for and FakeTensorRT's parser imports as plugins are the
    same; a TokenDepthwiseConv outside edge's domain (ONNX Runtime's reference would not run it) breaks the ``plugin``
    rule, and ``edge bundle`` refuses it with that rule's fix, writing nothing."""
    from tests.fake_tensorrt import EDGE_PLUGIN_OPS

    assert plugin_ops.PLUGIN_OPS == plugin_build.PLUGIN_OPS == EDGE_PLUGIN_OPS
    model = onnx.load(str(graphs[TWIN]))
    for node in model.graph.node:
        if node.op_type == TOKEN_DEPTHWISE_CONV:
            node.domain = ""
    stray = tmp_path / "stray-plugins.onnx"
    onnx.save(model, str(stray))
    findings = [f for f in check_file(stray, "10.3")["findings"] if f["rule"] == "plugin"]
    assert len(findings) == 3 and all(f["severity"] == "error" and "'(default)'" in f["what"] for f in findings)
    with pytest.raises(EdgeError, match="edge clean --plugins` from the plain export") as raised:
        make_bundle([stray], tmp_path / "bundle", BundleConfig(precisions=("fp32",), gate_images=0))
    assert "stray-plugins.fp32 (3):" in str(raised.value) and not (tmp_path / "bundle").exists()


def test_bundle_plugins_builds_only_the_graphs_holding_a_plugin_node_with_them(tmp_path):
    """``edge bundle --plugins`` ships the sources; a graph without plugin nodes still builds without them (no nvcc
    needed on the device, no library in its engine's key or manifest)."""
    from tests.edge.trt.test_build import tiny_onnx
    from tests.jetson.test_plugin_build import plugin_graph

    graphs = [tiny_onnx(tmp_path / "a.onnx"), plugin_graph(tmp_path / "a-plugins.onnx")]
    make_bundle(graphs, tmp_path / "bundle", BundleConfig(precisions=("fp32",), protocol=PROTOCOL, gate_images=0,
                                                          edge_plugins=True))
    builds = {k: v["build"] for k, v in _variants(tmp_path / "bundle").items()}
    assert builds["a.fp32"]["plugin_sources"] is None and builds["a-plugins.fp32"]["plugin_sources"] == "plugins/src"


def _gate(bundle: Path, variant: dict) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    gate = variant["gate"]
    inputs = {k: np.load(bundle / v) for k, v in gate["inputs"].items()}
    reference = {k: np.load(bundle / v) for k, v in gate["reference"].items()}
    return inputs, reference


def test_the_accuracy_gate_s_reference_and_figures_accept_the_plugin_graph(bundle):
    """The gate's float32 reference of the twin (ONNX Runtime with the plugin's numpy reference) is the plain graph's
    within 1e-5; each packed twin graph, run the same way on the gate's images, passes the device's thresholds."""
    variants = _variants(bundle)
    plain_inputs, plain = _gate(bundle, variants[f"{NAME}.fp32"])
    twin_inputs, twin = _gate(bundle, variants[f"{TWIN}.fp32"])
    assert twin["logits"].shape == (GATE_IMAGES, 10)
    np.testing.assert_array_equal(twin_inputs["input"], plain_inputs["input"])
    np.testing.assert_allclose(twin["logits"], plain["logits"], rtol=0, atol=FP32_TOLERANCE)
    for precision in PRECISIONS:
        session = ort_session(str(bundle / variants[f"{TWIN}.{precision}"]["graph"]))
        logits = np.concatenate([session.run(None, {"input": x[None]})[0] for x in twin_inputs["input"]])
        verdict = judge({"logits": logits}, twin, thresholds_for(precision), f"{TWIN}.{precision}")
        assert verdict["status"] == "pass", verdict["failures"]
        assert verdict["top1_agreement"] == 1.0
        # float32: the same graph; float16: the plugin reference still computes in float32 between Casts
        assert verdict["max_rel_error"] <= (1e-6 if precision == "fp32" else 1e-2)


def test_deploy_builds_the_plugin_for_the_twin_only_and_reports_the_pairs(sshd, bundle, tmp_path):
    server = sshd(DEVICE)
    device = server.devices[0]
    result = deploy(bundle, [device.host], config(server, runner=RunnerOptions(), plugin_ratio=True),
                    out=tmp_path / "out")
    assert result["failed"] == [], only(result).get("error")
    results = tmp_path / "out" / device.host.label / "results"
    assert statuses(results) == {f"{n}.{p}": "done" for n in (NAME, TWIN) for p in PRECISIONS}
    libraries = []
    for precision in PRECISIONS:
        plain = json.loads((results / f"{NAME}.{precision}.json").read_text())["engine"]
        twin = json.loads((results / f"{TWIN}.{precision}.json").read_text())["engine"]
        assert plain["edge_plugins"] is None
        assert json.loads(Path(plain["path"] + ".json").read_text())["edge_plugins"] is None
        manifest = json.loads(Path(twin["path"] + ".json").read_text())
        assert manifest["edge_plugins"]["sha256"] == plugin_build.sha256_file(twin["edge_plugins"]["path"])
        assert manifest["edge_plugins"]["sha256"] == twin["edge_plugins"]["sha256"]
        libraries.append(twin["edge_plugins"])
    # one library for the run: compiled once with JetPack's sm_87, used by both precisions
    assert libraries[0]["sha256"] == libraries[1]["sha256"] and libraries[0]["cache_key"] == libraries[1]["cache_key"]
    compiles = [argv for argv in device.fakes.calls() if argv[0] == "nvcc" and "--version" not in argv]
    assert len(compiles) == 1 and "arch=compute_87,code=sm_87" in compiles[0]
    # the plugin_ratio rows: one per precision, the ratio of the fetched medians. FakeTensorRT timed these engines:
    # the numbers say the field works, nothing about the plugin's speed. FakeTensorRT cannot run the plugin op either
    # (its engine leaves those outputs as they are), so the device's accuracy gate marks the plugin engines wrong,
    # and each row carries that verdict beside its ratio.
    rows = {row["precision"]: row for row in result["plugin_ratio"][device.host.label]}
    assert sorted(rows) == sorted(PRECISIONS)
    for precision, row in rows.items():
        assert (row["variant"], row["plugin_variant"]) == (NAME, TWIN)
        assert math.isfinite(row["speedup"]) and row["speedup"] == pytest.approx(row["without_ms"] / row["with_ms"])
        assert row["accuracy"] == {"without": "pass", "with": "wrong"}
        assert _gate_note(row) == f"; the accuracy gate marks {TWIN} wrong: not a usable speed-up"
        assert _gate_note({**row, "accuracy": {"without": "pass", "with": "pass"}}) == ""
