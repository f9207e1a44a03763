"""The code a pipeline step runs, fingerprinted for its cache key: editing a pass redoes the clean step.

Each step declares the edge modules and packages whose code computes its output (:data:`STEP_CODE`;
a package stands for every module in it); the pipeline's own step code (:data:`EVERY_STEP`) counts
for every step. The first-party modules (edge, calib, jetson) those import at module level are
followed as well, so a helper
moved into a new module stays covered; imports inside functions are not followed, so a module a
step imports only there must be named in its list. The fingerprint is the sha256 over the sorted
paths (relative to the folder that holds ``edge``) and contents of those source files, read from
disk: nothing is imported.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from pathlib import Path

from edge.errors import InternalError

# step -> the edge modules and packages whose code computes the step's output
STEP_CODE: dict[str, tuple[str, ...]] = {
    "analysis": ("edge.analysis", "edge.data", "edge.models"),
    "compress": ("edge.compress", "edge.analysis", "edge.data", "edge.models"),
    "count": ("edge.compress", "edge.models"),
    "export": ("edge.export", "edge.compress", "edge.data", "edge.models"),
    "clean": ("edge.graph",),
    "verify": ("edge.check.verify", "edge.check.onnx_classifier", "edge.compress", "edge.data", "edge.models"),
    "evaluate": ("edge.check.accuracy", "edge.check.onnx_classifier", "edge.data"),
    # edge.check.compare and edge.onnx_metadata: the ONNX Runtime session and the graph's recorded precision;
    # edge.profile holds edge.profile.fresh, the new process the graphs are timed in
    "profile": ("edge.profile", "edge.runtime", "edge.check.compare", "edge.onnx_metadata"),
    "plan": ("edge.planner", "edge.latency", "edge.compress", "edge.analysis", "edge.data", "edge.models"),
    "estimate": ("edge.latency", "edge.models"),
    "quantize": ("edge.precision", "calib", "edge.check.accuracy", "edge.check.compare", "edge.data"),
    "bundle": ("edge.bundle", "jetson", "edge.precision", "calib", "edge.graph", "edge.check", "edge.trt",
               "edge.data"),
}
EVERY_STEP = ("edge.pipeline.run", "edge.pipeline.steps")  # where each step's work is written: runner and steps
#: the packages of this repository (beside edge): their imports are followed, others' are not
FIRST_PARTY = ("edge", "calib", "jetson")


def source_root() -> Path:
    """The folder holding the ``edge`` package this process runs (found, not imported)."""
    spec = importlib.util.find_spec("edge")
    if spec is None or not spec.submodule_search_locations:
        raise InternalError("the edge package is not importable, so its source cannot be fingerprinted")
    return Path(next(iter(spec.submodule_search_locations))).parent


def module_file(name: str, root: Path) -> Path | None:
    """The source file of module ``name`` under ``root`` (a package's ``__init__.py``), or None."""
    path = root.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def declared_files(name: str, root: Path, step: str) -> set[Path]:
    """The source files a declared name stands for: a module, or every module of a package."""
    file = module_file(name, root)
    if file is None:
        raise InternalError(f"the {step} step's code names {name}, which does not exist under {root}; "
                            f"name the module that now holds that code in STEP_CODE ({__name__})")
    return set(file.parent.rglob("*.py")) if file.name == "__init__.py" else {file}


def _module_name(file: Path, root: Path) -> str:
    parts = file.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=4096)
def _import_statements(source: bytes, filename: str) -> tuple[tuple[str | None, int, tuple[str, ...]], ...]:
    """The module-level imports of a source text: ``(module, level, names)``, module None for ``import a, b``.
    Keyed on the text itself, so an edited file is parsed again (the 12 steps share most of their files)."""
    found = []
    for node in ast.parse(source, filename).body:
        if isinstance(node, ast.Import):
            found.append((None, 0, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level, tuple(alias.name for alias in node.names)))
    return tuple(found)


def module_level_imports(file: Path, root: Path) -> set[Path]:
    """The first-party source files ``file`` imports at module level (not inside functions)."""
    package = _module_name(file, root) if file.name == "__init__.py" else _module_name(file, root).rpartition(".")[0]
    found = set()
    for module, level, aliases in _import_statements(file.read_bytes(), str(file)):
        if module is None:
            names = list(aliases)
        else:
            base = module
            if level:
                anchor = package.split(".")[: len(package.split(".")) - level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from edge.x import y``: the module edge.x.y if there is one, else edge.x
            names = [f"{base}.{alias}" if module_file(f"{base}.{alias}", root) else base for alias in aliases]
        found |= {path for name in names if name.split(".")[0] in FIRST_PARTY and (path := module_file(name, root))}
    return found


def step_files(step: str, root: Path) -> list[Path]:
    """Every source file whose code computes ``step``'s output, sorted."""
    if step not in STEP_CODE:
        raise InternalError(f"step {step!r} declares no code in STEP_CODE ({__name__})")
    todo = set().union(*(declared_files(name, root, step) for name in (*STEP_CODE[step], *EVERY_STEP)))
    files: set[Path] = set()
    while todo:
        file = todo.pop()
        files.add(file)
        todo |= module_level_imports(file, root) - files
    return sorted(files)


def code_fingerprint(step: str, root: Path | None = None) -> str:
    """sha256 over the relative paths and contents of :func:`step_files` (``root``: the installed edge)."""
    root = source_root() if root is None else Path(root)
    digest = hashlib.sha256()
    for file in step_files(step, root):
        record = f"{file.relative_to(root).as_posix()}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\n"
        digest.update(record.encode())
    return digest.hexdigest()
