"""A TensorRT engine run for timing: the execution half shared by the device runner and ``edge
profile --backend trt`` (edge.profile.tensorrt adds the manifest check on top).

* TensorRT's own plugins and the given plugin libraries are registered before the engine is
  deserialised (it does not deserialise without them);
* every I/O tensor gets a device buffer (``set_tensor_address``), inputs are filled once with
  seeded random values, and ``execute_async_v3`` runs on its own CUDA stream;
* each ``infer()`` is one complete inference (enqueue, then synchronise) timed on the GPU with CUDA
  events as well as by the caller on the host; ``cuda_graph=True`` captures the enqueue once and
  replays the graph (trtexec's ``--useCudaGraph``), where the CUDA binding can capture;
* ``report()`` adds the GPU-event percentiles, device memory and per-layer times from separate runs
  with an ``IProfiler`` attached (a profiler serialises the layers, so its runs are never timed).

The CUDA runtime is any binding of jetson.cuda (cuda-python, pycuda, ctypes libcudart): all speak
cuda-python's conventions. ``import tensorrt`` happens only when a backend is made.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from jetson.cuda import binding_name, check
from jetson.engine import load_plugin_library, open_static_plugin_library
from jetson.errors import JetsonError
from jetson.features import detect_features, dims_list, load_tensorrt
from jetson.stats import latency_stats

if TYPE_CHECKING:
    import tensorrt


def _layer_profiler(times: dict[str, list[float]]) -> tensorrt.IProfiler:
    import tensorrt as trt

    class LayerProfiler(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            times[layer_name].append(float(ms))

    return LayerProfiler()


def layer_table(times: dict[str, list[float]], runs: int) -> list[dict]:
    """Per-layer mean/median time and share, in trtexec's --exportProfile terms (slowest first)."""
    total = sum(sum(v) for v in times.values()) or 1.0
    rows = [{"name": name, "time_ms": sum(v), "average_ms": sum(v) / max(runs, 1),
             "median_ms": float(np.median(v)), "percentage": 100.0 * sum(v) / total}
            for name, v in times.items()]
    return sorted(rows, key=lambda r: -r["time_ms"])


class TensorRTEngineBackend:
    """A serialised TensorRT engine on the GPU, one CUDA stream, inputs filled once with seeded random values.

    ``label`` names the engine in messages and results; ``precision`` and ``device`` are reported
    by :meth:`describe`.
    """

    name = "tensorrt"

    def __init__(self, engine: bytes, cudart: Any, *, label: str, plugins: list[str] | tuple[str, ...] = (),
                 static_plugins: list[str] | tuple[str, ...] = (), batch: int | None = None,
                 cuda_graph: bool = False, layer_runs: int = 20, seed: int = 0,
                 precision: str | None = None, device: str | None = None,
                 logger: tensorrt.ILogger | None = None) -> None:
        trt = load_tensorrt()
        self.label = label
        self.cudart = cudart
        self.precision = precision
        self.device = device
        self.engine_bytes = len(engine)
        self.features = detect_features(trt)
        if logger is None:
            from jetson.trt_log import stderr_logger

            logger = stderr_logger()  # never trt.Logger: it prints on stdout
        self.logger = logger
        self.runtime = trt.Runtime(self.logger)
        self.plugins = self._load_plugins(trt, plugins, static_plugins)
        self.engine = self.runtime.deserialize_cuda_engine(engine)
        if self.engine is None:
            raise JetsonError(f"TensorRT could not deserialise {label}", found="see TensorRT's log above",
                              fix="rebuild the engine on this device")
        self.context = self.engine.create_execution_context()
        if self.context is None:  # TensorRT returns None when it cannot allocate the activations
            raise JetsonError(f"TensorRT could not create an execution context for {label}",
                              found=f"see TensorRT's log; the engine needs {self._activation_mib():.0f} MiB of "
                                    "device memory for its activations",
                              fix="free device memory (close other programs; tegrastats shows what is used), or "
                                  "bundle this variant with a smaller batch")
        self.stream = check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.start_event = check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.end_event = check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.layer_runs = layer_runs
        self.gpu_ms: list[float] = []
        self.buffers: dict[str, int] = {}
        self.io: dict[str, dict] = {}
        self.graph_exec = None
        self.cuda_graph_note: str | None = None
        try:
            self.batch = self._bind(trt, batch, seed)
            if cuda_graph and not getattr(cudart, "captures_graphs", True):
                self.cuda_graph_note = f"not captured: the {binding_name(cudart)} binding has no CUDA graphs"
            elif cuda_graph:
                self.graph_exec = self._capture()
        except BaseException:
            self.close()
            raise

    def _activation_mib(self) -> float:
        size = self.engine.device_memory_size_v2 if self.features.device_memory_size_v2 else \
            self.engine.device_memory_size
        return int(size) / (1 << 20)

    def _load_plugins(self, trt, plugins: list[str] | tuple[str, ...],
                      static_plugins: list[str] | tuple[str, ...]) -> list[str]:
        """TensorRT's plugins and the libraries the engine was built with, registered before deserialising, each
        once per process (jetson.engine): ``plugins`` through ``loadLibrary`` (edge's, with ``getCreators``),
        ``static_plugins`` opened (third-party libraries that register from static initialisers)."""
        trt.init_libnvinfer_plugins(self.logger, "")
        libraries = [str(p) for p in (*static_plugins, *plugins)]
        for path in libraries:
            if not Path(path).is_file():
                raise JetsonError(f"{self.label} was built with the plugin library {path}, which does not exist here",
                                  fix=f"put {Path(path).name} back at {path}, or rebuild the engine without it")
        for path in static_plugins:
            open_static_plugin_library(trt, str(path))
        for path in plugins:
            load_plugin_library(trt, self.runtime.get_plugin_registry(), str(path))
        return libraries

    def _bind(self, trt, batch: int | None, seed: int) -> int:
        """Allocate every I/O tensor on the device, fill the inputs, set their addresses."""
        rng = np.random.default_rng(seed)
        engine_batch = 1
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            shape = dims_list(self.engine.get_tensor_shape(name))
            if is_input and -1 in shape:
                shape = [(batch or 1) if d == -1 else d for d in shape]
                if not self.context.set_input_shape(name, shape):
                    raise JetsonError(f"batch {batch} is outside the engine's optimisation profile for input {name}",
                                      fix="rebuild with --min-batch/--opt-batch/--max-batch covering it")
            if not is_input:
                shape = dims_list(self.context.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            nbytes = int(np.prod(shape)) * dtype.itemsize
            self.buffers[name] = check(self.cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc")
            if is_input:
                host = np.ascontiguousarray(rng.standard_normal(shape).astype(dtype))
                check(self.cudart.cudaMemcpy(self.buffers[name], host.ctypes.data, nbytes,
                                             self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
                engine_batch = shape[0] if shape else 1
            self.context.set_tensor_address(name, int(self.buffers[name]))
            self.io[name] = {"io": "input" if is_input else "output", "shape": shape, "dtype": str(dtype)}
        return engine_batch

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(int(self.stream)):
            raise JetsonError(f"execute_async_v3 failed on {self.label}", found="see TensorRT's log above")

    def _capture(self) -> Any:
        """Capture one enqueue as a CUDA graph (after a warm-up run, as TensorRT requires)."""
        cudart = self.cudart
        self._enqueue()
        check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(cudart.cudaStreamBeginCapture(self.stream, mode), "cudaStreamBeginCapture")
        self._enqueue()
        graph = check(cudart.cudaStreamEndCapture(self.stream), "cudaStreamEndCapture")
        try:
            return check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        finally:
            cudart.cudaGraphDestroy(graph)  # the executable graph does not need its template

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device, "precision": self.precision, "batch": self.batch,
                "threads": None, "model": self.label, "tensorrt": self.features.version,
                "cuda_graph": self.graph_exec is not None, "cuda_binding": binding_name(self.cudart),
                **({"cuda_graph_note": self.cuda_graph_note} if self.cuda_graph_note else {})}

    def weight_bytes(self) -> int:
        """The engine's serialised size: weights plus kernels (TensorRT reports no weight-only figure)."""
        return self.engine_bytes

    def infer(self) -> None:
        cudart = self.cudart
        check(cudart.cudaEventRecord(self.start_event, self.stream), "cudaEventRecord")
        if self.graph_exec is not None:
            check(cudart.cudaGraphLaunch(self.graph_exec, self.stream), "cudaGraphLaunch")
        else:
            self._enqueue()
        check(cudart.cudaEventRecord(self.end_event, self.stream), "cudaEventRecord")
        check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        self.gpu_ms.append(float(check(cudart.cudaEventElapsedTime(self.start_event, self.end_event),
                                       "cudaEventElapsedTime")))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference on ``feeds`` (the accuracy gate's images, each of its input's shape), enqueued directly
        (never timed, never the CUDA graph): the outputs by name. The inputs stay in the buffers afterwards."""
        from jetson.accuracy_gate import copy_inputs, read_outputs

        copy_inputs(self, feeds)
        self._enqueue()
        check(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return read_outputs(self)

    def device_memory(self) -> dict:
        engine = self.engine
        size = engine.device_memory_size_v2 if self.features.device_memory_size_v2 else engine.device_memory_size
        io_bytes = sum(int(np.prod(v["shape"])) * np.dtype(v["dtype"]).itemsize for v in self.io.values())
        return {"activation_bytes": int(size), "io_bytes": io_bytes, "engine_bytes": self.weight_bytes(),
                "streamable_weights_bytes": int(getattr(engine, "streamable_weights_size", 0) or 0)}

    def layer_times(self) -> list[dict]:
        """Per-layer times from ``layer_runs`` extra enqueues with an IProfiler (never the timed runs)."""
        times: dict[str, list[float]] = defaultdict(list)
        self.context.profiler = _layer_profiler(times)
        for _ in range(self.layer_runs):
            self._enqueue()
            check(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return layer_table(times, self.layer_runs)

    def report(self, warmup: int = 0) -> dict:
        """What the host clock cannot see: GPU-event percentiles, device memory, per-layer times. ``warmup``: how
        many of the first :meth:`infer` calls were warm-up; every one of them is left out of the GPU-event
        figures, as trtexec leaves out every warm-up query (samples/common/sampleReporting.cpp at v10.3.0,
        ~319): the figures cover the timed calls only (null when there were none)."""
        measured = self.gpu_ms[warmup:]
        return {"gpu_latency": latency_stats(measured, self.batch) if measured else None,
                "gpu_clock": "CUDA events on the stream",
                "device_memory": self.device_memory(), "layers": self.layer_times() if self.layer_runs else []}

    def close(self) -> None:
        """Release every CUDA object this backend made (safe to call twice, and after a failed start)."""
        for pointer in self.buffers.values():
            self.cudart.cudaFree(pointer)
        self.buffers = {}
        if self.graph_exec is not None:
            self.cudart.cudaGraphExecDestroy(self.graph_exec)
            self.graph_exec = None
        for event in (self.start_event, self.end_event):
            if event is not None:
                self.cudart.cudaEventDestroy(event)
        self.start_event = self.end_event = None
        if self.stream is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None
