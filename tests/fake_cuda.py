"""FakeCudaRuntime: a stand-in for cuda-python's ``cuda.bindings.runtime``, for unit tests of the TensorRT code.

Mirrors cuda-python 12.9 (``cuda-bindings`` 12.9.x, ``cuda/bindings/runtime.pyx``), the 12.x line JetPack 6
needs: the names, parameter counts and enum values of every call edge makes, and its answers without a
driver (``cudaGetDeviceCount`` -> ``(cudaErrorInsufficientDriver, None)``). tests/jetson/test_fakes_surface.py
checks that against the real module wherever cuda-python is installed.

NOT CUDA. It runs no kernel and its clock is made up; it mimics the calls edge makes, with
cuda-python's conventions (every call returns a tuple whose first item is a ``cudaError_t``;
handles are integers), so the execution lines of the builder, the calibrator and the TensorRT
profiler (device buffers, copies, streams, events, graph capture) run in tests. What it checks,
as CUDA would fail on it: copies stay inside live allocations, every handle used is live, a
stream under capture records work instead of running it. ``leaks()`` lists what was not released.

"Device" memory is host memory (a ``bytearray`` per allocation), so tests can read back what a
calibrator copied. FakeTensorRT (tests/fake_tensorrt.py) takes this runtime to check the
addresses it is given and to advance the fake GPU clock when it "runs" an engine.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import types


class cudaError_t(enum.IntEnum):  # noqa: N801 - cuda-python's name
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorInvalidResourceHandle = 400
    cudaErrorNotReady = 600
    cudaErrorStreamCaptureUnsupported = 900


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2


class cudaStreamCaptureMode(enum.IntEnum):  # noqa: N801
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


OK = cudaError_t.cudaSuccess
BAD_HANDLE = cudaError_t.cudaErrorInvalidResourceHandle

#: what cudaGetDeviceProperties says on an Orin Nano 8GB (8 SMs, 7620 MB usable) and an AGX Orin 64GB (16 SMs)
ORIN_NANO = {"name": "Orin", "major": 8, "minor": 7, "multiProcessorCount": 8, "totalGlobalMem": 7620 << 20}
AGX_ORIN = {"name": "Orin", "major": 8, "minor": 7, "multiProcessorCount": 16, "totalGlobalMem": 62841 << 20}


class FakeCudaRuntime:
    """One fake GPU. ``runtime``/``local_runtime``/``driver`` are CUDA versions as CUDA encodes them (12060 = 12.6)."""

    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaStreamCaptureMode = cudaStreamCaptureMode

    def __init__(self, props: dict | None = None, runtime: int = 12060, local_runtime: int | None = 12060,
                 driver: int = 12060) -> None:
        """``runtime`` above ``driver`` in its major version is a cuda-python too new for the driver (13.x on
        JetPack 6): it imports, and every call that needs the driver fails with cudaErrorInsufficientDriver."""
        props = {**ORIN_NANO, **(props or {})}
        self.props = types.SimpleNamespace(**{**props, "name": props["name"].encode()})
        self.runtime, self.local_runtime, self.driver = runtime, local_runtime, driver
        self.handles = itertools.count(0x1000, 0x100)
        self.memory: dict[int, bytearray] = {}
        self.streams: dict[int, list | None] = {}  # stream -> the launches being captured (None: not capturing)
        self.events: dict[int, float | None] = {}  # event -> the clock when it was recorded
        self.graphs: dict[int, list] = {}
        self.graph_execs: dict[int, list] = {}
        self.clock_ms = 0.0
        self.copies: list[tuple[str, int]] = []  # (kind, bytes)
        self.launches = 0

    def _too_new_for_the_driver(self) -> bool:
        return self.runtime // 1000 > self.driver // 1000

    # identity
    def cudaGetDeviceProperties(self, device: int):
        if self._too_new_for_the_driver():
            return cudaError_t.cudaErrorInsufficientDriver, None
        return (OK, self.props) if device == 0 else (cudaError_t.cudaErrorInvalidValue, None)

    def cudaRuntimeGetVersion(self):
        return OK, self.runtime

    def cudaDriverGetVersion(self):
        return OK, self.driver

    def cudaGetDeviceCount(self):
        if self._too_new_for_the_driver():
            return cudaError_t.cudaErrorInsufficientDriver, None  # as cuda-python 12.9 answers without a driver
        return OK, 1

    def getLocalRuntimeVersion(self):
        if self.local_runtime is None:  # no libcudart on the library path
            raise RuntimeError("Failed to dlopen libcudart.so.12")
        return OK, self.local_runtime

    # memory
    def cudaMalloc(self, nbytes: int):
        if self._too_new_for_the_driver():
            return cudaError_t.cudaErrorInsufficientDriver, None
        pointer = next(self.handles)
        self.memory[pointer] = bytearray(int(nbytes))
        return OK, pointer

    def cudaFree(self, pointer: int):
        return (OK,) if self.memory.pop(int(pointer), None) is not None else (cudaError_t.cudaErrorInvalidValue,)

    def allocation_size(self, pointer: int) -> int | None:
        block = self.memory.get(int(pointer))
        return None if block is None else len(block)

    def read(self, pointer: int, nbytes: int) -> bytes:
        """What a kernel would read from device memory (tests and FakeTensorRT only)."""
        return bytes(self.memory[int(pointer)][:nbytes])

    def cudaMemcpy(self, dst: int, src: int, count: int, kind):
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            block = self.memory.get(int(dst))
            if block is None or count > len(block):
                return (cudaError_t.cudaErrorInvalidValue,)
            block[:count] = ctypes.string_at(int(src), count)
        elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            block = self.memory.get(int(src))
            if block is None or count > len(block):
                return (cudaError_t.cudaErrorInvalidValue,)
            ctypes.memmove(int(dst), bytes(block[:count]), count)
        else:
            return (cudaError_t.cudaErrorInvalidValue,)
        self.copies.append((cudaMemcpyKind(kind).name, int(count)))
        return (OK,)

    # streams and work
    def cudaStreamCreate(self):
        if self._too_new_for_the_driver():
            return cudaError_t.cudaErrorInsufficientDriver, None
        stream = next(self.handles)
        self.streams[stream] = None
        return OK, stream

    def cudaStreamDestroy(self, stream: int):
        return (OK,) if self.streams.pop(int(stream), 0) != 0 else (BAD_HANDLE,)

    def cudaStreamSynchronize(self, stream: int):
        if int(stream) not in self.streams:
            return (BAD_HANDLE,)
        if self.streams[int(stream)] is not None:  # synchronising a capturing stream invalidates the capture
            return (cudaError_t.cudaErrorStreamCaptureUnsupported,)
        return (OK,)

    def launch(self, stream: int, milliseconds: float) -> bool:
        """FakeTensorRT's enqueue: run ``milliseconds`` of work on ``stream``, or record it while capturing."""
        if int(stream) not in self.streams:
            return False
        captured = self.streams[int(stream)]
        if captured is not None:
            captured.append(milliseconds)
        else:
            self.clock_ms += milliseconds
            self.launches += 1
        return True

    # events
    def cudaEventCreate(self):
        if self._too_new_for_the_driver():
            return cudaError_t.cudaErrorInsufficientDriver, None
        event = next(self.handles)
        self.events[event] = None
        return OK, event

    def cudaEventDestroy(self, event: int):
        return (OK,) if self.events.pop(int(event), 0) != 0 else (BAD_HANDLE,)

    def cudaEventRecord(self, event: int, stream: int):
        if int(event) not in self.events or int(stream) not in self.streams:
            return (BAD_HANDLE,)
        self.events[int(event)] = self.clock_ms
        return (OK,)

    def cudaEventElapsedTime(self, start: int, end: int):
        times = self.events.get(int(start)), self.events.get(int(end))
        if None in times:
            return BAD_HANDLE, 0.0
        return OK, float(times[1] - times[0])

    # CUDA graphs
    def cudaStreamBeginCapture(self, stream: int, mode):
        if int(stream) not in self.streams or self.streams[int(stream)] is not None:  # unknown, or capturing
            return (BAD_HANDLE,)
        self.streams[int(stream)] = []
        return (OK,)

    def cudaStreamEndCapture(self, stream: int):
        captured = self.streams.get(int(stream))
        if captured is None:
            return BAD_HANDLE, None
        self.streams[int(stream)] = None
        graph = next(self.handles)
        self.graphs[graph] = captured
        return OK, graph

    def cudaGraphInstantiate(self, graph: int, flags: int):
        if int(graph) not in self.graphs:
            return BAD_HANDLE, None
        graph_exec = next(self.handles)
        self.graph_execs[graph_exec] = list(self.graphs[int(graph)])
        return OK, graph_exec

    def cudaGraphLaunch(self, graph_exec: int, stream: int):
        if int(graph_exec) not in self.graph_execs or int(stream) not in self.streams:
            return (BAD_HANDLE,)
        for milliseconds in self.graph_execs[int(graph_exec)]:
            self.launch(stream, milliseconds)
        return (OK,)

    def cudaGraphDestroy(self, graph: int):
        return (OK,) if self.graphs.pop(int(graph), None) is not None else (BAD_HANDLE,)

    def cudaGraphExecDestroy(self, graph_exec: int):
        return (OK,) if self.graph_execs.pop(int(graph_exec), None) is not None else (BAD_HANDLE,)

    def leaks(self) -> dict[str, int]:
        """Handles still alive, by kind (empty when everything was released)."""
        alive = {"allocations": len(self.memory), "streams": len(self.streams), "events": len(self.events),
                 "graphs": len(self.graphs), "graph_execs": len(self.graph_execs)}
        return {kind: n for kind, n in alive.items() if n}

