"""The CUDA runtime for running engines: cuda-python when it answers, else pycuda, else the ctypes
binding to JetPack's own libcudart (jetson.cudart), so a stock JetPack needs no pip install.

"Answers" is checked, not assumed: each binding is probed with one trivial call that needs the driver
(``cudaGetDeviceCount``, :func:`probe_cuda_runtime`) and skipped with the reason when it fails. A plain
``pip install cuda-python`` installs 13.x, which imports on JetPack 6 (CUDA 12.6) and fails at its first
call; the run then goes on with pycuda or libcudart and says why.

All three are driven the same way, in cuda-python's conventions (``cuda.bindings.runtime``): a call
returns ``(error, *values)``, handles are integers, :func:`check` turns an error into a JetsonError
with the error's name. ``binding`` on the returned object (or :func:`binding_name`) says which one
was loaded; the results record it.

cuda-python's major version must match the CUDA the driver supports: 12.x on JetPack 6 (CUDA
12.6), 13.x on JetPack 7 (CUDA 13).
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import types
from collections.abc import Callable
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


def load_cuda_runtime(binding: str | None = None, log: Callable[[str], None] | None = None) -> Any:
    """The CUDA runtime through ``binding`` (one of :data:`BINDINGS`), or the first that loads *and answers*
    a trivial call (:func:`probe_cuda_runtime`): a cuda-python of the wrong major version imports and fails
    at its first call, so importing proves nothing. ``log`` hears why each binding was skipped."""
    if binding is not None and binding not in BINDINGS:
        raise JetsonError(f"CUDA binding {binding!r}", expected=f"one of {', '.join(BINDINGS)}")
    skipped = []
    for name in (binding,) if binding else BINDINGS:
        cudart, reason = try_cuda_binding(name)
        if cudart is not None:
            return cudart
        skipped.append(f"{name}: {reason}")
        if log is not None:
            log(f"CUDA binding {name} skipped: {reason}")
    raise JetsonError("no CUDA runtime binding answered" if binding is None else f"the CUDA binding {binding} "
                      "did not answer", found="\n    " + "\n    ".join(skipped), fix=CUDA_HINT)


def try_cuda_binding(name: str) -> tuple[Any, str | None]:
    """``(runtime, None)`` when binding ``name`` loads and answers :func:`probe_cuda_runtime`, else
    ``(None, why not)`` (the preflight lists every binding this way)."""
    try:
        cudart = _load_binding(name)
    except JetsonError as e:
        return None, _reason(e)
    try:
        probe_cuda_runtime(cudart)
    except JetsonError as e:
        close = getattr(cudart, "close", None)
        if close is not None:
            close()
        return None, _reason(e)
    return cudart, None


def _reason(error: JetsonError) -> str:
    return error.what + (f" ({error.found})" if error.found else "")


def _load_binding(name: str) -> Any:
    if name == "cuda-python":
        return load_cuda_python()
    if name == "pycuda":
        return PycudaRuntime()
    from jetson.cudart import CtypesCudaRuntime

    return CtypesCudaRuntime()


def probe_cuda_runtime(cudart: Any) -> int:
    """The number of GPUs ``cudart`` sees (``cudaGetDeviceCount``, which needs the driver: the first call
    that fails when the binding's CUDA is newer than the driver's); a JetsonError naming the failure, or
    when there is no GPU."""
    try:
        count = int(check(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount"))
    except (RuntimeError, OSError, AttributeError) as e:  # cuda-python raises when it cannot load libcudart/libcuda
        raise JetsonError(f"{binding_name(cudart)}: its first call (cudaGetDeviceCount) raised",
                          found=f"{type(e).__name__}: {e}", fix=CUDA_HINT) from e
    if count < 1:
        raise JetsonError(f"{binding_name(cudart)}: cudaGetDeviceCount sees no GPU", found=str(count),
                          fix="check the driver (nvidia-smi or tegrastats) and the device nodes (/dev/nvhost-*)")
    return count


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
        try:
            driver.init()
            self.device = driver.Device(0)
            self.context = self.device.retain_primary_context()
        except driver.Error as e:
            raise JetsonError("pycuda could not open the GPU", found=str(e), fix=CUDA_HINT) from e
        self.context.push()
        # pycuda aborts the process at exit ("PyCUDA ERROR: The context stack was not empty", then abort(): src/cpp/
        # cuda.hpp, context_stack::~context_stack) while a context it pushed is still on the stack; so, as
        # pycuda/autoinit.py does, the context is popped at exit unless close() popped it before
        self._pushed = True
        atexit.register(self.close)
        self.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
        self.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)
        self._objects: dict[int, Any] = {}
        self._events: dict[int, Any] = {}  # pycuda's Event has no handle (its Stream has): numbered here
        self._event_numbers = itertools.count(1)

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

    def cudaGetDeviceCount(self) -> tuple:
        try:
            return self._ok(int(self.driver.Device.count()))
        except self.driver.Error as e:
            return self._failed(e, 0)

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
        number = next(self._event_numbers)
        self._events[number] = self.driver.Event()
        return self._ok(number)

    def cudaEventDestroy(self, event: int) -> tuple:
        self._events.pop(int(event), None)
        return self._ok()

    def cudaEventRecord(self, event: int, stream: int) -> tuple:
        try:
            self._events[int(event)].record(self._objects[int(stream)])
        except self.driver.Error as e:
            return self._failed(e)
        return self._ok()

    def cudaEventElapsedTime(self, start: int, end: int) -> tuple:
        try:
            return self._ok(float(self._events[int(end)].time_since(self._events[int(start)])))
        except self.driver.Error as e:
            return self._failed(e, 0.0)

    def close(self) -> None:
        """Let go of the primary context (pycuda keeps a stack of current contexts per thread); once (also at
        exit, where it runs unless called before)."""
        if not self._pushed:
            return
        self._pushed = False
        atexit.unregister(self.close)
        self.context.pop()
