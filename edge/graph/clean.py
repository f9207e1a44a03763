"""Clean an ONNX file: load (with clear errors), run the passes, check, verify, write atomically."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx

from edge.compare import Tolerance, compare_arrays, ort_session, run_ort
from edge.errors import EdgeError
from edge.fileio import write_atomic
from edge.graph.graph_pass import GraphPass
from edge.graph.manager import clean_graph


def load_onnx(path: Path) -> onnx.ModelProto:
    """The model in ``path``; its opset is checked by the pass manager, against the passes that run."""
    if not path.is_file():
        raise EdgeError(f"{path} does not exist", fix="pass an ONNX file written by `edge export`")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise EdgeError(f"{path} is not an ONNX model", found=str(e)[:300],
                        fix="pass an ONNX file written by `edge export`") from e
    return model


def clean_file(source: Path, out: Path, passes: Sequence[GraphPass] | None = None,
               tolerance: Tolerance | None = None) -> dict:
    """Clean ``source`` with ``passes`` (default: every registered pass), verify, write ``out``."""
    import numpy as np

    tolerance = tolerance or Tolerance()
    raw = load_onnx(source)
    cleaned, report = clean_graph(raw, passes, tolerance=tolerance, source=str(source))
    try:
        onnx.checker.check_model(cleaned, full_check=True)
    except onnx.checker.ValidationError as e:
        raise EdgeError(f"the cleaned graph of {source} fails onnx.checker", found=str(e)[:500],
                        fix="nothing was written; report this as a bug") from e
    data = cleaned.SerializeToString()
    raw_session, clean_session = ort_session(raw.SerializeToString()), ort_session(data)
    dims = [d.dim_value if d.dim_value > 0 else 2 for d in raw.graph.input[0].type.tensor_type.shape.dim]
    verification = []
    for name, seed in (("random", 1), ("random-large", 2)):
        x = np.random.default_rng(seed).standard_normal(dims).astype(np.float32) * (1 if seed == 1 else 4)
        result = compare_arrays(run_ort(raw_session, x), run_ort(clean_session, x), tolerance, name)
        verification.append(result.as_dict())
        if not result.passed:
            raise EdgeError(f"the cleaned graph of {source} disagrees with it on {name} inputs",
                            found=f"max abs {result.max_abs:.3e}, relative L2 {result.rel_l2:.3e}",
                            fix="nothing was written; report this as a bug")
    write_atomic(data, out)
    return {"source": str(source), "out": str(out), "report": report.as_dict(), "verification": verification}
