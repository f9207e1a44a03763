"""The ctypes binding to libcudart (jetson/cudart.py) against a FAKE libcudart compiled here from
tests/jetson/fake_libcudart.c (CUDA's C signatures over host memory): the calls cross a real C ABI,
with cuda-python's conventions on the Python side."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jetson.cuda import check, load_cuda_runtime
from jetson.cudart import CtypesCudaRuntime, cudaMemcpyKind, find_libcudart
from jetson.device import cuda_identity
from jetson.errors import JetsonError

SOURCE = Path(__file__).with_name("fake_libcudart.c")


@pytest.fixture(scope="module")
def fake_libcudart(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build the fake libcudart")
    library = tmp_path_factory.mktemp("cudart") / "libcudart_fake.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE)], check=True, timeout=120)
    return library


def test_memory_copies_and_errors_with_their_names(fake_libcudart):
    cuda = CtypesCudaRuntime(str(fake_libcudart))
    host = np.arange(16, dtype=np.float32)
    pointer = check(cuda.cudaMalloc(host.nbytes), "cudaMalloc")
    assert pointer != 0 and cuda.library.fake_live_allocations() == 1
    check(cuda.cudaMemcpy(pointer, host.ctypes.data, host.nbytes, cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
    back = np.zeros_like(host)
    stream = check(cuda.cudaStreamCreate(), "cudaStreamCreate")
    check(cuda.cudaMemcpyAsync(back.ctypes.data, pointer, host.nbytes, cudaMemcpyKind.cudaMemcpyDeviceToHost,
                               stream), "cudaMemcpyAsync")
    check(cuda.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    np.testing.assert_array_equal(back, host)
    check(cuda.cudaFree(pointer), "cudaFree")
    assert cuda.library.fake_live_allocations() == 0
    error, = cuda.cudaFree(0)
    assert int(error) == 1 and error.name == "cudaErrorInvalidValue"
    with pytest.raises(JetsonError, match=r"CUDA call cudaMalloc failed") as e:
        check(cuda.cudaMalloc(0), "cudaMalloc")
    assert "found: cudaErrorInvalidValue (1)" in str(e.value)


def test_events_time_the_work_between_them_and_graphs_replay(fake_libcudart):
    cuda = CtypesCudaRuntime(str(fake_libcudart))
    launch = cuda.library.fake_launch
    launch.argtypes = [ctypes.c_double]
    stream = check(cuda.cudaStreamCreate(), "cudaStreamCreate")
    start, end = check(cuda.cudaEventCreate(), "cudaEventCreate"), check(cuda.cudaEventCreate(), "cudaEventCreate")
    check(cuda.cudaEventRecord(start, stream), "cudaEventRecord")
    launch(2.5)
    check(cuda.cudaEventRecord(end, stream), "cudaEventRecord")
    assert check(cuda.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") == pytest.approx(2.5)
    check(cuda.cudaStreamBeginCapture(stream, cuda.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal), "begin")
    graph = check(cuda.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
    graph_exec = check(cuda.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
    check(cuda.cudaEventRecord(start, stream), "cudaEventRecord")
    check(cuda.cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch")
    check(cuda.cudaEventRecord(end, stream), "cudaEventRecord")
    assert check(cuda.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") == pytest.approx(1.0)
    for call in (cuda.cudaGraphDestroy(graph), cuda.cudaGraphExecDestroy(graph_exec), cuda.cudaEventDestroy(start),
                 cuda.cudaEventDestroy(end), cuda.cudaStreamDestroy(stream)):
        check(call, "release")
    error, _ = cuda.cudaEventElapsedTime(0, end)
    assert error.name == "cudaErrorInvalidResourceHandle"


def test_the_device_identity_through_the_binding(fake_libcudart, tmp_path):
    model = tmp_path / "model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\x00")
    identity = cuda_identity(CtypesCudaRuntime(str(fake_libcudart)), model_path=str(model))
    assert identity["gpu"] == "Orin" and identity["compute_capability"] == "8.7" and identity["sm_count"] == 8
    assert identity["memory_bytes"] == 7620 << 20 and identity["memory_gib"] == 7
    assert identity["cuda_runtime"] == identity["cuda_python_runtime"] == "12.6" and identity["cuda_driver"] == "12.8"
    assert identity["device_model"] == "NVIDIA Jetson Orin Nano Developer Kit"
    with pytest.raises(JetsonError, match="cudaGetDeviceProperties failed"):
        cuda_identity(CtypesCudaRuntime(str(fake_libcudart)), device=1)


def test_without_any_binding_the_error_lists_what_was_tried(monkeypatch):
    monkeypatch.setattr("jetson.cudart.LIBRARY_NAMES", ("/nonexistent/libcudart.so",))
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    with pytest.raises(JetsonError, match="libcudart.so was not found") as e:
        find_libcudart()
    assert "/nonexistent/libcudart.so" in str(e.value)
    monkeypatch.setitem(__import__("sys").modules, "cuda", None)
    monkeypatch.setitem(__import__("sys").modules, "pycuda", None)
    with pytest.raises(JetsonError, match="no CUDA runtime binding could be loaded") as e:
        load_cuda_runtime()
    assert "cuda-python: cuda-python was not found" in str(e.value) and "pycuda: pycuda was not found" in str(e.value)
    assert "ctypes: the CUDA runtime library libcudart.so was not found" in str(e.value)


def test_a_real_libcudart_without_a_gpu_answers_a_named_error():
    """Where a real CUDA runtime library is installed (a CUDA wheel, the toolkit) but no GPU is, the binding
    loads it and gets CUDA's own error name back through the same calls."""
    import ctypes.util

    if ctypes.util.find_library("cudart") is None:
        pytest.skip("no libcudart on this machine")
    cuda = CtypesCudaRuntime()
    version = check(cuda.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    assert version >= 11000
    error, props = cuda.cudaGetDeviceProperties(0)
    if int(error) == 0:
        pytest.skip("this machine has a GPU")
    assert props is None and error.name.startswith("cudaError")


def fake_pycuda_driver():
    """A FAKE ``pycuda.driver`` (NOT pycuda): the driver-API objects PycudaRuntime uses, over host memory."""
    import types

    driver = types.ModuleType("pycuda.driver")
    driver.Error = RuntimeError
    driver.device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT="MULTIPROCESSOR_COUNT")
    driver.memory = {}
    driver.clock = [0.0]
    driver.init = lambda: None
    driver.get_version = lambda: (12, 6, 0)
    driver.get_driver_version = lambda: 12080

    class Context:
        def push(self):
            driver.pushed = True

        def pop(self):
            driver.pushed = False

    class Device:
        def __init__(self, index):
            self.index = index

        def retain_primary_context(self):
            return Context()

        name = staticmethod(lambda: "Orin")
        compute_capability = staticmethod(lambda: (8, 7))
        get_attribute = staticmethod(lambda attribute: 8)
        total_memory = staticmethod(lambda: 7620 << 20)

    class Allocation:
        def __init__(self, nbytes):
            self.buffer = ctypes.create_string_buffer(nbytes)
            driver.memory[int(self)] = self

        def __int__(self):
            return ctypes.addressof(self.buffer)

        def free(self):
            driver.memory.pop(int(self))

    def memcpy_htod(dst, src):
        ctypes.memmove(dst, bytes(src), len(src))

    def memcpy_dtoh(dst, src):
        ctypes.memmove(ctypes.addressof(dst), src, len(dst))

    class Stream:
        handle = 0x100

        def synchronize(self):
            pass

    class Event:
        count = 0

        def __init__(self):
            Event.count += 1
            self.handle = 0x200 + Event.count

        def record(self, stream):
            self.at = driver.clock[0]

        def time_since(self, other):
            return self.at - other.at

    driver.Device, driver.mem_alloc, driver.Stream, driver.Event = Device, Allocation, Stream, Event
    driver.memcpy_htod, driver.memcpy_dtoh = memcpy_htod, memcpy_dtoh
    return driver


def test_pycuda_speaks_cuda_pythons_conventions(monkeypatch, tmp_path):
    import sys
    import types

    driver = fake_pycuda_driver()
    package = types.ModuleType("pycuda")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.setitem(sys.modules, "cuda", None)  # cuda-python absent: pycuda is next
    cuda = load_cuda_runtime()
    assert cuda.binding == "pycuda" and cuda.captures_graphs is False and driver.pushed
    host = np.arange(8, dtype=np.float32)
    pointer = check(cuda.cudaMalloc(host.nbytes), "cudaMalloc")
    check(cuda.cudaMemcpy(pointer, host.ctypes.data, host.nbytes, 1), "cudaMemcpy")
    back = np.zeros_like(host)
    check(cuda.cudaMemcpy(back.ctypes.data, pointer, host.nbytes, 2), "cudaMemcpy")
    np.testing.assert_array_equal(back, host)
    stream = check(cuda.cudaStreamCreate(), "cudaStreamCreate")
    start, end = check(cuda.cudaEventCreate(), "cudaEventCreate"), check(cuda.cudaEventCreate(), "cudaEventCreate")
    check(cuda.cudaEventRecord(start, stream), "cudaEventRecord")
    driver.clock[0] += 1.5
    check(cuda.cudaEventRecord(end, stream), "cudaEventRecord")
    check(cuda.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    assert check(cuda.cudaEventElapsedTime(start, end), "cudaEventElapsedTime") == 1.5
    check(cuda.cudaFree(pointer), "cudaFree")
    assert driver.memory == {}
    model = tmp_path / "model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\x00")
    identity = cuda_identity(cuda, model_path=str(model))
    assert (identity["gpu"], identity["compute_capability"], identity["sm_count"], identity["memory_gib"]) == (
        "Orin", "8.7", 8, 7)
    assert identity["cuda_python_runtime"] == "12.6" and identity["cuda_driver"] == "12.8"
    cuda.close()
    assert not driver.pushed
