"""Clean an ONNX file: load (with clear errors), run the passes, check, verify, write atomically."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx

from edge.check.compare import Tolerance
from edge.check.feeds import compare_outputs, input_sets, run_graph
from edge.errors import EdgeError
from edge.fileio import write_atomic
from edge.graph.graph_pass import GraphPass
from edge.graph.input_shape import with_input_size
from edge.graph.manager import clean_graph
from edge.graph.upgrade import STORED_OUTPUTS, upgrade_opset

# the manager checks each change on the first set; the result is verified on the other two
CHECK_INPUTS = (("random", 0, 1.0),)
VERIFY_INPUTS = (("random", 1, 1.0), ("random-large", 2, 4.0))


def load_onnx(path: Path) -> onnx.ModelProto:
    """The model in ``path``; its opset is checked by the pass manager, against the passes that run."""
    if not path.is_file():
        raise EdgeError(f"{path} does not exist",
                        fix="pass an ONNX file (from edge export, torch.onnx or another exporter)")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise EdgeError(f"{path} is not an ONNX model", found=str(e)[:300],
                        fix="pass an ONNX file (from edge export, torch.onnx or another exporter)") from e
    return model


def _check_model(cleaned: onnx.ModelProto, raw: onnx.ModelProto, source: Path) -> None:
    """onnx.checker on the cleaned graph; when it fails, a source that fails too is bad input, not a bug."""
    try:
        onnx.checker.check_model(cleaned, full_check=True)
    except onnx.checker.ValidationError as e:
        try:
            onnx.checker.check_model(raw, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as bad:
            raise EdgeError(f"{source} fails onnx.checker", found=str(bad).strip()[:500],
                            fix="repair the model (onnx.checker.check_model(model, full_check=True) names the "
                                "problem) or re-export it") from bad
        raise EdgeError(f"the cleaned graph of {source} fails onnx.checker", found=str(e)[:500],
                        fix="nothing was written; report this as a bug") from e


def _baseline(raw: onnx.ModelProto, upgraded: dict | None, source: str) -> onnx.ModelProto:
    """What the result is verified against: the graph as given, or its upgrade where ONNX Runtime
    no longer runs the original (the upgrade was then checked against the stored outputs)."""
    if upgraded and upgraded["checked"] == STORED_OUTPUTS:
        return upgrade_opset(raw, upgraded["to"], source)
    return raw


def clean_file(source: Path, out: Path, passes: Sequence[GraphPass] | None = None,
               tolerance: Tolerance | None = None, input_size: tuple[int, ...] | None = None) -> dict:
    """Clean ``source`` with ``passes`` (default: every registered pass), verify, write ``out``.

    Sample inputs stored next to ``source`` (``test_data_set_*/input_*.pb``) are used in every
    check, besides random ones where the inputs are floating-point. ``input_size`` (C, H, W, or H, W):
    first declared in the image input's shape (:func:`edge.graph.input_shape.with_input_size`).
    """
    tolerance = tolerance or Tolerance()
    raw = load_onnx(source)
    if input_size is not None:
        raw = with_input_size(raw, input_size, str(source))
    cleaned, report = clean_graph(raw, passes, tolerance=tolerance, source=str(source),
                                  inputs=input_sets(source, raw, CHECK_INPUTS, str(source)))
    _check_model(cleaned, raw, source)
    inputs = input_sets(source, raw, VERIFY_INPUTS, str(source))
    baseline = _baseline(raw, report.upgraded, str(source))
    verification = []
    for sample, before, after in zip(inputs, run_graph(baseline, inputs), run_graph(cleaned, inputs), strict=True):
        result = compare_outputs(before, after, tolerance, sample.name)
        verification.append(result.as_dict())
        if not result.passed:
            raise EdgeError(f"the cleaned graph of {source} disagrees with it on {sample.name} inputs",
                            found=f"max abs {result.max_abs:.3e}, relative L2 {result.rel_l2:.3e}",
                            fix="nothing was written; report this as a bug")
    write_atomic(cleaned.SerializeToString(), out)
    return {"source": str(source), "out": str(out), "report": report.as_dict(), "verification": verification}
