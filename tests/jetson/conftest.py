import os
import sys
from pathlib import Path

import pytest

from edge.bundle import BundleConfig, make_bundle
from jetson import cuda as cuda_module
from jetson import device as device_module
from jetson.bundle import Protocol
from tests.edge.trt.test_build import NANO_MODEL, tiny_onnx
from tests.fake_tensorrt import make_fake_tensorrt
from tests.jetson.fakes import FakeJetson, child_fakes_path, install_fakes


@pytest.fixture
def fake_jetson(tmp_path, monkeypatch) -> FakeJetson:
    """The fakes on this process's PATH under the real names (so jetson's code calls them)."""
    fakes = install_fakes(tmp_path / "device")
    for name, value in fakes.variables().items():
        monkeypatch.setenv(name, value)
    return fakes


@pytest.fixture
def bundle(tmp_path) -> Path:
    """Two variants (a and b), fp32, a short protocol."""
    graphs = [tiny_onnx(tmp_path / "a.onnx"), tiny_onnx(tmp_path / "b.onnx")]
    make_bundle(graphs, tmp_path / "bundle", BundleConfig(check_data="fmnist-mini", precisions=("fp32",),
                                                          protocol=Protocol(
        warmup=2, warmup_s=None, iterations=20, duration_s=None, energy_duration_s=None, idle_s=0.3)))
    return tmp_path / "bundle"


@pytest.fixture
def fake_device(tmp_path, monkeypatch):
    """FakeTensorRT 10.3 as `tensorrt` (here and in the runner's build processes) and its FakeCudaRuntime as the
    CUDA binding, on an Orin Nano."""
    model = tmp_path / "device-tree-model"
    model.write_bytes(NANO_MODEL.encode() + b"\x00")
    monkeypatch.setattr(device_module, "DEVICE_TREE_MODEL", str(model))
    trt = make_fake_tensorrt("10.3")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(cuda_module, "load_cuda_runtime", lambda binding=None, log=None: trt.cuda)
    monkeypatch.setenv("PYTHONPATH", child_fakes_path(os.environ.get("PYTHONPATH")))  # the build's child process
    return trt
