"""Where and how to run: device choice, mixed precision, threads, and the hardware and package-version records."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from edge import __version__


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        from edge.errors import EdgeError

        raise EdgeError(f"--device {device} asked for, but torch sees no CUDA GPU",
                        found=f"torch {torch.__version__} (CUDA {torch.version.cuda})", fix="use --device cpu")
    return torch.device(device)


@contextmanager
def computing_on(model: nn.Module,
                 device: torch.device | str | None) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """``model`` on ``device`` for the passes inside the block, back where it was after (also on an error).

    Yields ``put``, which puts a batch where the model is. The parameters move in place, so hooks on the
    model's modules still fire; statistics gathered by them are added to float64 sums on the CPU (each
    accumulator's ``update`` brings its terms home), and every fit and weight change after the block runs on
    the CPU as it would without a GPU: only the passes over the images move. ``device`` None: as it is.
    """
    home = next(model.parameters()).device
    target = torch.device(device) if device is not None else home
    if target == home:
        yield lambda batch: batch
        return
    model.to(target)
    try:
        yield lambda batch: batch.to(target, non_blocking=True)
    finally:
        model.to(home)


def cpu_has_bf16() -> bool:
    """True where the CPU runs bfloat16 matrix products natively (AVX512-BF16 or AMX)."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """``auto``: bf16 on a bf16-capable GPU or CPU, else none. ``bf16``/``fp16``/``off`` force it."""
    if amp == "off":
        return None
    if amp == "bf16":
        return torch.bfloat16
    if amp == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else None


def set_threads(threads: int | None) -> int:
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    """The versions of the packages whose behaviour a step's output depends on (part of every key)."""
    import importlib.metadata

    record = {"edge": __version__}
    for name in ("torch", "timm", "onnx", "onnxruntime", "onnx-graphsurgeon", "numpy"):
        try:
            record[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            record[name] = None
    return record


def hardware(device: torch.device | None = None) -> dict:
    """A record of the machine a figure was measured on."""
    record = {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_bf16": cpu_has_bf16(),
    }
    if device is not None and device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
        record["cuda"] = torch.version.cuda
    return record
