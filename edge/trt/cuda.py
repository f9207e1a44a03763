"""The CUDA runtime through cuda-python (NVIDIA's official bindings), imported lazily.

Why cuda-python rather than pycuda (both exist on Jetson): it is NVIDIA's maintained binding
(TensorRT's own Python samples moved to it), installs from a wheel on aarch64 and x86 without
compiling against the toolkit, maps 1:1 onto the CUDA runtime API (streams, events, graph
capture, ``cudaMallocAsync``) with no implicit context (pycuda's ``autoinit`` creates a driver
context that must be kept alive and popped in the right order), and returns plain integer
handles, which is what ``set_tensor_address`` and ``execute_async_v3`` take.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

from edge.errors import EdgeError

CUDA_HINT = ("install NVIDIA's cuda-python matching your CUDA: `pip install 'cuda-python>=12.6,<13'` on JetPack 6 "
             "(CUDA 12.6), `cuda-python>=13` on JetPack 7 / CUDA 13")


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
        raise EdgeError(f"CUDA call {what} failed", found=str(error), fix="check the GPU and driver (nvidia-smi or "
                        "tegrastats), and that no other process holds all device memory")
    return values[0] if len(values) == 1 else tuple(values)


def l4t_release(path: str = "/etc/nv_tegra_release") -> str | None:
    """The Jetson Linux release ("R36 (release), REVISION: 4.3" -> "36.4.3"), None off a Jetson."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    match = re.search(r"R(\d+) \(release\), REVISION: ([\d.]+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else text.strip()[:80]


def device_identity(cudart: ModuleType | None = None, device: int = 0) -> dict:
    """GPU name, compute capability, CUDA runtime and driver versions, L4T release."""
    cudart = cudart or load_cudart()
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    runtime = check(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    driver = check(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return {"gpu": name, "compute_capability": f"{props.major}.{props.minor}",
            "cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
            "cuda_driver": f"{driver // 1000}.{driver % 1000 // 10}", "l4t": l4t_release()}
