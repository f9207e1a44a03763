"""The step cache keys on the code a step runs: an edited pass, exporter or helper redoes what it computes."""

import ast
import shutil
from pathlib import Path

import pytest

from edge.errors import InternalError
from edge.pipeline.cache import StepCache
from edge.pipeline.fingerprint import (
    EVERY_STEP,
    FIRST_PARTY,
    STEP_CODE,
    code_fingerprint,
    declared_files,
    module_file,
    source_root,
    step_files,
)
from edge.pipeline.layout import STEPS

PASS = Path("edge/graph/passes/remove_noops.py")


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the first-party sources (``.py`` files only) to edit."""
    root = source_root()
    for file in (f for package in ("edge", "calib", "jetson") for f in (root / package).rglob("*.py")):
        copy = tmp_path / file.relative_to(root)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, copy)
    return tmp_path


def _keys(root: Path) -> dict[str, str]:
    cache = StepCache(code_root=root)
    return {step: cache.key(step, {"same": "inputs"}) for step in STEPS}


def test_every_step_declares_code_and_every_declared_module_exists():
    assert set(STEP_CODE) == set(STEPS)
    root = source_root()
    for step in STEPS:
        for name in (*STEP_CODE[step], *EVERY_STEP):
            assert declared_files(name, root, step), f"{step}: {name}"
    assert root / PASS in step_files("clean", root)
    assert root / "edge/export.py" in step_files("export", root)
    assert root / "edge/profile/stats.py" in step_files("profile", root)


def test_a_declared_module_that_does_not_exist_fails_loudly(monkeypatch):
    monkeypatch.setitem(STEP_CODE, "clean", ("edge.graph.renamed_away",))
    with pytest.raises(InternalError, match="the clean step's code names edge.graph.renamed_away"):
        code_fingerprint("clean")
    with pytest.raises(InternalError, match="'nope' declares no code"):
        code_fingerprint("nope")


def test_an_unchanged_tree_gives_the_same_keys(tree):
    first = _keys(source_root())
    assert _keys(source_root()) == first
    assert _keys(tree) == first  # paths are relative: the same code elsewhere has the same key
    assert len(set(first.values())) == len(STEPS)


def test_changing_a_pass_changes_the_clean_key_and_only_where_the_pass_runs(tree):
    before = _keys(tree)
    (tree / PASS).write_text((tree / PASS).read_text().replace("def ", "def _unused():\n    pass\n\n\ndef ", 1))
    after = _keys(tree)
    changed = {step for step in STEPS if before[step] != after[step]}
    assert "clean" in changed
    assert changed == {step for step in STEPS if tree / PASS in step_files(step, tree)}
    assert "profile" not in changed and "export" not in changed


def test_changing_the_exporter_changes_the_export_key(tree):
    before = _keys(tree)
    exporter = tree / "edge/export.py"
    exporter.write_text(exporter.read_text().replace("DEFAULT_OPSET = 17", "DEFAULT_OPSET = 18"))
    after = _keys(tree)
    changed = {step for step in STEPS if before[step] != after[step]}
    assert "export" in changed
    assert changed == {step for step in STEPS if exporter in step_files(step, tree)}


def test_a_helper_moved_into_a_new_module_is_followed(tree):
    """Reorganising code must not hide it: a module imported at module level is part of the step's code."""
    helper = tree / "edge/onnx_files.py"
    helper.write_text("def save(data, path):\n    path.write_bytes(data)\n")
    clean = tree / "edge/graph/clean.py"
    clean.write_text("from edge.onnx_files import save  # noqa: F401\n" + clean.read_text())
    before = _keys(tree)
    helper.write_text("def save(data, path):\n    path.write_bytes(bytes(data))\n")
    after = _keys(tree)
    assert before["clean"] != after["clean"] and before["profile"] == after["profile"]


def test_a_step_whose_code_changed_is_redone(tree, tmp_path):
    calls = []

    def work():
        calls.append(1)
        (tmp_path / "out" / "g.onnx").write_bytes(b"graph")
        return {}

    folder = tmp_path / "out"
    folder.mkdir()
    assert StepCache(code_root=tree).run(folder, "clean", {"x": 1}, work, ("g.onnx",)).status == "ran"
    assert StepCache(code_root=tree).run(folder, "clean", {"x": 1}, work, ("g.onnx",)).status == "cached"
    (tree / PASS).write_text((tree / PASS).read_text() + "\n# an edited pass\n")
    assert StepCache(code_root=tree).run(folder, "clean", {"x": 1}, work, ("g.onnx",)).status == "ran"
    assert len(calls) == 2


def test_first_party_code_outside_edge_is_followed(tree):
    """The latency statistics live in jetson/ (the device runner shares them): editing them redoes profile."""
    before = _keys(tree)
    stats = tree / "jetson" / "stats.py"
    stats.write_text(stats.read_text() + "\n# edited\n")
    after = _keys(tree)
    assert after["profile"] != before["profile"] and after["clean"] == before["clean"]


def _step_names(function: ast.FunctionDef) -> set[str]:
    """The steps ``function`` runs: ``step(ctx, variant, "NAME", ...)`` or ``self._step("NAME", ...)`` calls."""
    found = set()
    for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
        callee = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
        args = call.args[2:3] if callee == "step" else call.args[:1] if callee == "_step" else []
        found |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def _imported_inside(function: ast.FunctionDef, root: Path) -> set[str]:
    """The first-party modules imported inside ``function`` (the fingerprint follows only module-level imports)."""
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FIRST_PARTY:
            found |= {f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}", root) else node.module
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in FIRST_PARTY}
    return found


def test_every_module_a_step_imports_inside_its_function_is_in_its_fingerprint():
    # the profile step imported edge.profile.fresh (the process its graphs are timed in) inside its work function,
    # and no step declared it: editing how the graphs are timed kept the old timings
    root = source_root()
    code = sorted(file for name in EVERY_STEP for file in declared_files(name, root, "every"))
    functions = [n for file in code for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)]
    checked = set()
    for function in functions:
        steps = _step_names(function) if function.name not in ("step", "_step") else set()
        for name in steps:
            files = set(step_files(name, root))
            for module in _imported_inside(function, root):
                assert module_file(module, root) in files, f"{function.name}: the {name} step imports {module}"
        checked |= steps
    assert checked == set(STEPS)   # every step found in the pipeline's step code, so none escaped the check
    assert root / "edge/profile/fresh.py" in step_files("profile", root)
