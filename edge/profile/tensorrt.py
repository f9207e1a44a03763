"""TensorRT backend for ``edge profile`` (on the Jetson): same four methods as the ONNX Runtime backend.

* deserialises an engine written by ``edge build`` and refuses it when its manifest names
  another TensorRT version or device (engines are not portable); TensorRT's own plugins and
  the plugin libraries the manifest names are registered first, as at build time;
* binds every I/O tensor with ``set_tensor_address`` and runs ``execute_async_v3`` on its own
  CUDA stream (cuda-python: see ``edge.trt.cuda`` for why not pycuda);
* each ``infer()`` is one complete inference (enqueue, then synchronise) timed on the GPU with
  CUDA events as well as on the host; ``cuda_graph=True`` captures the enqueue once and replays
  the graph (what trtexec's ``--useCudaGraph`` does);
* ``report()`` adds the GPU-event percentiles, device memory (the engine's activation memory
  and weights) and per-layer times from a separate run with an ``IProfiler`` attached (a
  profiler serialises the layers, so its run is never the timed one).

``import tensorrt`` happens only when a backend is made, so ``import edge`` needs no TensorRT.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge.errors import EdgeError
from edge.profile.stats import latency_stats
from edge.trt.dims import dims_list
from edge.trt.features import detect_features, load_tensorrt
from edge.trt.manifest import check_compatible, read_manifest

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


class TensorRTBackend:
    """A TensorRT engine on the GPU, one CUDA stream, inputs filled once with seeded random values."""

    name = "tensorrt"

    def __init__(self, engine_path: str | Path, batch: int | None = None, cuda_graph: bool = False,
                 layer_runs: int = 20, seed: int = 0, check_manifest: bool = True) -> None:
        load_tensorrt()
        import tensorrt as trt

        from edge.trt.cuda import check, device_identity, load_cudart

        self.path = Path(engine_path)
        if not self.path.is_file():
            raise EdgeError(f"{self.path} does not exist", expected="an engine written by `edge build`",
                            fix="build one on this device: edge build MODEL.onnx --out MODEL.engine")
        self.cudart = load_cudart()
        self.check = check
        self.manifest = read_manifest(self.path)
        self.identity = {"tensorrt": trt.__version__, **device_identity(self.cudart)}
        if check_manifest:
            check_compatible(self.path, self.manifest, self.identity)
        self.features = detect_features(trt)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.plugins = self._load_plugins(trt)
        self.engine = self.runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self.engine is None:
            raise EdgeError(f"TensorRT could not deserialise {self.path}", found="see TensorRT's log above",
                            fix="rebuild the engine on this device with `edge build`")
        self.context = self.engine.create_execution_context()
        self.stream = check(self.cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.start_event = check(self.cudart.cudaEventCreate(), "cudaEventCreate")
        self.end_event = check(self.cudart.cudaEventCreate(), "cudaEventCreate")
        self.layer_runs = layer_runs
        self.gpu_ms: list[float] = []
        self.buffers: dict[str, int] = {}
        self.io: dict[str, dict] = {}
        self.batch = self._bind(trt, batch, seed)
        self.graph_exec = self._capture() if cuda_graph else None

    def _load_plugins(self, trt) -> list[str]:
        """TensorRT's plugins and the libraries the engine was built with: it does not deserialise without them."""
        trt.init_libnvinfer_plugins(self.logger, "")
        libraries = [str(p) for p in self.manifest.get("plugins", [])]
        for path in libraries:
            if not Path(path).is_file():
                raise EdgeError(f"{self.path} was built with the plugin library {path}, which does not exist here",
                                expected="the plugin libraries named in the manifest's \"plugins\"",
                                fix=f"put {Path(path).name} back at {path}, or rebuild the engine with `edge build "
                                    "--plugin PATH`")
            self.runtime.get_plugin_registry().load_library(path)
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
                    raise EdgeError(f"batch {batch} is outside the engine's optimisation profile for input {name}",
                                    fix="rebuild with --min-batch/--opt-batch/--max-batch covering it")
            if not is_input:
                shape = dims_list(self.context.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            nbytes = int(np.prod(shape)) * dtype.itemsize
            self.buffers[name] = self.check(self.cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc")
            if is_input:
                host = np.ascontiguousarray(rng.standard_normal(shape).astype(dtype))
                self.check(self.cudart.cudaMemcpy(self.buffers[name], host.ctypes.data, nbytes,
                                                  self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
                engine_batch = shape[0] if shape else 1
            self.context.set_tensor_address(name, int(self.buffers[name]))
            self.io[name] = {"io": "input" if is_input else "output", "shape": shape, "dtype": str(dtype)}
        return engine_batch

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(int(self.stream)):
            raise EdgeError(f"execute_async_v3 failed on {self.path}", found="see TensorRT's log above")

    def _capture(self):
        """Capture one enqueue as a CUDA graph (after a warm-up run, as TensorRT requires)."""
        cudart = self.cudart
        self._enqueue()
        self.check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self.check(cudart.cudaStreamBeginCapture(self.stream, mode), "cudaStreamBeginCapture")
        self._enqueue()
        graph = self.check(cudart.cudaStreamEndCapture(self.stream), "cudaStreamEndCapture")
        try:
            return self.check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        finally:
            cudart.cudaGraphDestroy(graph)  # the executable graph does not need its template

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.identity.get("gpu"), "precision": self.manifest.get("precision"),
                "batch": self.batch, "threads": None, "model": str(self.path), "tensorrt": self.identity["tensorrt"],
                "cuda_graph": self.graph_exec is not None, "strongly_typed": self.manifest.get("strongly_typed")}

    def weight_bytes(self) -> int:
        """The engine's serialised size: weights plus kernels (TensorRT reports no weight-only figure)."""
        return int(self.path.stat().st_size)

    def infer(self) -> None:
        cudart = self.cudart
        self.check(cudart.cudaEventRecord(self.start_event, self.stream), "cudaEventRecord")
        if self.graph_exec is not None:
            self.check(cudart.cudaGraphLaunch(self.graph_exec, self.stream), "cudaGraphLaunch")
        else:
            self._enqueue()
        self.check(cudart.cudaEventRecord(self.end_event, self.stream), "cudaEventRecord")
        self.check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        self.gpu_ms.append(float(self.check(cudart.cudaEventElapsedTime(self.start_event, self.end_event),
                                            "cudaEventElapsedTime")))

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
            self.check(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return layer_table(times, self.layer_runs)

    def report(self, warmup: int = 0) -> dict:
        """What the host-clock profile cannot see: GPU-event percentiles, device memory, per-layer times."""
        measured = self.gpu_ms[warmup:] if len(self.gpu_ms) > warmup else self.gpu_ms
        return {"gpu_latency": latency_stats(measured, self.batch), "gpu_clock": "CUDA events on the stream",
                "device_memory": self.device_memory(), "layers": self.layer_times() if self.layer_runs else [],
                "manifest": {k: self.manifest.get(k) for k in ("onnx", "runtime", "precision", "build_seconds")}}

    def close(self) -> None:
        for pointer in self.buffers.values():
            self.cudart.cudaFree(pointer)
        self.buffers = {}
        if self.graph_exec is not None:
            self.cudart.cudaGraphExecDestroy(self.graph_exec)
            self.graph_exec = None
        for event in (self.start_event, self.end_event):
            self.cudart.cudaEventDestroy(event)
        self.cudart.cudaStreamDestroy(self.stream)
