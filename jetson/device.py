"""Which device this is: the board, the Jetson Linux release, the GPU an engine is tied to, and the
record a run's results carry.

``gpu`` and ``compute_capability`` alone do not tell Orin modules apart (all say "Orin", 8.7): the
SM count (Orin Nano 8GB: 8, AGX Orin 64GB: 16), the memory in whole GiB and the device-tree model
do. :data:`IDENTITY` (with the TensorRT version) is what an engine is tied to: the engine cache
keys on it and edge.trt.manifest refuses an engine whose identity differs.

Inside a container the same board reads differently: Docker masks ``/sys/firmware``, and
``/proc/device-tree`` is a link into it, so ``device_model`` is None there. ``container`` (whether the
runner runs in one) is part of the identity, so an engine built inside a container is neither shared
with nor taken from the same board outside one: each builds its own.
"""

from __future__ import annotations

import os
import platform
import re
import socket
from pathlib import Path
from typing import Any

from jetson.cuda import binding_name, check

DEVICE_TREE_MODEL = "/proc/device-tree/model"
NV_TEGRA_RELEASE = "/etc/nv_tegra_release"
#: what an engine is tied to: a difference in any of these refuses it
IDENTITY = ("tensorrt", "gpu", "compute_capability", "sm_count", "memory_gib", "device_model", "container")
CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")  # Docker's, Podman's


def l4t_release(path: str | None = None) -> str | None:
    """The Jetson Linux release ("R36 (release), REVISION: 4.3" -> "36.4.3"), None off a Jetson."""
    try:
        text = Path(path or NV_TEGRA_RELEASE).read_text()
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


def cuda_version(encoded: int) -> str:
    """CUDA's integer version (12060) as text ("12.6")."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def local_runtime_version(cudart: Any) -> str | None:
    """The CUDA runtime library (``libcudart``) on the library path, which TensorRT uses; None if not found."""
    query = getattr(cudart, "getLocalRuntimeVersion", None)
    if query is None:
        return None
    try:
        error, version = query()
    except RuntimeError:  # cuda-python raises when it cannot dlopen libcudart
        return None
    return cuda_version(version) if int(error) == 0 else None


def cuda_identity(cudart: Any, device: int = 0, *, model_path: str | None = None,
                  release_path: str | None = None) -> dict:
    """The GPU (name, compute capability, SM count, memory), the board and the CUDA versions.

    ``cuda_driver`` is the newest CUDA the driver supports; ``cuda_runtime`` is the ``libcudart``
    found on the library path; ``cuda_python_runtime`` is the runtime the binding itself reports
    (cuda-python's own, built in; the same library for the ctypes binding).
    """
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    bundled = check(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    driver = check(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return {"gpu": name, "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": int(props.multiProcessorCount), "memory_gib": round(int(props.totalGlobalMem) / 2**30),
            "memory_bytes": int(props.totalGlobalMem),
            "device_model": device_model(model_path),
            "cuda_driver": cuda_version(driver), "cuda_runtime": local_runtime_version(cudart),
            "cuda_python_runtime": cuda_version(bundled), "l4t": l4t_release(release_path)}


def in_container() -> bool:
    """Whether this process runs in a container (Docker's or Podman's marker file at the root)."""
    return any(os.path.exists(marker) for marker in CONTAINER_MARKERS)


#: why a Jetson (it has an L4T release) may have no readable device-tree model
MASKED_MODEL_NOTE = ("the board's model ({path}) cannot be read: a container masks /sys/firmware (Docker does by "
                     "default). Engines built here record device_model null, so they are not shared with the same "
                     "board outside the container (nor its engines with this container)")


def host_record() -> dict:
    """What every run records, with or without a GPU: the board, L4T, the host, Python and whether it runs
    in a container (where the board's device tree is masked: then ``device_model_note``, :data:`MASKED_MODEL_NOTE`)."""
    record = {"device_model": device_model(), "l4t": l4t_release(), "hostname": socket.gethostname(),
              "machine": platform.machine(), "kernel": platform.release(), "python": platform.python_version(),
              "container": in_container()}
    if record["device_model"] is None and record["l4t"] is not None:
        record["device_model_note"] = MASKED_MODEL_NOTE.format(path=DEVICE_TREE_MODEL)
    return record


def device_record(cudart: Any | None, tensorrt_version: str | None) -> dict:
    """The device a run's results came from: the host record, and with a CUDA runtime the GPU
    identity, the TensorRT version and the binding used (``identity``: the fields of :data:`IDENTITY`)."""
    record: dict[str, Any] = {**host_record(), "tensorrt": tensorrt_version}
    if cudart is not None:
        record.update(cuda_identity(cudart))
        record["cuda_binding"] = binding_name(cudart)
    record["identity"] = {field: record.get(field) for field in IDENTITY}
    return record
