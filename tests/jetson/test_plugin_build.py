"""edge's TensorRT plugins built where they run (jetson.plugin_build): a bundle whose graph holds a
TokenDepthwiseConv node carries the plugin sources, the runner compiles them with the device's nvcc (here
FakeNvcc, tests/jetson/bin/fake_nvcc) against the TensorRT headers (FAKE ones, tests/jetson/fakes.py), caches the
library, registers it before parsing (FakeTensorRT's plugin registry reads FakeNvcc's record) and records its
sha256 in the engine manifest; a library cross-built for another TensorRT is refused with the fix. The real nvcc
of this machine compiles the plugin kernel with the runner's own command line (TensorRT's headers cannot be
installed here, so the IPluginV3 wrappers are not compiled by it)."""

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.bundle import BundleConfig, make_bundle
from edge.errors import EdgeError
from jetson import device as device_module
from jetson import plugin_build
from jetson.bundle import PLUGIN_SOURCES, BuildSpec, Protocol, read_bundle
from jetson.engine import build_engine_bytes
from jetson.errors import JetsonError
from jetson.runner import RunOptions, run
from tests.edge.trt.test_build import tiny_onnx

from tests.jetson.fakes import BIN, FAKE_TENSORRT_HEADERS

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = Protocol(warmup=2, warmup_s=None, iterations=20, duration_s=None, energy_duration_s=None, idle_s=0.3)
NV_TEGRA_RELEASE_36_4_3 = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: x\n"


def plugin_graph(path: Path) -> Path:
    """tokens [1, 17, 8] -> TokenDepthwiseConv (k 3, grid 4x4, 1 prefix token, mean) -> out, as `edge clean
    --plugins` writes the node (plugins/tokenDepthwiseConv/README.md's attributes, in the domain edge.plugins),
    float32 with edge metadata."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32))
    node = helper.make_node("TokenDepthwiseConv", ["tokens"], ["out"], name="blocks.1.attn.mixer", kernel_size=3,
                            grid=[4, 4], prefix_tokens=1, prefix_mode="mean", weight=weight, plugin_version="1",
                            plugin_namespace="", domain="edge.plugins")
    graph = helper.make_graph([node], "plugin",
                              [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, 17, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 17, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("edge.plugins", 1)])
    model.ir_version = 8
    model.metadata_props.add(key="edge.input_size", value="[1, 4, 4]")
    onnx.save(model, str(path))
    return path


def make(tmp_path: Path, name: str = "bundle", **config) -> Path:
    graphs = [plugin_graph(tmp_path / "dw.onnx"), tiny_onnx(tmp_path / "plain.onnx")]
    make_bundle(graphs, tmp_path / name, BundleConfig(precisions=("fp32",), protocol=PROTOCOL, gate_images=0,
                                                      **config))
    return tmp_path / name


@pytest.fixture
def on_device(fake_jetson, fake_device, monkeypatch, tmp_path):
    """The fakes (FakeNvcc first on PATH, FAKE TensorRT 10.3 headers, FakeTensorRT 10.3) on an Orin Nano with
    JetPack 6.2 (L4T 36.4.3)."""
    release = tmp_path / "nv_tegra_release"
    release.write_text(NV_TEGRA_RELEASE_36_4_3)
    monkeypatch.setattr(device_module, "NV_TEGRA_RELEASE", str(release))
    return fake_jetson


def nvcc_builds(fakes) -> list[list[str]]:
    return [argv for argv in fakes.calls() if argv[0] == "nvcc" and "--version" not in argv]


def test_a_graph_with_a_plugin_node_bundles_the_plugin_sources_for_that_variant_only(tmp_path):
    bundle = read_bundle(make(tmp_path))
    builds = {v.id: v.build for v in bundle.variants}
    assert builds["dw.fp32"].plugin_sources == PLUGIN_SOURCES and builds["dw.fp32"].plugin_library is None
    assert not builds["plain.fp32"].needs_edge_plugins  # its engine key and build stay as without plugins
    shipped = {name.removeprefix(PLUGIN_SOURCES + "/") for name in bundle.files if name.startswith(PLUGIN_SOURCES)}
    assert shipped == set(plugin_build.source_files(REPO / "plugins"))
    assert {"CMakeLists.txt", "edgePlugins.cpp", "tokenDepthwiseConv/tokenDepthwiseConvKernel.cu",
            "tokenDepthwiseConv/tokenDepthwiseConvPlugin.cpp", "tokenDepthwiseConv/CMakeLists.txt"} <= shipped
    assert not any(name.endswith((".py", ".md")) for name in shipped)


def test_the_runner_compiles_the_plugins_loads_them_before_parsing_and_records_the_library(on_device, tmp_path):
    bundle = make(tmp_path)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 0
    # one FakeNvcc call: every .cu and .cpp of the bundle's sources, the device's SM, JetPack's TensorRT headers
    (argv,) = nvcc_builds(on_device)
    sources = bundle / PLUGIN_SOURCES
    compiled = sorted(str(p) for p in (sources.rglob("*.cu"))) + sorted(str(p) for p in sources.rglob("*.cpp"))
    assert sorted(a for a in argv if a.endswith((".cu", ".cpp"))) == sorted(compiled) and len(compiled) == 3
    assert argv[argv.index("-gencode") + 1] == "arch=compute_87,code=sm_87" and "-shared" in argv
    assert argv[argv.index("-isystem") + 1] == str(on_device.tensorrt_include)
    result = json.loads((bundle / "results" / "dw.fp32.json").read_text())
    library = result["engine"]["edge_plugins"]
    assert library["origin"] == "built" and (library["tensorrt"], library["cuda"], library["sm"]) == ("10.3.0", "12.6",
                                                                                                    "87")
    assert library["sha256"] == plugin_build.sha256_file(library["path"])
    assert Path(library["path"]).parent == tmp_path / "cache" / "plugins" / library["cache_key"]
    # the engine manifest records the library's sha256 and its cache key
    manifest = json.loads(Path(result["engine"]["path"] + ".json").read_text())
    assert manifest["edge_plugins"]["sha256"] == library["sha256"]
    assert manifest["edge_plugins"]["cache_key"] == library["cache_key"]
    # the build registered the library's creator before parsing: the plugin node became a plugin layer
    request = json.loads(Path(result["engine"]["path"]).read_bytes()[len(b"FAKE-ENGINE"):])
    assert request["plugin_layers"] == ["TokenDepthwiseConv"] and request["plugin_libraries"] == [library["path"]]
    assert ("load_library", library["path"]) in on_device_calls()  # and the runtime loaded it to deserialise
    plain = json.loads((bundle / "results" / "plain.fp32.json").read_text())["engine"]
    assert plain["edge_plugins"] is None
    # a second run takes the library (and the engine) from the cache: no new compilation
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", force=True)) == 0
    again = json.loads((bundle / "results" / "dw.fp32.json").read_text())["engine"]
    assert again["edge_plugins"]["origin"] == "cached" and again["cached"] is True
    assert again["edge_plugins"]["sha256"] == library["sha256"] and len(nvcc_builds(on_device)) == 1


def on_device_calls() -> list:
    import tensorrt

    return tensorrt.calls


def test_trtexec_gets_the_library_through_dynamic_plugins(on_device, tmp_path):
    """--dynamicPlugins: trtexec registers it with IPluginRegistry::loadLibrary, which calls its getCreators."""
    bundle = make(tmp_path)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", builder="trtexec",
                          variants=("dw.fp32",))) == 0
    library = json.loads((bundle / "results" / "dw.fp32.json").read_text())["engine"]["edge_plugins"]
    (trtexec,) = [argv for argv in on_device.calls() if argv[0] == "trtexec" and "--help" not in argv]
    assert f"--dynamicPlugins={library['path']}" in trtexec
    assert not any(a.startswith("--staticPlugins") for a in trtexec)


def test_two_plugin_variants_of_one_run_load_the_library_once(on_device, tmp_path):
    """TensorRT's plugin registry is process-wide and IPluginRegistry::loadLibrary "will fail and return nullptr
    if any of the plugins are already registered" (include/NvInferRuntimeCommon.h at v10.3.0, ~204-207): the
    runner loads edge's library once per process, so the second plugin variant of a run runs too."""
    graphs = [plugin_graph(tmp_path / "dw.onnx"), plugin_graph(tmp_path / "dw2.onnx")]
    make_bundle(graphs, tmp_path / "bundle", BundleConfig(precisions=("fp32",), protocol=PROTOCOL, gate_images=0))
    bundle = tmp_path / "bundle"
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 0
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert {v: e["status"] for v, e in summary["variants"].items()} == {"dw.fp32": "done", "dw2.fp32": "done"}
    library = json.loads((bundle / "results" / "dw2.fp32.json").read_text())["engine"]["edge_plugins"]["path"]
    assert on_device_calls().count(("load_library", library)) == 1


def test_the_fake_registry_refuses_a_second_load_of_the_same_creators(fake_device, tmp_path):
    library = tmp_path / "libthird.so"
    library.write_bytes(b"a library that registers its creators")
    registry = fake_device.Runtime(None).get_plugin_registry()
    assert registry.load_library(str(library)) is not None
    assert registry.load_library(str(library)) is None  # "already registered": nullptr


def test_a_third_party_library_is_opened_once_as_trtexec_opens_static_plugins(fake_device, tmp_path):
    """Third-party libraries register their creators from static initialisers and export no getCreators:
    they are dlopened (trtexec's --staticPlugins), never given to loadLibrary (decided for issue 43)."""
    import subprocess

    from jetson.engine import open_static_plugin_library

    source = tmp_path / "third.c"
    marker = tmp_path / "opened"
    source.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void registered(void) {{\n'
                      f'  FILE* f = fopen("{marker}", "a"); fputs("registered\\n", f); fclose(f); }}\n')
    library = tmp_path / "libthird.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    open_static_plugin_library(fake_device, library)
    open_static_plugin_library(fake_device, library)
    assert marker.read_text() == "registered\n"  # its static initialiser ran, once
    assert not any(call[0] == "load_library" for call in fake_device.calls)
    broken = tmp_path / "libbroken.so"
    broken.write_bytes(b"not a library")
    with pytest.raises(JetsonError, match="libbroken.so could not be loaded"):
        open_static_plugin_library(fake_device, broken)


def test_without_the_library_the_parser_does_not_find_the_plugin(fake_device, tmp_path):
    with pytest.raises(JetsonError, match="Plugin not found"):
        build_engine_bytes(plugin_graph(tmp_path / "dw.onnx"), BuildSpec(precision="fp32"), log=lambda m: None)


@pytest.mark.parametrize("variable, value, says", [
    ("EDGE_JETSON_NVCC", "/opt/none/nvcc", ["nvcc was not found (/opt/none/nvcc)", "sudo apt install nvidia-jetpack",
                                             "make -C docker plugins"]),
    ("EDGE_JETSON_TENSORRT_INCLUDE", "/opt/none/include", ["TensorRT's headers (NvInferRuntime.h) were not found in "
                                                           "/opt/none/include", "sudo apt install nvidia-jetpack"]),
])
def test_a_missing_nvcc_or_tensorrt_headers_fails_the_plugin_variant_with_the_path_and_the_fix(
        on_device, tmp_path, monkeypatch, variable, value, says):
    monkeypatch.setenv(variable, value)
    bundle = make(tmp_path)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 1
    variants = json.loads((bundle / "results" / "run.json").read_text())["variants"]
    assert variants["plain.fp32"]["status"] == "done" and variants["dw.fp32"]["status"] == "failed"
    assert all(s in variants["dw.fp32"]["error"] for s in says), variants["dw.fp32"]["error"]
    assert nvcc_builds(on_device) == []


def test_a_compiler_error_keeps_nvccs_output_in_the_results(on_device, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_FAIL", "1")
    bundle = make(tmp_path)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("dw.fp32",))) == 1
    error = json.loads((bundle / "results" / "run.json").read_text())["variants"]["dw.fp32"]["error"]
    log = bundle / "results" / "logs" / "plugins.nvcc.log"
    assert "nvcc failed (exit 1)" in error and str(log) in error and "FAKE_NVCC_FAIL" in log.read_text()
    assert not list((tmp_path / "cache" / "plugins").glob("*/libedge_plugins.so"))  # nothing half written


def cross_build(tmp_path: Path, headers: dict[str, str], jetpack: str) -> Path:
    """``python3 -m jetson.plugin_build cross`` (what docker/Dockerfile.cross runs) with FakeNvcc and FAKE headers."""
    include = tmp_path / f"include-{jetpack}"
    include.mkdir()
    for name, text in headers.items():
        (include / name).write_text(text)
    out = tmp_path / f"cross-{jetpack}"
    done = subprocess.run([sys.executable, "-m", "jetson.plugin_build", "cross", "--sources", str(REPO / "plugins"),
                           "--out", str(out), "--jetpack", jetpack, "--nvcc", str(BIN / "fake_nvcc"),
                           "--tensorrt-include", str(include), "--image", "fake"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return out / plugin_build.LIBRARY_NAME


def test_a_cross_built_library_with_its_stamp_is_bundled_and_used_on_a_matching_device(on_device, tmp_path):
    library = cross_build(tmp_path, FAKE_TENSORRT_HEADERS, "6.1")
    stamp = json.loads(library.with_suffix(".json").read_text())
    assert (stamp["tensorrt"], stamp["cuda"], stamp["jetpack"], stamp["l4t"], stamp["sm"]) == (
        "10.3.0", "12.6", "6.1", "36.4", "87")
    assert stamp["sha256"] == plugin_build.sha256_file(library)
    record = json.loads(library.read_bytes()[len(b"\x7fELF\x02\x01\x01\x00FAKE-NVCC-OUTPUT\n"):])
    assert record["host_compiler"] == "aarch64-linux-gnu-g++" and record["target"] == "aarch64-linux"
    bundle = make(tmp_path, plugin_library=str(library))
    spec = {v.id: v.build for v in read_bundle(bundle).variants}["dw.fp32"]
    assert spec.plugin_library == "plugins/libedge_plugins.so" and spec.plugin_sources is None
    assert not (bundle / PLUGIN_SOURCES).exists()
    compiled = len(nvcc_builds(on_device))  # the cross build's own call (the host's "docker" step)
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("dw.fp32",))) == 0
    used = json.loads((bundle / "results" / "dw.fp32.json").read_text())["engine"]["edge_plugins"]
    assert used["origin"] == "prebuilt" and used["sha256"] == stamp["sha256"] and used["stamp"]["jetpack"] == "6.1"
    assert len(nvcc_builds(on_device)) == compiled  # nothing compiled on the device


def test_a_library_cross_built_for_another_tensorrt_is_refused_with_the_fix(on_device, tmp_path):
    headers = {**FAKE_TENSORRT_HEADERS, "NvInferVersion.h": FAKE_TENSORRT_HEADERS["NvInferVersion.h"].replace(
        "NV_TENSORRT_MINOR 3", "NV_TENSORRT_MINOR 16")}
    bundle = make(tmp_path, plugin_library=str(cross_build(tmp_path, headers, "7.2")))
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 1
    variants = json.loads((bundle / "results" / "run.json").read_text())["variants"]
    error = variants["dw.fp32"]["error"]
    assert variants["plain.fp32"]["status"] == "done" and variants["dw.fp32"]["status"] == "failed"
    assert "TensorRT: library 10.16.0, device 10.3.0.30" in error
    assert "L4T (JetPack): library 39.2 (JetPack 7.2), device 36.4.3" in error
    assert "edge bundle --plugins" in error and "make -C docker plugins" in error  # rebuild on the device, or cross


def test_bundling_a_library_without_its_stamp_or_with_another_library_is_refused(tmp_path):
    library = cross_build(tmp_path, FAKE_TENSORRT_HEADERS, "6.1")
    library.write_bytes(library.read_bytes() + b"x")
    with pytest.raises(EdgeError, match="is not the library its stamp libedge_plugins.json describes"):
        make(tmp_path, plugin_library=str(library))
    library.with_suffix(".json").unlink()
    with pytest.raises(EdgeError, match="has no stamp beside it"):
        make(tmp_path, plugin_library=str(library))
    assert not (tmp_path / "bundle").exists()


def test_the_stamp_check_names_each_difference():
    stamp = {"tensorrt": "10.3.0", "cuda": "12.6", "jetpack": "6.1", "l4t": "36.4", "sm": "87"}
    assert plugin_build.prebuilt_mismatches(stamp, tensorrt="10.3.0.30", cuda="12.6", l4t="36.4.3", sm="87") == []
    assert plugin_build.prebuilt_mismatches(stamp, tensorrt="10.3.0", cuda="12.2", l4t="36.3.0", sm="72") == [
        "CUDA: library 12.6, device 12.2", "L4T (JetPack): library 36.4 (JetPack 6.1), device 36.3.0",
        "GPU: library sm_87, device sm_72"]
    assert plugin_build.prebuilt_mismatches(stamp, tensorrt=None, cuda=None, l4t=None, sm=None) == []


def test_the_cache_key_follows_the_sources_the_tensorrt_headers_and_cuda(tmp_path):
    toolchain = plugin_build.Toolchain(nvcc="nvcc", cuda="12.6", tensorrt_include="/i", tensorrt="10.3.0")
    digest = plugin_build.sources_sha256(REPO / "plugins")
    key = plugin_build.build_key(digest, toolchain, "87")
    assert key == plugin_build.build_key(digest, toolchain, "87")
    others = {plugin_build.build_key("0" * 64, toolchain, "87"), plugin_build.build_key(digest, toolchain, "90"),
              plugin_build.build_key(digest, plugin_build.Toolchain("nvcc", "12.2", "/i", "10.3.0"), "87"),
              plugin_build.build_key(digest, plugin_build.Toolchain("nvcc", "12.6", "/i", "10.16.0"), "87")}
    assert key not in others and len(others) == 4


def test_header_version_reads_10_3_and_10_16_defines(tmp_path):
    """NvInferVersion.h as TensorRT 10.3.0 and 10.16 define it (10.16 through TRT_*_ENTERPRISE)."""
    (tmp_path / "NvInferVersion.h").write_text(FAKE_TENSORRT_HEADERS["NvInferVersion.h"])
    assert plugin_build.header_version(tmp_path) == "10.3.0"
    (tmp_path / "NvInferVersion.h").write_text(
        "#define TRT_MAJOR_ENTERPRISE 10\n#define TRT_MINOR_ENTERPRISE 16\n#define TRT_PATCH_ENTERPRISE 0\n"
        "#define NV_TENSORRT_MAJOR TRT_MAJOR_ENTERPRISE //!< TensorRT major version.\n"
        "#define NV_TENSORRT_MINOR TRT_MINOR_ENTERPRISE\n#define NV_TENSORRT_PATCH TRT_PATCH_ENTERPRISE\n")
    assert plugin_build.header_version(tmp_path) == "10.16.0"


# ---- the real nvcc of this machine --------------------------------------------------------------------------
REAL_NVCC = next((p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.access(p, os.X_OK)), None)


@pytest.mark.skipif(REAL_NVCC is None, reason="no nvcc at /usr/local/cuda/bin or /usr/local/bin: no CUDA toolkit")
def test_the_runners_command_line_compiles_the_kernel_for_sm_87_with_the_real_nvcc(tmp_path):
    """The runner's exact argv (compile_argv) on a source tree of the kernel alone: TensorRT's headers cannot be
    installed here, so the IPluginV3 wrappers (tokenDepthwiseConvPlugin.cpp, edgePlugins.cpp) are left out; the
    kernel's C ABI is exported despite the hidden visibility."""
    sources = tmp_path / "src" / "tokenDepthwiseConv"
    sources.mkdir(parents=True)
    for name in ("tokenDepthwiseConvKernel.cu", "tokenDepthwiseConvKernel.h"):
        (sources / name).write_bytes((REPO / "plugins" / "tokenDepthwiseConv" / name).read_bytes())
    toolchain = plugin_build.Toolchain(nvcc=REAL_NVCC, cuda=plugin_build.nvcc_release(REAL_NVCC),
                                       tensorrt_include=str(tmp_path / "no-tensorrt"), tensorrt="none")
    output = tmp_path / "libedge_plugins.so"
    argv = plugin_build.compile_argv(toolchain, tmp_path / "src", output, "87")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert output.read_bytes()[:4] == b"\x7fELF" and output.read_bytes()[16] == 3  # ET_DYN: a shared library
    assert ctypes.CDLL(str(output)).tokenDepthwiseConvLaunch is not None
