"""The onnx package's backend test graphs, as graphs `edge export` did not write, and a census of
what `edge clean` does with each: cleaned, or refused with a reason.

Run ``python -m tests.edge.graph.onnx_backend_data`` for the counts over all of them.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import onnx

from edge.errors import EdgeError
from edge.graph.clean import clean_file

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
FOLDERS = ("light", "pytorch-converted", "pytorch-operator", "simple")


def backend_models() -> list[Path]:
    """Every graph of FOLDERS: ``NAME/model.onnx`` (with its test_data_set_*) or a lone ``NAME.onnx``."""
    models = []
    for folder in FOLDERS:
        for entry in sorted((DATA / folder).iterdir()):
            if entry.is_dir() and (entry / "model.onnx").is_file():
                models.append(entry / "model.onnx")
            elif entry.suffix == ".onnx":
                models.append(entry)
    return models


def label(model: Path) -> str:
    return f"{model.parent.parent.name}/{model.parent.name}" if model.name == "model.onnx" else \
        f"{model.parent.name}/{model.stem}"


def clean_outcome(model: Path, out: Path) -> tuple[str, str]:
    """("cleaned", note) or ("refused", the error's message); anything else raises."""
    try:
        result = clean_file(model, out)
    except EdgeError as e:
        return "refused", str(e).replace(str(model), "MODEL")
    upgraded = result["report"]["upgraded"]
    return "cleaned", f"upgraded from opset {upgraded['from']}" if upgraded else "at its opset"


def main() -> int:
    outcomes = collections.Counter()
    with tempfile.TemporaryDirectory() as folder:
        for model in backend_models():
            outcome, reason = clean_outcome(model, Path(folder) / "clean.onnx")
            outcomes[outcome] += 1
            print(f"{outcome:<8} {label(model):<60} {reason.splitlines()[0]}")
    print(", ".join(f"{n} {k}" for k, n in outcomes.most_common()), f"of {sum(outcomes.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
