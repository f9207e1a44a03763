"""The import contracts (.importlinter) hold, and a new cycle or upward import breaks them.

``scripts/test.sh`` runs ``lint-imports`` before pytest; these tests show the contracts are not
vacuous: the same check on a copy of the sources with one deliberate import added fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (scripts/setup.sh does it)")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, env=env, timeout=300)


def test_the_import_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    contracts = (ROOT / ".importlinter").read_text().count("[importlinter:contract:")
    assert "BROKEN" not in result.stdout and f"{contracts} kept, 0 broken" in result.stdout


@pytest.mark.parametrize("file, line, broken", [
    # a model zoo that reaches for compression: a cycle between edge.models and edge.compress, and upward
    ("edge/models/info.py", "import edge.compress.registry", ["No import cycles", "Layers of edge"]),
    # the method interface importing the registry that imports it: a cycle inside edge.compress
    ("edge/compress/method.py", "import edge.compress.registry", ["No import cycles", "Compression: registry"]),
    # a graph pass that loads torch
    ("edge/graph/passes/fold_constants.py", "import torch", ["Graph passes and ONNX helpers"]),
    # a bundle that reads a pipeline run folder's layout again (allowed by the layers, refused by its own contract)
    ("edge/bundle/__init__.py", "import edge.pipeline.layout", ["Bundle and deploy know no main-job folder"]),
    # the one training loop reaching for one of its tasks (the distillation)
    ("edge/train/loop.py", "import edge.train.distillation", ["Training: one loop"]),
    # one method's part reaching into another method's folder, or into the registry
    ("edge/compress/methods/dwconv/build.py", "import edge.compress.methods.wpac.module", ["A method is one folder"]),
    ("edge/compress/methods/dwconv/kernels.py", "import edge.compress.registry", ["Only a method's method.py"]),
    # the planner reaching past the registry into a method
    ("edge/planner/search.py", "import edge.compress.methods.dwconv.module", ["The planner and the CLI"]),
])
def test_a_deliberate_cycle_or_upward_import_breaks_the_contracts(tmp_path, file, line, broken):
    for package in ("edge", "calib", "jetson"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "weights",
                                                                                        "fmnist_mini"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    assert lint(tmp_path).returncode == 0   # the copy is as clean as the tree
    target = tmp_path / file
    target.write_text(target.read_text() + f"\n{line}  # deliberate\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    verdicts = [re.sub(r" \(\d+ ignored imports?\)$", "", ln) for ln in result.stdout.splitlines()]
    verdicts = [ln for ln in verdicts if ln.endswith((" KEPT", " BROKEN"))]
    assert len(verdicts) == (ROOT / ".importlinter").read_text().count("[importlinter:contract:"), result.stdout
    for name in broken:   # at least these (an import can break others through the chains it opens)
        assert any(v.startswith(name) and v.endswith(" BROKEN") for v in verdicts), (name, result.stdout[-3000:])


# tests of the whole tree, not one module, and of the tests' own launcher (tests/launch.py)
CROSS_CUTTING = {"test_design.py", "test_docker.py", "test_golden.py", "test_launch.py", "test_layers.py",
                 "test_own_model.py", "test_readme.py"}


def test_tests_mirror_the_package_tree():
    tests = ROOT / "tests"
    for path in tests.rglob("test_*.py"):
        folder = path.parent.relative_to(tests)
        if folder == Path("."):
            assert path.name in CROSS_CUTTING, f"{path.name} tests one module: move it under tests/edge/..."
        else:
            assert (ROOT / folder / "__init__.py").is_file(), f"{path}: {folder} is not a package of the tree"
