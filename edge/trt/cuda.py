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

import re
from pathlib import Path
from types import ModuleType

from edge.errors import EdgeError

CUDA_HINT = ("install NVIDIA's cuda-python of your CUDA's major version: `pip install 'cuda-python>=12.6,<13'` on "
             "JetPack 6 (CUDA 12.6, what `pip install edge[device]` picks), `pip install 'cuda-python>=13,<14'` on "
             "JetPack 7 (CUDA 13)")


#: the board's name on a Jetson (Linux device tree)
DEVICE_TREE_MODEL = "/proc/device-tree/model"


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


def l4t_release(path: str = "/etc/nv_tegra_release") -> str | None:
    """The Jetson Linux release ("R36 (release), REVISION: 4.3" -> "36.4.3"), None off a Jetson."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    match = re.search(r"R(\d+) \(release\), REVISION: ([\d.]+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else text.strip()[:80]


def device_model(path: str | None = None) -> str | None:
    """The board ("NVIDIA Jetson Orin Nano Developer Kit"), None where there is no device tree (x86)."""
    try:
        return Path(path or DEVICE_TREE_MODEL).read_bytes().rstrip(b"\x00").decode(errors="replace").strip() or None
    except OSError:
        return None


def _version(encoded: int) -> str:
    """CUDA's integer version (12060) as text ("12.6")."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def local_runtime_version(cudart: ModuleType) -> str | None:
    """The CUDA runtime library (``libcudart``) on the library path, which TensorRT uses; None if not found."""
    query = getattr(cudart, "getLocalRuntimeVersion", None)
    if query is None:
        return None
    try:
        error, version = query()
    except RuntimeError:  # cuda-python raises when it cannot dlopen libcudart
        return None
    return _version(version) if int(error) == 0 else None


def device_identity(cudart: ModuleType | None = None, device: int = 0) -> dict:
    """What an engine is tied to (GPU, compute capability, SM count, memory, board) and the CUDA versions.

    ``gpu`` and ``compute_capability`` alone do not tell Orin modules apart (all say "Orin", 8.7):
    the SM count (Orin Nano 8GB: 8, AGX Orin 64GB: 16), the memory in whole GiB and the device-tree
    model do. ``cuda_driver`` is the newest CUDA the driver supports; ``cuda_runtime`` is the
    ``libcudart`` found on the library path; ``cuda_python_runtime`` is the runtime built into cuda-python.
    """
    cudart = cudart or load_cudart()
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    bundled = check(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    driver = check(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return {"gpu": name, "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": int(props.multiProcessorCount), "memory_gib": round(int(props.totalGlobalMem) / 2**30),
            "memory_bytes": int(props.totalGlobalMem), "device_model": device_model(),
            "cuda_driver": _version(driver), "cuda_runtime": local_runtime_version(cudart),
            "cuda_python_runtime": _version(bundled), "l4t": l4t_release()}
