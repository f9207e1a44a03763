"""``edge info``: versions and hardware this installation runs with."""

from __future__ import annotations

from edge.cli.common import add_command, emit

EXAMPLES = """  edge info
  edge info --json"""


def register(subparsers) -> None:
    add_command(subparsers, "info", "show versions of torch, timm, ONNX, ONNX Runtime, TensorRT and the hardware",
                "TensorRT, CUDA and a GPU are reported as absent where this machine has none (TensorRT runs\n"
                "on the Jetson); --json gives null for them.",
                EXAMPLES).set_defaults(run=run)


#: What the human summary says for a value that is null in the JSON (default: "not installed").
ABSENT = {"tensorrt": "not installed (it runs on the Jetson)", "cuda": "none (a CPU build of torch)",
          "gpu": "none", "cpu_bf16": "unknown"}


def _version(module: str) -> str | None:
    import importlib
    import importlib.metadata

    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a broken optional install is reported as absent
        return None
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(module.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    return str(version)


def collect() -> dict:
    import os

    import torch

    from edge import __version__
    from edge._compat import ensure_torchvision_importable, shim_installed
    from edge.runtime import cpu_has_bf16, cpu_name

    ensure_torchvision_importable()
    shimmed = shim_installed()
    cuda = torch.cuda.is_available()
    return {
        "edge": __version__,
        "torch": torch.__version__,
        "timm": _version("timm"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "onnx_graphsurgeon": _version("onnx_graphsurgeon"),
        "tensorrt": _version("tensorrt"),
        "cuda_available": cuda,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_bf16": cpu_has_bf16(),
        "torchvision_shim": shimmed,
    }


def run(args) -> int:
    info = collect()
    width = max(len(k) for k in info)
    emit(info, args.json, "\n".join(f"{k:<{width}}  {ABSENT.get(k, 'not installed') if v is None else v}"
                                     for k, v in info.items()))
    return 0
