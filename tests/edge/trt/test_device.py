"""The device an engine is tied to, the CUDA versions in its manifest, and the cuda-python the `device` extra allows.

Identity figures from /work/shared/reference/JETSON-TENSORRT.md ("The target"): every Orin
module's GPU says "Orin", compute capability 8.7; the Orin Nano 8GB has 8 SMs and 7620 MB usable,
an AGX Orin 64GB has 16 SMs. cuda-python is FakeCudaRuntime (tests/fake_cuda.py), never CUDA.
"""

import ast
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from edge.errors import EdgeError
from edge.trt import cuda as cuda_module
from edge.trt.manifest import MANIFEST_VERSION, check_compatible
from tests.fake_cuda import AGX_ORIN, ORIN_NANO, FakeCudaRuntime

ROOT = Path(__file__).resolve().parents[3]


def identity_on(tmp_path, monkeypatch, board: str, props: dict, **versions) -> dict:
    model = tmp_path / f"{len(list(tmp_path.iterdir()))}-model"
    model.write_bytes(board.encode() + b"\x00")  # the device tree's string ends with a NUL
    monkeypatch.setattr(cuda_module, "DEVICE_TREE_MODEL", str(model))
    return {"tensorrt": "10.3.0.30", **cuda_module.device_identity(FakeCudaRuntime(props, **versions))}


def test_an_agx_orin_engine_is_refused_on_an_orin_nano(tmp_path, monkeypatch):
    agx = identity_on(tmp_path, monkeypatch, "NVIDIA Jetson AGX Orin Developer Kit", AGX_ORIN)
    nano = identity_on(tmp_path, monkeypatch, "NVIDIA Jetson Orin Nano Developer Kit", ORIN_NANO)
    assert (agx["gpu"], agx["compute_capability"]) == (nano["gpu"], nano["compute_capability"]) == ("Orin", "8.7")
    assert (nano["sm_count"], nano["memory_gib"]) == (8, 7) and (agx["sm_count"], agx["memory_gib"]) == (16, 61)
    engine = tmp_path / "m.engine"
    with pytest.raises(EdgeError, match="cannot run here") as e:
        check_compatible(engine, {"manifest_version": MANIFEST_VERSION, "runtime": agx}, nano)
    text = str(e.value)
    assert "built on NVIDIA Jetson AGX Orin Developer Kit (Orin, sm 8.7, 16 SMs, 61 GiB)" in text
    assert "this is NVIDIA Jetson Orin Nano Developer Kit (Orin, sm 8.7, 8 SMs, 7 GiB)" in text
    assert "sm_count 16" in text and "sm_count 8" in text and "rebuild on this device" in text
    check_compatible(engine, {"manifest_version": MANIFEST_VERSION, "runtime": nano}, nano)  # same board: accepted


def test_off_a_jetson_there_is_no_board_model(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_module, "DEVICE_TREE_MODEL", str(tmp_path / "absent"))
    assert cuda_module.device_identity(FakeCudaRuntime())["device_model"] is None


def test_cuda_versions_are_labelled_for_what_they_are(tmp_path, monkeypatch):
    """cudaRuntimeGetVersion answers the runtime built into cuda-python, not the libcudart TensorRT loads."""
    identity = identity_on(tmp_path, monkeypatch, "NVIDIA Jetson Orin Nano Developer Kit", ORIN_NANO,
                           runtime=12090, local_runtime=12060, driver=12080)
    assert identity["cuda_python_runtime"] == "12.9"  # what cuda-python was built with
    assert identity["cuda_runtime"] == "12.6"  # libcudart on the library path (JetPack's)
    assert identity["cuda_driver"] == "12.8"
    no_library = identity_on(tmp_path, monkeypatch, "x", ORIN_NANO, local_runtime=None)
    assert no_library["cuda_runtime"] is None and no_library["cuda_python_runtime"] == "12.6"


def test_a_cuda13_cuda_python_on_a_cuda12_driver_says_which_to_install():
    class Cuda13OnJetPack6(FakeCudaRuntime):
        def cudaGetDeviceProperties(self, device):
            return self.cudaError_t.cudaErrorInsufficientDriver, None

    with pytest.raises(EdgeError, match="cudaErrorInsufficientDriver") as e:
        cuda_module.device_identity(Cuda13OnJetPack6(runtime=13000))
    assert "cuda-python>=12.6,<13" in str(e.value) and "JetPack 6" in str(e.value)


def test_the_device_extra_keeps_cuda_python_below_13_for_jetpack_6():
    """JetPack 6 is CUDA 12.6; cuda-python 13 needs a CUDA 13 driver."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    extras = next(ast.literal_eval(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                  for k in node.keywords if k.arg == "extras_require")
    cuda = next(Requirement(r) for r in extras["device"] if r.startswith("cuda-python"))
    assert cuda.specifier.contains("12.6.2") and cuda.specifier.contains("12.9.0")
    assert not cuda.specifier.contains("13.0.0") and not cuda.specifier.contains("13.4.0")
