"""An exported ONNX graph as a classifier: ONNX Runtime behind the same call as a PyTorch model."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx
import torch

from edge.check.compare import in_order, ort_session
from edge.errors import EdgeError
from edge.onnx_metadata import metadata_of, preprocessing

T = TypeVar("T")


class OnnxClassifier:
    """Call with a float batch ``[N, C, H, W]``; returns logits as a tensor. Static batches are chunked/padded."""

    def __init__(self, path: str | Path, threads: int | None = None, calls: int = 1,
                 config: Mapping[str, str] | None = None) -> None:
        """``config``: ONNX Runtime session config entries (:func:`~edge.check.compare.ort_session`)."""
        self.path = Path(path)
        self.calls = max(1, calls)
        if not self.path.is_file():
            raise EdgeError(f"{self.path} does not exist", expected="an ONNX file", fix="check the path")
        try:
            proto = onnx.load(str(self.path), load_external_data=False)
        except Exception as e:  # noqa: BLE001 - onnx raises several types for a bad file
            raise EdgeError(f"{self.path} is not a readable ONNX model", found=str(e)[:300],
                            fix="pass a file written by `edge export`") from e
        self.metadata = metadata_of(proto)
        self.session = ort_session(str(self.path), threads, config=config)
        shape = self.session.get_inputs()[0].shape
        self.static_batch = shape[0] if isinstance(shape[0], int) else None
        self.input_name = self.session.get_inputs()[0].name

    def data_config(self) -> dict:
        """The preprocessing recorded in the graph's metadata by ``edge export`` (or by ``edge quantize``/``edge
        clean`` from the input options); a graph from another exporter records none: the caller resolves it from
        the user's ``--input-size``, ``--mean`` and ``--std`` (:func:`edge.precision.calibration.input_spec_of`)."""
        try:
            return preprocessing(self.metadata)
        except KeyError as e:
            raise EdgeError(f"{self.path} records no preprocessing (edge export's metadata: {e.args[0]} missing)",
                            expected="the input size and the per-channel mean and std the model was trained with",
                            fix="pass --input-size, --mean and --std (e.g. --input-size 3x224x224 --mean "
                                "0.485,0.456,0.406 --std 0.229,0.224,0.225: give your model's own), "
                                "or export the model with `edge export`") from e

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        array = x.numpy().astype(np.float32)
        if self.static_batch is None:
            return torch.from_numpy(self.session.run(None, {self.input_name: array})[0])
        outputs = []
        for start in range(0, len(array), self.static_batch):
            chunk = array[start:start + self.static_batch]
            pad = self.static_batch - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), np.float32)])
            outputs.append(self.session.run(None, {self.input_name: chunk})[0][: len(chunk) - pad])
        return torch.from_numpy(np.concatenate(outputs))

    def map(self, items: Iterable[tuple[torch.Tensor, T]]) -> Iterator[tuple[torch.Tensor, T]]:
        """``(self(x), rest)`` for every ``(x, rest)`` of ``items``, in their order; ``calls`` of them at once
        (:func:`~edge.check.compare.in_order`) while the next batches are read."""
        return in_order(lambda item: (self(item[0]), item[1]), items, self.calls)
