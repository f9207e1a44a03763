"""Bring a graph below the passes' opset up to it with ``onnx.version_converter``.

This is a step before the passes, not a pass: it runs once, on the ONNX model (the converter
works on protobuf, not on onnx-graphsurgeon's graph), and changes the opset the passes are then
checked against. The pass manager verifies its result in ONNX Runtime like any pass's.
"""

from __future__ import annotations

import onnx
from onnx import version_converter

from edge.check.compare import Tolerance
from edge.check.feeds import SAMPLE_LAYOUT, InputSet, compare_sets, reference_outputs, run_graph
from edge.errors import EdgeError

OWN_OUTPUTS, STORED_OUTPUTS = "its own outputs", "the outputs stored with it"


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (ai.onnx) domain the model imports; 0 if none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def needed_ir_version(model: onnx.ModelProto) -> int:
    """The lowest IR version that the model's opsets allow and that lets initializers not be inputs.

    Before IR 4 every initializer had to be listed as a graph input too; onnx-graphsurgeon writes
    weights as initializers only, so an IR 3 graph keeping its version fails onnx.checker
    ("X in initializer but not in graph input").
    """
    return max(4, onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True))


def upgrade_opset(model: onnx.ModelProto, target: int, source: str = "the model") -> onnx.ModelProto:
    """``model`` converted to default-domain opset ``target``, at the IR version that opset needs."""
    opset = default_opset(model)
    try:
        upgraded = version_converter.convert_version(model, target)
    except Exception as e:  # noqa: BLE001 - the converter raises ConvertError and C++ errors of other types
        raise EdgeError(f"{source} uses opset {opset} and onnx.version_converter cannot upgrade it to {target}",
                        found=str(e).strip()[:300],
                        fix=f"re-export the model at opset {target} or later from the framework it came from") from e
    upgraded.ir_version = max(model.ir_version, needed_ir_version(upgraded))
    return upgraded


def upgrade_checked(raw: onnx.ModelProto, target: int, inputs: list[InputSet], tolerance: Tolerance,
                    source: str) -> tuple[onnx.ModelProto, list, dict]:
    """``raw`` upgraded to ``target`` and checked in ONNX Runtime; the outputs later changes are
    checked against; the note for the report.

    The upgrade is checked against ``raw``'s own outputs, or, where ONNX Runtime no longer runs an
    operator version ``raw`` uses (AveragePool-1, BatchNormalization-6), against the outputs
    stored with the sample inputs; with neither, it cannot be checked and is refused.
    """
    opset = default_opset(raw)
    upgraded = upgrade_opset(raw, target, source)
    try:
        reference = run_graph(raw, inputs)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        stored = [s for s in inputs if s.expected is not None]
        if not stored:
            raise EdgeError(f"ONNX Runtime cannot run {source} at opset {opset}, so its upgrade to opset {target} "
                            "cannot be checked", found=str(e).strip()[:300],
                            fix=f"store sample inputs with their outputs next to the model ({SAMPLE_LAYOUT}, "
                                f"output_0.pb, ...), or re-export it at opset {target} or later") from e
        comparison = compare_sets([s.expected for s in stored], reference_outputs(upgraded, stored, source),
                                  stored, tolerance)
        against = STORED_OUTPUTS
        reference = reference_outputs(upgraded, inputs, source)
    else:
        comparison = compare_sets(reference, reference_outputs(upgraded, inputs, source), inputs, tolerance)
        against = OWN_OUTPUTS
    if not comparison.passed:
        raise EdgeError(f"upgrading {source} from opset {opset} to {target} with onnx.version_converter changes "
                        f"its outputs beyond tolerance (compared with {against})",
                        expected=f"max abs <= {tolerance.max_abs}, relative L2 <= {tolerance.rel_l2}",
                        found=f"max abs {comparison.max_abs:.3e}, relative L2 {comparison.rel_l2:.3e} on "
                              f"{comparison.inputs} inputs",
                        fix=f"nothing was written; re-export the model at opset {target} or later from the "
                            "framework it came from")
    return upgraded, reference, {"from": opset, "to": target, "by": "onnx.version_converter", "checked": against}
