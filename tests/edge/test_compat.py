"""edge/_compat.py: the torchvision shim acts only where torchvision's extension cannot load.

Each case runs in a fresh interpreter (operator schemas cannot be undefined) with a stand-in
``torchvision`` package first on ``sys.path`` and ``torch.ops.load_library`` replaced by what the
real extension does on each kind of machine: where it loads (a CUDA torch with its own torchvision,
as on the GPU machine this was found on) it defines ``torchvision::nms`` itself, and the shim must
not define it first (torch aborts the process on the duplicate); where it cannot (a CUDA torchvision
beside the CPU torch of this project's machines) loading raises OSError and the shim defines it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import pathlib, sys, tempfile
    import torch

    folder = pathlib.Path(tempfile.mkdtemp())
    (folder / "torchvision").mkdir()
    (folder / "torchvision" / "__init__.py").write_text("")
    (folder / "torchvision" / "_C.so").write_bytes(b"")
    sys.path.insert(0, str(folder))
    loads = []

    def load_library(path):
        loads.append(path)
        if {loads!r}:
            torch.library.define("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        else:
            raise OSError("_C.so: undefined symbol: _ZN3c10 (a CUDA build beside a CPU torch)")

    torch.ops.load_library = load_library
    from edge._compat import ensure_torchvision_importable

    print(ensure_torchvision_importable(), len(loads), hasattr(torch.ops.torchvision, "nms"))
""")


@pytest.mark.parametrize("loads, expected", [(True, "False 1 True"), (False, "True 1 True")],
                         ids=["extension-loads", "extension-cannot-load"])
def test_the_shim_defines_the_operators_only_where_the_extension_cannot_load(loads, expected):
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(loads=loads)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == expected
