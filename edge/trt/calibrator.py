"""The legacy TensorRT INT8 calibrator (``IInt8EntropyCalibrator2``), for TensorRT 10.x users who ask for it.

Deprecated since TensorRT 10.1 and removed in 11: explicit Q/DQ (``calib.qdq``) is the path
that works everywhere. This class exists only where the installed TensorRT still has the base
class; :func:`make_entropy_calibrator` says so clearly otherwise. Batches go to the GPU through
cuda-python; the calibration cache is read and written so a rebuild skips calibration.

TensorRT 10 reads each batch at the network input's shape (its batch dimension, or the
calibration profile's opt shape for a dynamic batch): ``get_batch_size`` is a leftover of
implicit batch. So the batch is that shape's first dimension, never a constant of ours.

It takes the images as an array: which images and how they are preprocessed is the caller's
business (``edge build`` passes ``edge.precision.calibration.calibration_images``), so ``edge.trt``
never reads a data set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge.errors import EdgeError
from edge.trt.features import load_tensorrt


def make_entropy_calibrator(images: np.ndarray, cache_file: str | Path, shape: list[int] | tuple[int, ...]):
    """An ``IInt8EntropyCalibrator2`` over ``images`` (float32 NCHW) in batches of the input ``shape``.

    ``shape`` is the network input's shape TensorRT calibrates at (batch first); each image must
    hold as many values as one sample of it. Images left over after the last full batch are not used.
    """
    shape = [int(d) for d in shape]
    batch, sample = shape[0], int(np.prod(shape[1:]))
    if images.ndim < 2 or int(np.prod(images.shape[1:])) != sample:
        raise EdgeError(f"calibration images of shape {list(images.shape)} do not fit the network input {shape}",
                        expected=f"images of {sample} values each",
                        fix="calibrate on the data the model was trained on")
    if len(images) < batch:
        raise EdgeError(f"--samples {len(images)} is fewer than one calibration batch ({batch}, the input's batch)",
                        fix=f"pass --samples {batch} or more, or calibrate at a smaller --opt-batch")
    load_tensorrt()
    import tensorrt as trt

    if not hasattr(trt, "IInt8EntropyCalibrator2"):
        raise EdgeError(f"TensorRT {trt.__version__} has no IInt8EntropyCalibrator2 (removed in TensorRT 11)",
                        fix="quantize explicitly: edge quantize MODEL.onnx --precision int8 ...")
    from edge.trt.cuda import check, load_cudart

    cudart = load_cudart()

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.images = np.ascontiguousarray(images, dtype=np.float32).reshape(len(images), *shape[1:])
            self.batch = batch
            self.cache_file = Path(cache_file)
            self.position = 0
            self.device = check(cudart.cudaMalloc(self.images[: self.batch].nbytes), "cudaMalloc")

        def get_batch_size(self) -> int:  # deprecated, still abstract in 10.x: the input's batch
            return self.batch

        def get_batch(self, names: list[str]) -> list[int]:
            if self.position + self.batch > len(self.images):
                return []  # no more batches: TensorRT stops calibrating
            chunk = np.ascontiguousarray(self.images[self.position:self.position + self.batch])
            self.position += self.batch
            check(cudart.cudaMemcpy(self.device, chunk.ctypes.data, chunk.nbytes,
                                    cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
            return [int(self.device)]

        def read_calibration_cache(self) -> bytes | None:
            return self.cache_file.read_bytes() if self.cache_file.is_file() else None

        def write_calibration_cache(self, cache) -> None:
            from edge.fileio import write_atomic

            write_atomic(bytes(cache), self.cache_file)

        def __del__(self) -> None:
            if getattr(self, "device", None):
                cudart.cudaFree(self.device)

    return EntropyCalibrator()
