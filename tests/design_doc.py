"""docs/design.md against the code: its layers are generated from .importlinter, its tree names what exists.

    python -m tests.design_doc --write    # write the layers block of docs/design.md from .importlinter

tests/test_design.py holds the doc to both: the layers block must be what this renders, every path of
"Where things live" must exist and every module and package of edge/ must be placed there.
"""

from __future__ import annotations

import argparse
import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design.md"
CONTRACTS = ROOT / ".importlinter"
BEGIN = "<!-- layers: generated from .importlinter by `python -m tests.design_doc --write` (tests/test_design.py) -->"
END = "<!-- /layers -->"


def layers() -> list[list[str]]:
    """The main layers contract of .importlinter, top first: each layer's modules."""
    parser = configparser.ConfigParser()
    parser.read(CONTRACTS)
    text = parser["importlinter:contract:layers"]["layers"]
    return [[m.strip() for m in line.split("|")] for line in text.strip().splitlines() if line.strip()]


def path_of(module: str) -> str:
    """``edge.cli`` -> ``edge/cli/``, ``edge.bundle`` -> ``edge/bundle/``, ``edge.export`` -> ``edge/export.py``, ``calib`` -> ``calib/``."""
    relative = Path(*module.split("."))
    return f"{relative}/" if (ROOT / relative).is_dir() else f"{relative}.py"


def render() -> str:
    rows = ["    " + " | ".join(path_of(m) for m in layer) for layer in layers()]
    return "\n".join([BEGIN, "", *rows, "", END])


def current() -> str:
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN):text.index(END) + len(END)]


def write() -> None:
    """Replace the block (or a line ``<<LAYERS>>`` marking where it goes) with :func:`render`."""
    text = DOC.read_text(encoding="utf-8")
    old = current() or "<<LAYERS>>"
    if text.count(old) != 1:
        raise SystemExit(f"{DOC}: no layers block and no <<LAYERS>> line to put one at")
    DOC.write_text(text.replace(old, render()), encoding="utf-8")


def tree() -> list[tuple[str, str]]:
    """(path, its description) of every entry of the "Where things live" block, paths from the root."""
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index("## Where things live"):]
    block = block[:block.index("\n## ", 3)]
    entries: list[tuple[str, str]] = []
    parents: list[tuple[int, str]] = []
    entry = re.compile(r"^( +)([\w./<>, -]+?/|[\w.]+\.py(?:, [\w.]+\.py)*)(?:\s{2,}(.*))?$")
    for line in block.splitlines():
        found = entry.match(line)
        if not found or not found.group(2).strip():
            if entries and line.strip():
                entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
            continue
        indent, names, what = len(found.group(1)), found.group(2).strip(), found.group(3) or ""
        while parents and parents[-1][0] >= indent:
            parents.pop()
        base = parents[-1][1] if parents else ""
        for name in (n.strip() for n in names.split(",")):
            entries.append((base + name, what))
        if names.endswith("/"):
            parents.append((indent, base + names))
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the layers block of docs/design.md")
    args = parser.parse_args()
    if args.write:
        write()
    print(render())


if __name__ == "__main__":
    main()
