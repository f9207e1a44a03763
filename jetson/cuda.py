"""The CUDA runtime for running engines: cuda-python when installed, else pycuda, else the ctypes
binding to JetPack's own libcudart (jetson.cudart), so a stock JetPack needs no pip install.

All three are driven the same way, in cuda-python's conventions (``cuda.bindings.runtime``): a call
returns ``(error, *values)``, handles are integers, :func:`check` turns an error into a JetsonError
with the error's name. ``binding`` on the returned object (or :func:`binding_name`) says which one
was loaded; the results record it.

cuda-python's major version must match the CUDA the driver supports: 12.x on JetPack 6 (CUDA
12.6), 13.x on JetPack 7 (CUDA 13).
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

from jetson.errors import JetsonError

BINDINGS = ("cuda-python", "pycuda", "ctypes")
CUDA_HINT = ("install NVIDIA's cuda-python of your CUDA's major version: `pip install 'cuda-python>=12.6,<13'` on "
             "JetPack 6 (CUDA 12.6), `pip install 'cuda-python>=13,<14'` on JetPack 7 (CUDA 13); or use JetPack's "
             "own libcudart (--cuda ctypes, no install)")


def load_cuda_python() -> types.ModuleType:
    """cuda-python's runtime module (both of its layouts), or a JetsonError."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6 layout
        except ImportError as e:
            raise JetsonError("cuda-python was not found", found=str(e), fix=CUDA_HINT) from e
    return cudart


def load_cuda_runtime(binding: str | None = None) -> Any:
    """The CUDA runtime through ``binding`` (one of :data:`BINDINGS`), or the first that loads."""
    if binding is not None and binding not in BINDINGS:
        raise JetsonError(f"CUDA binding {binding!r}", expected=f"one of {', '.join(BINDINGS)}")
    failures = []
    for name in (binding,) if binding else BINDINGS:
        try:
            if name == "cuda-python":
                return load_cuda_python()
            if name == "pycuda":
                return PycudaRuntime()
            from jetson.cudart import CtypesCudaRuntime

            return CtypesCudaRuntime()
        except JetsonError as e:
            failures.append(f"{name}: {e.what}")
    raise JetsonError("no CUDA runtime binding could be loaded", found="; ".join(failures), fix=CUDA_HINT)


def binding_name(cudart: Any) -> str:
    """Which binding ``cudart`` is (cuda-python's module has no ``binding`` attribute)."""
    return str(getattr(cudart, "binding", "cuda-python"))


def check(result: tuple, what: str) -> Any:
    """``(error, *values)`` -> the value(s), or a JetsonError naming the call and the error."""
    error, *values = result
    if int(error) != 0:
        name = getattr(error, "name", str(error))  # cuda-python's errors are IntEnums: str() is only the number
        fix = ("check the GPU and driver (tegrastats, dmesg), and that no other process holds all device memory")
        if name == "cudaErrorInsufficientDriver":
            fix = f"this cuda-python needs a newer CUDA driver than the device has: {CUDA_HINT}"
        raise JetsonError(f"CUDA call {what} failed", found=f"{name} ({int(error)})", fix=fix)
    return values[0] if len(values) == 1 else tuple(values)


class _PycudaError(int):
    name = "pycuda error"


class PycudaRuntime:
    """pycuda (the CUDA driver API) behind cuda-python's runtime conventions, on the device's primary
    context (the one TensorRT's runtime calls use). No CUDA graphs (``captures_graphs = False``): the runner
    times plain enqueues and says so."""

    binding = "pycuda"
    captures_graphs = False

    def __init__(self) -> None:
        try:
            import pycuda.driver as driver  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError as e:
            raise JetsonError("pycuda was not found", found=str(e), fix=CUDA_HINT) from e
        self.driver = driver
        driver.init()
        self.device = driver.Device(0)
        self.context = self.device.retain_primary_context()
        self.context.push()
        self.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
        self.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)
        self._objects: dict[int, Any] = {}

    def _ok(self, *values: Any) -> tuple:
        return (0, *values)

    def _failed(self, e: Exception, *values: Any) -> tuple:
        error = _PycudaError(999)  # cudaErrorUnknown: pycuda raises, it returns no code
        error.name = f"pycuda: {e}"
        return (error, *values)

    def _keep(self, handle: int, value: Any) -> int:
        self._objects[handle] = value
        return handle

    def cudaRuntimeGetVersion(self) -> tuple:
        major, minor, _ = self.driver.get_version()  # the CUDA pycuda was built against
        return self._ok(major * 1000 + minor * 10)

    def cudaDriverGetVersion(self) -> tuple:
        return self._ok(int(self.driver.get_driver_version()))

    def cudaGetDeviceProperties(self, device: int) -> tuple:
        attribute = self.driver.device_attribute.MULTIPROCESSOR_COUNT
        major, minor = self.device.compute_capability()
        return self._ok(types.SimpleNamespace(name=self.device.name().encode(), major=major, minor=minor,
                                              multiProcessorCount=self.device.get_attribute(attribute),
                                              totalGlobalMem=self.device.total_memory()))

    def cudaMalloc(self, nbytes: int) -> tuple:
        try:
            allocation = self.driver.mem_alloc(int(nbytes))
        except self.driver.Error as e:
            return self._failed(e, 0)
        return self._ok(self._keep(int(allocation), allocation))

    def cudaFree(self, pointer: int) -> tuple:
        self._objects.pop(int(pointer)).free()
        return self._ok()

    def cudaMemcpy(self, dst: int, src: int, count: int, kind: int) -> tuple:
        try:
            if int(kind) == 1:
                self.driver.memcpy_htod(int(dst), (ctypes.c_char * int(count)).from_address(int(src)))
            else:
                self.driver.memcpy_dtoh((ctypes.c_char * int(count)).from_address(int(dst)), int(src))
        except self.driver.Error as e:
            return self._failed(e)
        return self._ok()

    def cudaStreamCreate(self) -> tuple:
        stream = self.driver.Stream()
        return self._ok(self._keep(int(stream.handle), stream))

    def cudaStreamDestroy(self, stream: int) -> tuple:
        self._objects.pop(int(stream), None)
        return self._ok()

    def cudaStreamSynchronize(self, stream: int) -> tuple:
        try:
            self._objects[int(stream)].synchronize()
        except self.driver.Error as e:
            return self._failed(e)
        return self._ok()

    def cudaEventCreate(self) -> tuple:
        event = self.driver.Event()
        return self._ok(self._keep(int(event.handle), event))

    def cudaEventDestroy(self, event: int) -> tuple:
        self._objects.pop(int(event), None)
        return self._ok()

    def cudaEventRecord(self, event: int, stream: int) -> tuple:
        self._objects[int(event)].record(self._objects[int(stream)])
        return self._ok()

    def cudaEventElapsedTime(self, start: int, end: int) -> tuple:
        return self._ok(float(self._objects[int(end)].time_since(self._objects[int(start)])))

    def close(self) -> None:
        """Let go of the primary context (pycuda keeps a stack of current contexts per thread)."""
        self.context.pop()
