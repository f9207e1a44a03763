"""Run cleaning passes to a fixed point, with statistics, checking the numbers after every change.

After each pass that reports a change, the graph is run in ONNX Runtime on fixed inputs and
compared with the raw export; a pass that moves the outputs beyond tolerance is named in the
error (and nothing is written by the caller). Finally shapes are inferred and the graph is
sorted topologically; the raw model's opset, metadata and producer are kept.

Before any pass runs, the manager checks the graph's opset: at least :data:`MIN_OPSET`, and at
least each pass's own ``min_opset``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from edge.compare import Tolerance, compare_arrays, ort_session, run_ort
from edge.errors import EdgeError, InternalError
from edge.graph.graph_pass import GraphPass, PassResult
from edge.graph.passes import PASSES

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
    passes: dict[str, PassStats] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
                "initializers_before": self.initializers_before, "initializers_after": self.initializers_after,
                "passes": {k: vars(v) for k, v in self.passes.items()}}


def _export(graph: gs.Graph, raw: onnx.ModelProto) -> onnx.ModelProto:
    model = gs.export_onnx(graph.cleanup(remove_unused_graph_inputs=False).toposort())
    del model.opset_import[:]
    model.opset_import.extend(raw.opset_import)
    model.ir_version = raw.ir_version
    model.producer_name, model.producer_version = raw.producer_name, raw.producer_version
    del model.metadata_props[:]
    model.metadata_props.extend(raw.metadata_props)
    return model


def _probe_inputs(raw: onnx.ModelProto, seed: int = 0) -> np.ndarray:
    dims = [d.dim_value if d.dim_value > 0 else 2 for d in raw.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


def count_nodes(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type != "Constant")


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (ai.onnx) domain the model imports; 0 if none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def check_requirements(model: onnx.ModelProto, passes: Sequence[GraphPass], source: str = "the model") -> None:
    """Refuse a graph below the manager's :data:`MIN_OPSET` or below any pass's ``min_opset``."""
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise EdgeError(f"{source} uses opset {opset}", expected=f"opset >= {MIN_OPSET} (native LayerNormalization)",
                        fix="re-export with `edge export` (opset 17 by default)")
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
                source: str = "the model") -> tuple[onnx.ModelProto, CleanReport]:
    """Run ``passes`` (default: every registered pass, in order) to a fixed point; ``source`` names
    the model in error messages."""
    passes = PASSES.select() if passes is None else tuple(passes)
    check_requirements(raw, passes, source)
    tolerance = tolerance or Tolerance()
    report = CleanReport(nodes_before=count_nodes(raw), initializers_before=len(raw.graph.initializer))
    report.passes = {p.name: PassStats() for p in passes}
    probe = _probe_inputs(raw)
    reference = run_ort(ort_session(raw.SerializeToString()), probe) if check else None
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
            if not result.modified:
                continue
            stats.changes += 1
            stats.nodes_removed += before - len([n for n in graph.nodes if n.op != "Constant"])
            changed_round = True
            if check:
                candidate = _export(graph, raw)
                comparison = compare_arrays(reference, run_ort(ort_session(candidate.SerializeToString()), probe),
                                            tolerance, "random")
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
