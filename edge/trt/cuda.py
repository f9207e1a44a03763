"""The CUDA runtime through cuda-python (NVIDIA's official bindings), imported lazily.

Why cuda-python rather than pycuda (both exist on Jetson): it is NVIDIA's maintained binding
(TensorRT's own Python samples moved to it), installs from a wheel on aarch64 and x86 without
compiling against the toolkit, maps 1:1 onto the CUDA runtime API (streams, events, graph
capture, ``cudaMallocAsync``) with no implicit context (pycuda's ``autoinit`` creates a driver
context that must be kept alive and popped in the right order), and returns plain integer
handles, which is what ``set_tensor_address`` and ``execute_async_v3`` take.

cuda-python's major version must match the CUDA the driver supports: 12.x on JetPack 6 (CUDA
12.6), 13.x on JetPack 7 (CUDA 13). Its ``cudaRuntimeGetVersion`` reports the runtime linked
into cuda-python itself, not the ``libcudart`` that TensorRT loads: the identity records both,
and the driver's CUDA version, under names that say which is which.
"""

from __future__ import annotations

from types import ModuleType

from edge.errors import EdgeError
from jetson.device import DEVICE_TREE_MODEL, cuda_identity, device_model, l4t_release
from jetson.errors import JetsonError

__all__ = ["CUDA_HINT", "DEVICE_TREE_MODEL", "check", "device_identity", "device_model", "l4t_release", "load_cudart"]

CUDA_HINT = ("install NVIDIA's cuda-python of your CUDA's major version: `pip install 'cuda-python>=12.6,<13'` on "
             "JetPack 6 (CUDA 12.6, what `pip install edge[device]` picks), `pip install 'cuda-python>=13,<14'` on "
             "JetPack 7 (CUDA 13)")


def load_cudart() -> ModuleType:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6 layout
        except ImportError as e:
            raise EdgeError("cuda-python was not found (needed to run TensorRT engines)", found=str(e),
                            fix=CUDA_HINT) from e
    return cudart


def check(result: tuple, what: str):
    """cuda-python returns ``(error, *values)``; raise on an error, return the value(s)."""
    error, *values = result
    if int(error) != 0:
        name = getattr(error, "name", str(error))  # cuda-python's errors are IntEnums: str() is only the number
        fix = ("check the GPU and driver (nvidia-smi or tegrastats), and that no other process holds all device "
               "memory")
        if name == "cudaErrorInsufficientDriver":
            fix = f"this cuda-python needs a newer CUDA driver than the device has: {CUDA_HINT}"
        raise EdgeError(f"CUDA call {what} failed", found=f"{name} ({int(error)})", fix=fix)
    return values[0] if len(values) == 1 else tuple(values)


def device_identity(cudart: ModuleType | None = None, device: int = 0) -> dict:
    """What an engine is tied to (GPU, compute capability, SM count, memory, board) and the CUDA
    versions: :func:`jetson.device.cuda_identity` (shared with the device runner) on cuda-python."""
    try:
        return cuda_identity(cudart or load_cudart(), device, model_path=DEVICE_TREE_MODEL)
    except JetsonError as e:
        raise EdgeError(e.what, expected=e.expected, found=e.found, fix=e.fix) from e
