"""Inference backends the profiler times. Each prepares once, then runs one synchronous inference per call.

A backend is any object with ``name``, ``describe() -> dict``, ``weight_bytes() -> int``,
``infer() -> None`` (one complete, synchronous inference on its prepared input) and
``close()``. The TensorRT backend (on the Jetson) implements the same four methods.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:   # torch only where a TorchBackend is made: a process timing ONNX graphs never imports it
    import torch
    from torch import nn


class Backend(Protocol):
    name: str

    def describe(self) -> dict: ...

    def weight_bytes(self) -> int: ...

    def infer(self) -> None: ...

    def close(self) -> None: ...


def tensor_bytes(tensor) -> int:
    """Bytes of an ONNX tensor's values as stored: by its element type (float16 2, int8 1, 4-bit types half a byte)."""
    import onnx

    count = int(np.prod(tensor.dims))
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1):
        return (count + 1) // 2
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


class OrtBackend:
    """ONNX Runtime on the CPU, with all graph optimisations."""

    name = "onnxruntime"

    def __init__(self, path: str | Path, batch: int | None = None, threads: int | None = None, seed: int = 0,
                 spinning: bool = True) -> None:
        import onnx
        import onnxruntime as ort

        from edge.check.compare import ort_session
        from edge.onnx_metadata import metadata_of

        self.path = Path(path)
        self.session = ort_session(str(self.path), threads, spinning)
        meta = self.session.get_inputs()[0]
        shape = [d if isinstance(d, int) else (batch or 1) for d in meta.shape]
        if batch and isinstance(meta.shape[0], int) and meta.shape[0] != batch:
            from edge.errors import EdgeError

            raise EdgeError(f"{self.path} has a static batch of {meta.shape[0]}, --batch {batch} asked for",
                            fix=f"re-export with --batch {batch} or --dynamic-batch")
        self.batch = shape[0]
        self.threads = threads
        self.feed = {meta.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
        proto = onnx.load(str(self.path), load_external_data=False)
        self.metadata = metadata_of(proto)
        self._weights = sum(tensor_bytes(t) for t in proto.graph.initializer)
        self.version = ort.__version__

    def describe(self) -> dict:
        from edge.onnx_metadata import precision_of

        return {"backend": self.name, "device": "cpu", "precision": precision_of(self.metadata),
                "batch": self.batch, "threads": self.threads or self.session.get_session_options().intra_op_num_threads,
                "model": str(self.path), "onnxruntime": self.version}

    def weight_bytes(self) -> int:
        return self._weights

    def infer(self) -> None:
        self.session.run(None, self.feed)

    def close(self) -> None:
        self.session = None


class TorchBackend:
    """PyTorch eager inference (CPU, or CUDA with synchronisation after each call)."""

    name = "torch"

    def __init__(self, model: nn.Module, input_size: tuple[int, int, int], batch: int = 1,
                 device: torch.device | str = "cpu", threads: int | None = None, seed: int = 0) -> None:
        import torch

        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.batch = batch
        self.threads = threads or torch.get_num_threads()
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(batch, *input_size, generator=generator).to(self.device)

    def describe(self) -> dict:
        import torch

        return {"backend": self.name, "device": str(self.device), "precision": "float32", "batch": self.batch,
                "threads": self.threads, "torch": torch.__version__}

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def infer(self) -> None:
        import torch

        with torch.no_grad():
            self.model(self.x)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.model = None
