"""Compatibility shims that must run before :mod:`timm` is imported.

timm imports torchvision. On machines where the only torchvision wheel that matches
the installed CPU build of torch is a CUDA build, torchvision's C extension cannot
load, and its Python side then crashes at import with
``RuntimeError: operator torchvision::nms does not exist`` because it registers fake
kernels for ``torchvision::nms`` / ``torchvision::qnms`` without checking that the
operators were defined.

:func:`ensure_torchvision_importable` defines those two operator schemas when, and only
when, torchvision is installed but its operators are missing. Where torchvision's
extension loads normally (users' machines, Jetsons) it does nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_done = False
_shimmed = False


def _torchvision_ops_missing() -> bool:
    """True when torchvision is installed and its operators can be neither found nor loaded.

    Before ``import torchvision`` its operators are missing everywhere: the probe loads its extension
    (``_C``) the way torchvision itself does, and only where that fails (a CUDA wheel beside a CPU
    torch) are the operators missing. Defining the schemas where the extension does load would make
    its own registration abort the process (a duplicate definition; seen with torch 2.11 + CUDA)."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        return False
    if _has_nms(torch):
        return False
    for folder in spec.submodule_search_locations or ():
        for library in sorted(Path(folder).glob("_C.*")):
            if library.suffix not in (".so", ".pyd"):
                continue
            try:
                torch.ops.load_library(str(library))
            except (OSError, RuntimeError):
                return True
            return not _has_nms(torch)
    return True


def _has_nms(torch) -> bool:
    try:
        torch.ops.torchvision.nms  # noqa: B018  (attribute access is the probe)
    except (AttributeError, RuntimeError):
        return False
    return True


def ensure_torchvision_importable() -> bool:
    """Make ``import torchvision`` (and so ``import timm``) work; return True if a shim was installed."""
    global _done, _shimmed
    if _done:
        return False
    _done = True
    import sys

    if "torchvision" in sys.modules or not _torchvision_ops_missing():
        return False
    import torch

    for name, schema in _SCHEMAS.items():
        torch.library.define(f"torchvision::{name}", schema)
    _shimmed = True
    return True


def shim_installed() -> bool:
    """Whether this process runs torchvision on the shim (whichever call installed it)."""
    return _shimmed
