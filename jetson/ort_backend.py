"""ONNX Runtime on the device, for ``--backend ort``: the same protocol as TensorRT on the bundle's own
graph, where TensorRT is absent (or to compare). Results say ``"backend": "onnxruntime"`` and the
execution providers used, so they are never mistaken for TensorRT figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jetson.errors import JetsonError

#: ONNX Runtime's type names for the inputs a bundle's graphs take
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
           "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8}


class OrtBackend:
    """An ONNX graph in an ONNX Runtime session (CPU unless other providers are asked for), every
    input filled once with seeded random values (a dynamic batch becomes ``batch``, 1 by default)."""

    name = "onnxruntime"

    def __init__(self, graph: Path, *, precision: str | None = None, batch: int | None = None,
                 threads: int | None = None, providers: tuple[str, ...] = ("CPUExecutionProvider",),
                 seed: int = 0) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise JetsonError("ONNX Runtime was not found (needed by --backend ort)", found=str(e),
                              fix="pip install onnxruntime (on a Jetson: NVIDIA's onnxruntime-gpu wheel for JetPack), "
                                  "or run the TensorRT backend") from e
        self.graph = Path(graph)
        self.precision = precision
        self.version = ort.__version__
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(self.graph), options, providers=list(providers))
        except Exception as e:  # noqa: BLE001 - ORT raises its own types, all meaning "cannot load"
            raise JetsonError(f"ONNX Runtime cannot load {self.graph}", found=str(e)[:400],
                              fix=f"check the graph, and that the providers {', '.join(providers)} exist here") from e
        self.threads = threads or self.session.get_session_options().intra_op_num_threads
        rng = np.random.default_rng(seed)
        self.feed = {}
        self.batch = 1
        for n, meta in enumerate(self.session.get_inputs()):
            shape = [d if isinstance(d, int) else (batch or 1) for d in meta.shape]
            if meta.type not in _DTYPES:
                raise JetsonError(f"input {meta.name} of {self.graph} has type {meta.type}",
                                  expected=f"one of {', '.join(_DTYPES)}")
            self.feed[meta.name] = rng.standard_normal(shape).astype(_DTYPES[meta.type])
            if n == 0 and shape:
                self.batch = shape[0]
        self._weights = self.graph.stat().st_size

    def describe(self) -> dict:
        return {"backend": self.name, "device": "cpu" if self.session.get_providers() == ["CPUExecutionProvider"]
                else ",".join(self.session.get_providers()), "precision": self.precision, "batch": self.batch,
                "threads": self.threads, "model": str(self.graph), "onnxruntime": self.version,
                "providers": self.session.get_providers()}

    def weight_bytes(self) -> int:
        """The graph file's size (weights and structure; the runner has no onnx to count the weights alone)."""
        return self._weights

    def infer(self) -> None:
        self.session.run(None, self.feed)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference on ``feeds`` (the accuracy gate's images), outside the timing: the outputs by name."""
        names = [o.name for o in self.session.get_outputs()]
        unknown = sorted(set(feeds) - set(self.feed))
        if unknown:
            raise JetsonError(f"{self.graph} has no input {unknown[0]!r}", expected=f"inputs {', '.join(self.feed)}",
                              fix="the bundle's gate files do not belong to this graph: make the bundle again")
        typed = {name: np.asarray(value, dtype=self.feed[name].dtype) for name, value in feeds.items()}
        return dict(zip(names, self.session.run(None, typed), strict=True))

    def report(self, warmup: int = 0) -> dict:
        return {}

    def close(self) -> None:
        self.session = None
