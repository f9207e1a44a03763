"""Run cleaning passes to a fixed point, with statistics, checking the numbers after every change.

After each pass that reports a change, the graph is run in ONNX Runtime on fixed inputs and
compared with the raw export; a pass that moves the outputs beyond tolerance is named in the
error (and nothing is written by the caller). Every input and output of the graph is compared.
Finally shapes are inferred and the graph is sorted topologically; the raw model's opset,
metadata and producer are kept, and its IR version unless its opset needs a newer one.

A graph below :data:`MIN_OPSET` is first upgraded to it with ``onnx.version_converter``
(:mod:`edge.graph.upgrade`) and checked like a pass, against the graph as given. The upgrade is
automatic, with a note in the report: it is verified exactly as the passes are, the input file is
never touched, and refusing until the user adds a flag would cost a rerun and add no safety.
Then the manager checks each pass's own ``min_opset``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from edge.check.compare import Tolerance
from edge.check.feeds import InputSet, check_tensor_io, compare_sets, random_feeds, reference_outputs, run_graph
from edge.errors import EdgeError, InternalError
from edge.graph.graph_pass import GraphPass, PassResult
from edge.graph.passes import PASSES
from edge.graph.upgrade import default_opset, needed_ir_version, upgrade_checked

# The opset the passes are written and tested at (edge export's default): from 17 on,
# LayerNormalization is one node, not the ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add it decomposes to.
MIN_OPSET = 17


@dataclass
class PassStats:
    runs: int = 0
    changes: int = 0
    nodes_removed: int = 0
    seconds: float = 0.0


@dataclass
class CleanReport:
    rounds: int = 0
    nodes_before: int = 0
    nodes_after: int = 0
    initializers_before: int = 0
    initializers_after: int = 0
    upgraded: dict | None = None  # {"from": opset, "to": opset, "by": "onnx.version_converter"}
    passes: dict[str, PassStats] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what passes left alone and why, each once

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "upgraded": self.upgraded, "nodes_before": self.nodes_before,
                "nodes_after": self.nodes_after,
                "initializers_before": self.initializers_before, "initializers_after": self.initializers_after,
                "passes": {k: vars(v) for k, v in self.passes.items()}, "notes": list(self.notes)}


def _export(graph: gs.Graph, raw: onnx.ModelProto) -> onnx.ModelProto:
    model = gs.export_onnx(graph.cleanup(remove_unused_graph_inputs=False).toposort())
    added = [o for o in model.opset_import if o.domain not in {r.domain for r in raw.opset_import} | {"ai.onnx"}]
    del model.opset_import[:]
    model.opset_import.extend(raw.opset_import)
    model.opset_import.extend(added)  # domains a pass brought in (a plugin op's)
    model.ir_version = max(raw.ir_version, needed_ir_version(model))
    model.producer_name, model.producer_version = raw.producer_name, raw.producer_version
    del model.metadata_props[:]
    model.metadata_props.extend(raw.metadata_props)
    return model


def count_nodes(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type != "Constant")


def check_requirements(model: onnx.ModelProto, passes: Sequence[GraphPass], source: str = "the model") -> None:
    """Refuse a graph below any pass's ``min_opset`` (the manager has upgraded it to :data:`MIN_OPSET`)."""
    opset = default_opset(model)
    for p in passes:
        if p.min_opset is not None and opset < p.min_opset:
            raise EdgeError(f"{source} uses opset {opset}", expected=f"opset >= {p.min_opset} (pass {p.name!r})",
                            fix=f"re-export with `edge export --opset {p.min_opset}`, or --skip-pass {p.name}")


def _run_pass(graph_pass: GraphPass, graph: gs.Graph) -> PassResult:
    result = graph_pass(graph)
    if not isinstance(result, PassResult):
        raise InternalError(f"graph pass {graph_pass.name!r} returned {type(result).__name__}, not a PassResult")
    return result


def clean_graph(raw: onnx.ModelProto, passes: Sequence[GraphPass] | None = None, max_rounds: int = 10,
                tolerance: Tolerance | None = None, check: bool = True, log: Callable[[str], None] | None = None,
                source: str = "the model", inputs: Sequence[InputSet] | None = None,
                ) -> tuple[onnx.ModelProto, CleanReport]:
    """Run ``passes`` (default: every registered pass, in order) to a fixed point; ``source`` names
    the model in error messages; ``inputs`` are the named input sets every change is checked on
    (default: one set of random values)."""
    passes = PASSES.select() if passes is None else tuple(passes)
    tolerance = tolerance or Tolerance()
    check_tensor_io(raw, source)
    inputs = list(inputs) if inputs is not None else [InputSet("random", random_feeds(raw, 0, source=source))]
    report = CleanReport(nodes_before=count_nodes(raw), initializers_before=len(raw.graph.initializer))
    report.passes = {p.name: PassStats() for p in passes}
    if default_opset(raw) < MIN_OPSET:
        raw, reference, report.upgraded = upgrade_checked(raw, MIN_OPSET, inputs, tolerance, source)
    else:
        reference = reference_outputs(raw, inputs, source) if check else None
    check_requirements(raw, passes, source)
    graph = gs.import_onnx(raw)
    for round_index in range(max_rounds):
        report.rounds = round_index + 1
        changed_round = False
        for p in passes:
            stats = report.passes[p.name]
            before = len([n for n in graph.nodes if n.op != "Constant"])
            start = time.perf_counter()
            result = _run_pass(p, graph)
            graph = result.graph
            graph.cleanup(remove_unused_graph_inputs=False).toposort()
            stats.seconds += time.perf_counter() - start
            stats.runs += 1
            report.notes += [note for note in result.notes if note not in report.notes]
            if not result.modified:
                continue
            stats.changes += 1
            stats.nodes_removed += before - len([n for n in graph.nodes if n.op != "Constant"])
            changed_round = True
            if check:
                comparison = compare_sets(reference, run_graph(_export(graph, raw), inputs), inputs, tolerance)
                if not comparison.passed:
                    raise EdgeError(f"cleaning pass {p.name!r} changed the model's outputs beyond tolerance",
                                    expected=f"max abs <= {tolerance.max_abs}, relative L2 <= {tolerance.rel_l2}",
                                    found=f"max abs {comparison.max_abs:.3e}, relative L2 {comparison.rel_l2:.3e}",
                                    fix=f"nothing was written; rerun with --skip-pass {p.name} and report the bug")
            if log:
                log(f"round {round_index + 1}: {p.name} changed the graph ({before} -> "
                    f"{len([n for n in graph.nodes if n.op != 'Constant'])} nodes)")
        if not changed_round:
            break
    model = onnx.shape_inference.infer_shapes(_export(graph, raw), strict_mode=False, data_prop=True)
    report.nodes_after = count_nodes(model)
    report.initializers_after = len(model.graph.initializer)
    return model, report
