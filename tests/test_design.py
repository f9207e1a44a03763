"""docs/design.md cannot drift from the code: its layers are .importlinter's, its tree names what exists."""

from __future__ import annotations

from tests.design_doc import ROOT, current, render, tree

PLACEHOLDER = "<m>"   # methods/<m>/: one folder per method


def test_the_layers_block_is_the_import_contract():
    assert current() == render(), ("docs/design.md's layers block differs from .importlinter's layers contract: "
                                   "run `python -m tests.design_doc --write`")


def test_every_path_the_tree_names_exists():
    entries = tree()
    assert len(entries) > 30, entries   # the tree was read at all
    missing = []
    for path, _ in entries:
        if PLACEHOLDER in path:
            path = path[:path.index(PLACEHOLDER)]
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_every_module_and_package_of_edge_is_placed_in_the_tree():
    placed = {path for path, _ in tree()}
    modules = sorted(f"edge/{p.name}/" if p.is_dir() else f"edge/{p.name}" for p in (ROOT / "edge").iterdir()
                     if (p.is_dir() and (p / "__init__.py").is_file())
                     or (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py")))
    unplaced = [m for m in modules if m not in placed]
    assert not unplaced, f"edge modules docs/design.md's tree does not place: {unplaced}"


def test_every_file_an_entry_names_is_in_its_folder():
    wrong = []
    for path, what in tree():
        if not path.endswith("/") or PLACEHOLDER in path:
            continue
        for name in {w.strip("`(),.:;") for w in what.split() if w.strip("`(),.:;").endswith(".py")}:
            folder = ROOT / path   # a file in it (or deeper), or beside it ("the device section, beside it")
            if "/" not in name and not list(folder.rglob(name)) and not (folder.parent / name).exists():
                wrong.append(f"{path}{name}")
    assert not wrong, f"docs/design.md names files its folders do not hold: {wrong}"
