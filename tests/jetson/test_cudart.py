"""The ctypes binding to libcudart (jetson/cudart.py) against a FAKE libcudart compiled here from
tests/jetson/fake_libcudart.c (CUDA's C signatures over host memory): the calls cross a real C ABI,
with cuda-python's conventions on the Python side."""

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from jetson import cuda as cuda_module
from jetson.cuda import check, load_cuda_runtime
from jetson.cudart import CtypesCudaRuntime, cudaMemcpyKind, find_libcudart
from jetson.device import cuda_identity
from jetson.errors import JetsonError
from tests.fake_cuda import FakeCudaRuntime
from tests.fake_pycuda import install_fake_pycuda

REPO = Path(__file__).resolve().parents[2]

SOURCE = Path(__file__).with_name("fake_libcudart.c")


@pytest.fixture(scope="module")
def fake_libcudart(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build the fake libcudart")
    library = tmp_path_factory.mktemp("cudart") / "libcudart_fake.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE)], check=True, timeout=120)
    return library


def hide_cuda_python(monkeypatch) -> None:
    """``import cuda...`` fails, even where the real cuda-python was imported before (both its layouts)."""
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)


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
    hide_cuda_python(monkeypatch)
    monkeypatch.setitem(sys.modules, "pycuda", None)
    with pytest.raises(JetsonError, match="no CUDA runtime binding answered") as e:
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


def test_pycuda_speaks_cuda_pythons_conventions_with_events_that_have_no_handle(monkeypatch, tmp_path):
    """Issue 29 D1: pycuda's Event has no ``handle`` (wrap_cudadrv.cpp binds it on Stream only); the binding
    numbers its events itself."""
    driver = install_fake_pycuda(monkeypatch)
    assert not hasattr(driver.Event(), "handle")
    hide_cuda_python(monkeypatch)  # cuda-python absent: pycuda is next
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


def install_fake_cuda_python(monkeypatch, runtime: FakeCudaRuntime) -> None:
    """``runtime`` as cuda-python's ``cuda.bindings.runtime``."""
    package, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    package.bindings, bindings.runtime = bindings, runtime
    for name, module in (("cuda", package), ("cuda.bindings", bindings), ("cuda.bindings.runtime", runtime)):
        monkeypatch.setitem(sys.modules, name, module)


def test_a_cuda_python_that_imports_but_fails_its_first_call_falls_through_to_pycuda(monkeypatch):
    """Issue 29 D8: `pip install cuda-python` gives 13.x, which imports on JetPack 6 (a CUDA 12.6 driver) and
    answers cudaErrorInsufficientDriver at its first call (as cuda-python 12.9 does here, without a driver)."""
    install_fake_cuda_python(monkeypatch, FakeCudaRuntime(runtime=13000, driver=12060))
    install_fake_pycuda(monkeypatch)
    heard = []
    cuda = load_cuda_runtime(log=heard.append)
    assert cuda.binding == "pycuda"
    assert len(heard) == 1 and heard[0].startswith("CUDA binding cuda-python skipped: ")
    assert "cudaErrorInsufficientDriver (35)" in heard[0]
    cuda.close()


def test_then_pycuda_without_a_gpu_falls_through_to_libcudart(monkeypatch, fake_libcudart):
    install_fake_cuda_python(monkeypatch, FakeCudaRuntime(runtime=13000, driver=12060))
    driver = install_fake_pycuda(monkeypatch, devices=0)
    monkeypatch.setattr("jetson.cudart.LIBRARY_NAMES", (str(fake_libcudart),))
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    heard = []
    cuda = load_cuda_runtime(log=heard.append)
    assert cuda.binding == "ctypes libcudart" and cuda.path == str(fake_libcudart)
    assert [line.split(":")[0] for line in heard] == ["CUDA binding cuda-python skipped",
                                                     "CUDA binding pycuda skipped"]
    assert "pycuda could not open the GPU" in heard[1] and "invalid device ordinal" in heard[1]
    assert driver.pushed is False


def test_a_binding_asked_for_by_name_is_probed_too_and_its_failure_named(monkeypatch):
    install_fake_cuda_python(monkeypatch, FakeCudaRuntime(runtime=13000, driver=12060))
    with pytest.raises(JetsonError, match="the CUDA binding cuda-python did not answer") as e:
        load_cuda_runtime("cuda-python")
    assert "cudaGetDeviceCount failed" in str(e.value) and "cuda-python>=12.6,<13" in str(e.value)
    cuda, reason = cuda_module.try_cuda_binding("cuda-python")
    assert cuda is None and "cudaErrorInsufficientDriver" in reason
    install_fake_cuda_python(monkeypatch, FakeCudaRuntime())
    cuda, reason = cuda_module.try_cuda_binding("cuda-python")
    assert reason is None and check(cuda.cudaGetDeviceCount(), "cudaGetDeviceCount") == 1


def test_a_binding_whose_first_call_raises_is_skipped_with_the_exception(monkeypatch):
    """cuda-python raises RuntimeError ("Failed to dlopen libcudart.so.13") where its library is missing."""
    runtime = FakeCudaRuntime()

    def raising():
        raise RuntimeError("Failed to dlopen libcudart.so.13")

    runtime.cudaGetDeviceCount = raising
    install_fake_cuda_python(monkeypatch, runtime)
    cuda, reason = cuda_module.try_cuda_binding("cuda-python")
    assert cuda is None and "RuntimeError: Failed to dlopen libcudart.so.13" in reason


PYCUDA_RUN = """
import sys
from tests.fake_pycuda import fake_pycuda_driver
driver = fake_pycuda_driver()
package = type(sys)("pycuda")
package.driver = driver
sys.modules["pycuda"], sys.modules["pycuda.driver"] = package, driver
if sys.argv[1] == "runner":
    from jetson.cuda import load_cuda_runtime
    cuda = load_cuda_runtime("pycuda")
    assert driver.pushed
else:  # what the runner did before: the primary context pushed, nothing to pop it
    driver.Device(0).retain_primary_context().push()
print("results written", flush=True)
"""


@pytest.mark.parametrize("who, code", [("runner", 0), ("bare", -signal.SIGABRT)])
def test_a_run_on_pycuda_exits_0_after_its_results(who, code):
    """pycuda aborts the process at exit while a context is on its stack (src/cpp/cuda.hpp,
    context_stack::~context_stack: "PyCUDA ERROR: The context stack was not empty", abort(): exit 134 in a shell),
    which the fake does too ("bare"); the binding pops the context it pushed at exit, as pycuda/autoinit.py does."""
    done = subprocess.run([sys.executable, "-c", PYCUDA_RUN, who], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.stdout == "results written\n"
    assert done.returncode == code, done.stderr
    assert ("PyCUDA ERROR: The context stack was not empty" in done.stderr) is (code != 0)


def test_closing_the_pycuda_binding_pops_its_context_once(monkeypatch):
    driver = install_fake_pycuda(monkeypatch)
    hide_cuda_python(monkeypatch)
    cuda = load_cuda_runtime("pycuda")
    assert driver.context_stack
    cuda.close()
    cuda.close()  # a second close (and the one at exit) pops nothing more
    assert driver.context_stack == []


def test_every_binding_gives_the_same_device_memory(fake_libcudart, monkeypatch, tmp_path):
    """The identity's memory is cudaDeviceProp.totalGlobalMem (cuDeviceTotalMem) through every binding: pycuda's
    Device.total_memory() and cuda-python's props give that figure, so the ctypes binding reads it from the struct,
    not cudaMemGetInfo's total (decided for issue 43): an engine's identity does not depend on the binding."""
    from jetson.cudart import TOTAL_GLOBAL_MEM_OFFSET

    header = Path("/usr/local/cuda/include/cuda_runtime_api.h")
    if header.is_file() and shutil.which("cc"):  # the offset, from the installed CUDA's own header
        source = tmp_path / "offset.c"
        source.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cuda_runtime_api.h>\nint main(void) "
                          "{ printf(\"%zu\", offsetof(struct cudaDeviceProp, totalGlobalMem)); return 0; }\n")
        subprocess.run(["cc", f"-I{header.parent}", "-o", str(tmp_path / "offset"), str(source)], check=True)
        assert subprocess.run([str(tmp_path / "offset")], capture_output=True, text=True).stdout == \
            str(TOTAL_GLOBAL_MEM_OFFSET)
    ctypes_identity = cuda_identity(CtypesCudaRuntime(str(fake_libcudart)))
    install_fake_pycuda(monkeypatch)
    hide_cuda_python(monkeypatch)
    pycuda = load_cuda_runtime("pycuda")
    try:
        pycuda_identity = cuda_identity(pycuda)
    finally:
        pycuda.close()
    for field in ("memory_bytes", "memory_gib", "gpu", "compute_capability", "sm_count"):
        assert ctypes_identity[field] == pycuda_identity[field], field
