"""A thin ctypes binding to the CUDA runtime library (``libcudart.so``), as Polygraphy keeps one, so a
stock JetPack runs TensorRT engines with no pip install: JetPack ships libcudart but neither
cuda-python nor pycuda.

It speaks cuda-python's conventions (``cuda.bindings.runtime``): every call returns a tuple whose
first item is the error (an ``int``-like :class:`CudaError` that knows its name, from
``cudaGetErrorName``) followed by the values, and handles are plain integers. So the code that
drives cuda-python (jetson.cuda.check, the TensorRT backend) drives this binding unchanged. Only
the calls the runner makes are bound: memory, copies, streams, events, CUDA graphs, the device's
properties and versions.

``cudaGetDeviceProperties`` returns only what the identity needs: the name and ``totalGlobalMem`` (the
first and fifth fields of ``cudaDeviceProp``, at offsets 0 and 288 in every CUDA release from 10.0 to 13:
``name[256]``, ``uuid[16]``, ``luid[8]``, ``luidDeviceNodeMask``, then ``totalGlobalMem``, driver_types.h;
read from an oversized buffer so that a larger struct in a newer CUDA cannot overflow it), the compute
capability and SM count (``cudaDeviceGetAttribute``); the rest of the struct's layout changes between
releases. The total memory is ``totalGlobalMem`` (``cuDeviceTotalMem``), the figure cuda-python's
``cudaDeviceProp`` and pycuda's ``Device.total_memory()`` give too, so an engine's identity does not
depend on the binding; ``cudaMemGetInfo``'s total is another figure (what the process may allocate).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import types
from collections.abc import Sequence

from jetson.errors import JetsonError

#: where JetPack puts the library (CUDA 12 on JetPack 6, 13 on JetPack 7); the plain names go through ld.so
LIBRARY_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so",
                 "/usr/local/cuda/targets/aarch64-linux/lib/libcudart.so")
_PROPS_BUFFER = 4096  # bytes: larger than cudaDeviceProp in any CUDA release (about 1 KB in 12.x)
#: cudaDeviceProp.totalGlobalMem's offset (size_t after name[256], uuid[16], luid[8], luidDeviceNodeMask: 284, aligned
#: to 8), the same from CUDA 10.0 to 13.0 on 64-bit Linux (driver_types.h)
TOTAL_GLOBAL_MEM_OFFSET = 288
_ATTRIBUTES = {"major": 75, "minor": 76, "multiProcessorCount": 16}  # cudaDeviceAttr values


class CudaError(int):
    """A ``cudaError_t`` with the name libcudart gives it (``.name``), as cuda-python's enums have."""

    name: str

    def __new__(cls, value: int, name: str) -> CudaError:
        error = super().__new__(cls, value)
        error.name = name
        return error

    def __repr__(self) -> str:
        return f"{self.name} ({int(self)})"


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801 - CUDA's names, as cuda-python spells them
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


class cudaStreamCaptureMode(enum.IntEnum):  # noqa: N801
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


def find_libcudart(names: Sequence[str] | None = None) -> ctypes.CDLL:
    """The first of ``names`` (default :data:`LIBRARY_NAMES`) that loads; a JetsonError listing them all
    when none does."""
    tried = []
    found = ctypes.util.find_library("cudart")
    for name in ([found] if found else []) + list(names or LIBRARY_NAMES):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise JetsonError("the CUDA runtime library libcudart.so was not found", found="\n    ".join(tried),
                      fix="install JetPack's CUDA (`sudo apt install nvidia-jetpack` or cuda-runtime-12-6), or add "
                          "its folder (/usr/local/cuda/lib64) to LD_LIBRARY_PATH")


class CtypesCudaRuntime:
    """The CUDA runtime through ctypes, with cuda-python's call conventions (see the module docstring)."""

    binding = "ctypes libcudart"
    cudaMemcpyKind = cudaMemcpyKind
    cudaStreamCaptureMode = cudaStreamCaptureMode

    def __init__(self, library: ctypes.CDLL | str | None = None) -> None:
        if library is None:
            library = find_libcudart()
        elif isinstance(library, str):
            library = ctypes.CDLL(library)
        self.library = library
        self._name = library.cudaGetErrorName
        self._name.restype = ctypes.c_char_p
        self._name.argtypes = [ctypes.c_int]
        self.path = getattr(library, "_name", None)

    def _call(self, function: str, *args) -> CudaError:
        code = int(getattr(self.library, function)(*args))
        return self._error(code)

    def _error(self, code: int) -> CudaError:
        raw = self._name(code)
        return CudaError(code, raw.decode() if raw else f"cudaError {code}")

    # versions and the device
    def cudaRuntimeGetVersion(self) -> tuple[CudaError, int]:
        version = ctypes.c_int()
        return self._call("cudaRuntimeGetVersion", ctypes.byref(version)), version.value

    def getLocalRuntimeVersion(self) -> tuple[CudaError, int]:
        """This binding is the local runtime: the same as cudaRuntimeGetVersion (cuda-python's name)."""
        return self.cudaRuntimeGetVersion()

    def cudaDriverGetVersion(self) -> tuple[CudaError, int]:
        version = ctypes.c_int()
        return self._call("cudaDriverGetVersion", ctypes.byref(version)), version.value

    def cudaGetDeviceCount(self) -> tuple[CudaError, int]:
        count = ctypes.c_int()
        return self._call("cudaGetDeviceCount", ctypes.byref(count)), count.value

    def cudaGetDeviceProperties(self, device: int) -> tuple[CudaError, types.SimpleNamespace | None]:
        buffer = ctypes.create_string_buffer(_PROPS_BUFFER)
        function = "cudaGetDeviceProperties_v2" if hasattr(self.library, "cudaGetDeviceProperties_v2") \
            else "cudaGetDeviceProperties"
        error = self._call(function, buffer, ctypes.c_int(device))
        if error:
            return error, None
        props: dict[str, bytes | int] = {"name": buffer.raw[:256].split(b"\x00", 1)[0]}
        for field, attribute in _ATTRIBUTES.items():
            value = ctypes.c_int()
            error = self._call("cudaDeviceGetAttribute", ctypes.byref(value), ctypes.c_int(attribute),
                               ctypes.c_int(device))
            if error:
                return error, None
            props[field] = value.value
        props["totalGlobalMem"] = ctypes.c_size_t.from_buffer(buffer, TOTAL_GLOBAL_MEM_OFFSET).value
        return error, types.SimpleNamespace(**props)

    # memory
    def cudaMalloc(self, nbytes: int) -> tuple[CudaError, int]:
        pointer = ctypes.c_void_p()
        error = self._call("cudaMalloc", ctypes.byref(pointer), ctypes.c_size_t(int(nbytes)))
        return error, int(pointer.value or 0)

    def cudaFree(self, pointer: int) -> tuple[CudaError]:
        return (self._call("cudaFree", ctypes.c_void_p(int(pointer))),)

    def cudaMemcpy(self, dst: int, src: int, count: int, kind: int) -> tuple[CudaError]:
        return (self._call("cudaMemcpy", ctypes.c_void_p(int(dst)), ctypes.c_void_p(int(src)),
                           ctypes.c_size_t(int(count)), ctypes.c_int(int(kind))),)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: int, stream: int) -> tuple[CudaError]:
        return (self._call("cudaMemcpyAsync", ctypes.c_void_p(int(dst)), ctypes.c_void_p(int(src)),
                           ctypes.c_size_t(int(count)), ctypes.c_int(int(kind)), ctypes.c_void_p(int(stream))),)

    # streams
    def cudaStreamCreate(self) -> tuple[CudaError, int]:
        stream = ctypes.c_void_p()
        return self._call("cudaStreamCreate", ctypes.byref(stream)), int(stream.value or 0)

    def cudaStreamDestroy(self, stream: int) -> tuple[CudaError]:
        return (self._call("cudaStreamDestroy", ctypes.c_void_p(int(stream))),)

    def cudaStreamSynchronize(self, stream: int) -> tuple[CudaError]:
        return (self._call("cudaStreamSynchronize", ctypes.c_void_p(int(stream))),)

    # events
    def cudaEventCreate(self) -> tuple[CudaError, int]:
        event = ctypes.c_void_p()
        return self._call("cudaEventCreate", ctypes.byref(event)), int(event.value or 0)

    def cudaEventDestroy(self, event: int) -> tuple[CudaError]:
        return (self._call("cudaEventDestroy", ctypes.c_void_p(int(event))),)

    def cudaEventRecord(self, event: int, stream: int) -> tuple[CudaError]:
        return (self._call("cudaEventRecord", ctypes.c_void_p(int(event)), ctypes.c_void_p(int(stream))),)

    def cudaEventElapsedTime(self, start: int, end: int) -> tuple[CudaError, float]:
        milliseconds = ctypes.c_float()
        error = self._call("cudaEventElapsedTime", ctypes.byref(milliseconds), ctypes.c_void_p(int(start)),
                           ctypes.c_void_p(int(end)))
        return error, float(milliseconds.value)

    # CUDA graphs (the CUDA 12 signatures: cudaGraphInstantiate takes flags)
    def cudaStreamBeginCapture(self, stream: int, mode: int) -> tuple[CudaError]:
        return (self._call("cudaStreamBeginCapture", ctypes.c_void_p(int(stream)), ctypes.c_int(int(mode))),)

    def cudaStreamEndCapture(self, stream: int) -> tuple[CudaError, int]:
        graph = ctypes.c_void_p()
        return self._call("cudaStreamEndCapture", ctypes.c_void_p(int(stream)), ctypes.byref(graph)), \
            int(graph.value or 0)

    def cudaGraphInstantiate(self, graph: int, flags: int) -> tuple[CudaError, int]:
        graph_exec = ctypes.c_void_p()
        error = self._call("cudaGraphInstantiate", ctypes.byref(graph_exec), ctypes.c_void_p(int(graph)),
                           ctypes.c_ulonglong(int(flags)))
        return error, int(graph_exec.value or 0)

    def cudaGraphLaunch(self, graph_exec: int, stream: int) -> tuple[CudaError]:
        return (self._call("cudaGraphLaunch", ctypes.c_void_p(int(graph_exec)), ctypes.c_void_p(int(stream))),)

    def cudaGraphDestroy(self, graph: int) -> tuple[CudaError]:
        return (self._call("cudaGraphDestroy", ctypes.c_void_p(int(graph))),)

    def cudaGraphExecDestroy(self, graph_exec: int) -> tuple[CudaError]:
        return (self._call("cudaGraphExecDestroy", ctypes.c_void_p(int(graph_exec))),)
