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

_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_done = False


def _torchvision_ops_missing() -> bool:
    import torch

    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        torch.ops.torchvision.nms  # noqa: B018  (attribute access is the probe)
    except (AttributeError, RuntimeError):
        return True
    return False


def ensure_torchvision_importable() -> bool:
    """Make ``import torchvision`` (and so ``import timm``) work; return True if a shim was installed."""
    global _done
    if _done:
        return False
    _done = True
    import sys

    if "torchvision" in sys.modules or not _torchvision_ops_missing():
        return False
    import torch

    for name, schema in _SCHEMAS.items():
        torch.library.define(f"torchvision::{name}", schema)
    return True
