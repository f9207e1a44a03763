"""``edge deploy`` of a bundle with edge's plugins, over real SSH (OpenSSH's sshd on 127.0.0.1,
tests/edge/deploy/sshd.py) to a loopback device whose TensorRT is FakeTensorRT 10.3 and whose nvcc is FakeNvcc
(tests/jetson/bin/fake_nvcc) with FAKE TensorRT headers: the runner compiles the bundle's plugin sources
there and the engine manifest records the library's sha256; a library cross-built for another TensorRT is
refused with the fix; the plugin's speed-up (or slow-down) is reported per pair of variants."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from edge.bundle import BundleConfig, make_bundle
from edge.deploy import RunnerOptions, deploy
from edge.errors import EdgeError
from jetson import plugin_build
from tests.edge.deploy.conftest import PROTOCOL, config, only, statuses
from tests.edge.trt.test_build import tiny_onnx
from tests.jetson.fakes import FAKE_TENSORRT_HEADERS
from tests.jetson.test_plugin_build import NV_TEGRA_RELEASE_36_4_3, cross_build, plugin_graph

DEVICE = {"FAKE_DEVICE_TENSORRT": "1"}


def plugin_bundle(tmp_path: Path, name: str = "bundle", **changes) -> Path:
    """``a``: the tiny graph; ``a-plugins``: a graph with a TokenDepthwiseConv node (its plugin twin by name)."""
    graphs = [tiny_onnx(tmp_path / "a.onnx"), plugin_graph(tmp_path / "a-plugins.onnx")]
    make_bundle(graphs, tmp_path / name, BundleConfig(precisions=("fp32",), protocol=PROTOCOL, gate_images=0,
                                                      **changes))
    return tmp_path / name


def test_the_device_compiles_the_plugins_and_the_engine_manifest_records_the_library(sshd, tmp_path):
    server = sshd(DEVICE)
    device = server.devices[0]
    bundle = plugin_bundle(tmp_path)
    result = deploy(bundle, [device.host], config(server, runner=RunnerOptions(), plugin_ratio=True),
                    out=tmp_path / "out")
    assert result["failed"] == [], only(result)["error"]
    results = tmp_path / "out" / device.host.label / "results"
    assert statuses(results) == {"a.fp32": "done", "a-plugins.fp32": "done"}
    engine = json.loads((results / "a-plugins.fp32.json").read_text())["engine"]
    library = engine["edge_plugins"]
    assert library["origin"] == "built" and library["tensorrt"] == "10.3.0" and library["sm"] == "87"
    # the library lies in the device's cache, its sha256 the one recorded by the engine manifest there
    assert Path(library["path"]).is_relative_to(device.cache / "plugins" / library["cache_key"])
    assert plugin_build.sha256_file(library["path"]) == library["sha256"]
    manifest = json.loads(Path(engine["path"] + ".json").read_text())
    assert manifest["edge_plugins"]["sha256"] == library["sha256"]
    assert manifest["edge_plugins"]["cache_key"] == library["cache_key"]
    # FakeNvcc ran on the device with the bundle's sources and JetPack's sm_87
    (nvcc,) = [argv for argv in device.fakes.calls() if argv[0] == "nvcc" and "--version" not in argv]
    remote = device.home / "edge-bundles" / "bundle" / "plugins" / "src"
    assert str(remote / "edgePlugins.cpp") in nvcc and "arch=compute_87,code=sm_87" in nvcc
    assert engine["cached"] is False and json.loads((results / "a.fp32.json").read_text())["engine"][
        "edge_plugins"] is None
    # the plugin twin's ratio on this device: median without / median with the plugin
    (row,) = result["plugin_ratio"][device.host.label]
    medians = {v: json.loads((results / f"{v}.json").read_text())["latency"]["median_ms"]
               for v in ("a.fp32", "a-plugins.fp32")}
    assert (row["variant"], row["plugin_variant"], row["precision"]) == ("a", "a-plugins", "fp32")
    assert row["speedup"] == pytest.approx(medians["a.fp32"] / medians["a-plugins.fp32"], rel=1e-12)


@pytest.fixture
def nv_tegra_release():
    """The device's /etc/nv_tegra_release (L4T 36.4.3, JetPack 6.2), readable by the device user (pytest's own
    folder is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="edge-jetson-files-"))
    folder.chmod(0o755)
    (folder / "nv_tegra_release").write_text(NV_TEGRA_RELEASE_36_4_3)
    yield folder / "nv_tegra_release"
    shutil.rmtree(folder)


def test_a_library_cross_built_for_another_tensorrt_is_refused_on_the_device_with_the_fix(sshd, tmp_path,
                                                                                         nv_tegra_release):
    server = sshd({**DEVICE, "FAKE_DEVICE_NV_TEGRA_RELEASE": str(nv_tegra_release)})
    headers = {**FAKE_TENSORRT_HEADERS, "NvInferVersion.h": FAKE_TENSORRT_HEADERS["NvInferVersion.h"].replace(
        "NV_TENSORRT_MINOR 3", "NV_TENSORRT_MINOR 16")}
    bundle = plugin_bundle(tmp_path, plugin_library=str(cross_build(tmp_path, headers, "7.2")))
    result = deploy(bundle, [server.devices[0].host], config(server, runner=RunnerOptions()), out=tmp_path / "out")
    results = tmp_path / "out" / server.devices[0].host.label / "results"
    assert statuses(results) == {"a.fp32": "done", "a-plugins.fp32": "failed"}
    error = json.loads((results / "run.json").read_text())["variants"]["a-plugins.fp32"]["error"]
    assert "TensorRT: library 10.16.0, device 10.3.0.30" in error
    assert "L4T (JetPack): library 39.2 (JetPack 7.2), device 36.4.3" in error
    assert "edge bundle --plugins" in error and "make -C docker plugins" in error
    assert result["failed"] == [server.devices[0].host.label]


def test_plugin_ratio_needs_a_pair_in_the_bundle(tmp_path):
    make_bundle([tiny_onnx(tmp_path / "a.onnx")], tmp_path / "bundle",
                BundleConfig(precisions=("fp32",), protocol=PROTOCOL, gate_images=0))
    from edge.deploy import DeployConfig, parse_host

    with pytest.raises(EdgeError, match="--plugin-ratio: the bundle has no pair"):
        deploy(tmp_path / "bundle", [parse_host("u@127.0.0.1:1")], DeployConfig(plugin_ratio=True))
