"""TensorRT backend for ``edge profile`` (on the Jetson): same four methods as the ONNX Runtime backend.

The execution (plugins, buffers, stream, CUDA events, CUDA graph, layer profiler) is the device
runner's, :class:`jetson.trt_backend.TensorRTEngineBackend`; this backend adds what ``edge build``
engines carry: it refuses an engine whose manifest names another TensorRT version or device
(engines are not portable), registers the plugin libraries the manifest names and reports the
manifest. CUDA comes from cuda-python (``edge.trt.cuda``).

``import tensorrt`` happens only when a backend is made, so ``import edge`` needs no TensorRT.
"""

from __future__ import annotations

from pathlib import Path

from edge.errors import EdgeError
from edge.trt.features import load_tensorrt
from edge.trt.manifest import check_compatible, read_manifest
from jetson.errors import JetsonError
from jetson.trt_backend import TensorRTEngineBackend, layer_table

__all__ = ["TensorRTBackend", "layer_table"]


class TensorRTBackend(TensorRTEngineBackend):
    """An engine written by ``edge build``, checked against its manifest, on the GPU."""

    def __init__(self, engine_path: str | Path, batch: int | None = None, cuda_graph: bool = False,
                 layer_runs: int = 20, seed: int = 0, check_manifest: bool = True) -> None:
        self.path = Path(engine_path)
        if not self.path.is_file():  # before TensorRT is looked for: a missing file is the first thing to say
            raise EdgeError(f"{self.path} does not exist", expected="an engine written by `edge build`",
                            fix="build one on this device: edge build MODEL.onnx --out MODEL.engine")
        trt = load_tensorrt()
        from edge.trt.cuda import device_identity, load_cudart

        cudart = load_cudart()
        self.manifest = read_manifest(self.path)
        self.identity = {"tensorrt": trt.__version__, **device_identity(cudart)}
        if check_manifest:
            check_compatible(self.path, self.manifest, self.identity)
        plugins = [str(p) for p in self.manifest.get("plugins", [])]
        missing = next((p for p in plugins if not Path(p).is_file()), None)
        if missing:
            raise EdgeError(f"{self.path} was built with the plugin library {missing}, which does not exist here",
                            expected="the plugin libraries named in the manifest's \"plugins\"",
                            fix=f"put {Path(missing).name} back at {missing}, or rebuild the engine with `edge build "
                                "--plugin PATH`")
        try:
            super().__init__(self.path.read_bytes(), cudart, label=str(self.path), plugins=plugins, batch=batch,
                             cuda_graph=cuda_graph, layer_runs=layer_runs, seed=seed,
                             precision=self.manifest.get("precision"), device=self.identity.get("gpu"))
        except JetsonError as e:
            raise EdgeError(e.what, expected=e.expected, found=e.found,
                            fix=(e.fix or "").replace("rebuild the engine on this device",
                                                      "rebuild the engine on this device with `edge build`")
                            or None) from e

    def describe(self) -> dict:
        return {**super().describe(), "strongly_typed": self.manifest.get("strongly_typed")}

    def report(self, warmup: int = 0) -> dict:
        return {**super().report(warmup),
                "manifest": {k: self.manifest.get(k) for k in ("onnx", "runtime", "precision", "build_seconds")}}
