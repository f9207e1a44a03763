"""Where every benchmark writes: its JSON record and its markdown table, parents created."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from edge.progress import log


def write_results(record: dict, json_out: str | Path, md_out: str | Path, markdown: Callable[[dict], str]) -> None:
    for path, text in ((Path(json_out), json.dumps(record, indent=1) + "\n"), (Path(md_out), markdown(record))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    log(f"wrote {json_out} and {md_out}")
