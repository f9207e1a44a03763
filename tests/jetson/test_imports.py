"""The device side imports nothing but the standard library and numpy: it is copied into bundles
and run by a stock JetPack's Python, where edge, torch and onnx are absent."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter: import every module of the package and list the top-level packages that
# the imports brought in (what the interpreter had loaded at start-up does not count).
LIST_IMPORTS = """
import sys
before = set(sys.modules)
import importlib, json, pkgutil, jetson
names = sorted("jetson." + m.name for m in pkgutil.iter_modules(jetson.__path__))
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "imported": sorted({m.split(".")[0] for m in set(sys.modules) - before})}))
"""


def cython(name: str) -> bool:
    """The runtime that Cython-built extensions register as modules: JetPack 6's numpy 1.21 adds
    `cython_runtime` and `_cython_0_29_24` (no package is imported)."""
    return name == "cython_runtime" or name.startswith("_cython_")


def test_every_jetson_module_imports_only_the_standard_library_and_numpy():
    done = subprocess.run([sys.executable, "-c", LIST_IMPORTS], cwd=REPO, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert {"jetson.__main__", "jetson.bundle", "jetson.cuda", "jetson.cudart", "jetson.device", "jetson.energy",
            "jetson.engine", "jetson.errors", "jetson.features", "jetson.ort_backend", "jetson.power", "jetson.runner",
            "jetson.run_options", "jetson.run_log", "jetson.run_results", "jetson.backends",
            "jetson.sampler", "jetson.stats", "jetson.tegrastats", "jetson.trt_backend", "jetson.trtexec",
            "jetson.trt_log", "jetson.archive"} <= set(found["modules"])
    outside = [name for name in found["imported"]
               if name not in sys.stdlib_module_names and name not in ("jetson", "numpy") and not cython(name)]
    assert outside == [], f"jetson imports {outside}"
    assert "numpy" in found["imported"]


def test_without_numpy_jetson_check_says_so_and_the_runner_refuses_naming_it(bundle, tmp_path):
    """numpy is the device side's one dependency outside the standard library: `python3 -m jetson check` must be
    able to report it missing (decided for issue 43: the device side imports numpy where it is used), and the
    runner refuses with the fix instead of a traceback."""
    hidden = tmp_path / "hidden" / "numpy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("No module named \'numpy\' (hidden by the test)")\n')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{hidden.parent}{os.pathsep}{REPO}"}
    done = subprocess.run([sys.executable, "-m", "jetson", "check", "--backend", "ort", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr
    numpy = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "numpy")
    assert numpy["status"] == "fail" and "python3-numpy" in numpy["fix"]
    done = subprocess.run([sys.executable, "-m", "jetson", "run", "--bundle", str(bundle), "--backend", "ort"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in done.stderr and done.returncode == 2, done.stderr
    assert "numpy does not import" in done.stderr and "python3-numpy" in done.stderr
