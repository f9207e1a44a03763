"""The accuracy gate of ``edge quantize``: the converted graph against its float32 source on held-out images.

Every fp16 or int8 graph ``edge quantize`` makes is run in ONNX Runtime beside its float32 source on
:data:`GATE_IMAGES` images of the check data's *test* split (calibration and the fp16 range check use
the training split, so these images are held out), and per output the gate measures:

* ``top1_agreement``: the share of images whose arg-max is float32's (class-score outputs only: one
  score per class of the data; features, or another data set's head, have none);
* ``max_abs``, ``mean_abs``: the largest and the mean ``|candidate - float32|``;
* ``rel_l2``: ``||candidate - float32|| / ||float32||`` over all images (the scale-free one).

A graph passes when every output meets its precision's :data:`THRESHOLDS`; otherwise
:func:`judge` raises :class:`AccuracyLoss` (exit 2, nothing written) naming the nodes that add
most error (:func:`node_errors`), unless the caller accepts the loss (``--accept-loss``), in
which case the figures say so (``accepted_loss``) and the graph records them.

Its thresholds are :data:`jetson.accuracy_gate.GRAPH_THRESHOLDS`, beside the engine's on the device: one gate
module holds both, and says why each number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge.config import MAX_SAMPLES, option
from edge.errors import EdgeError
from edge.onnx_metadata import ACCURACY_GATE
from jetson.accuracy_gate import GRAPH_THRESHOLDS, Thresholds, graph_failures

GATE_IMAGES = 500    # test images the gate runs on
NODE_IMAGES = 8      # of them, the images the per-node errors are measured on (only when the gate fails)
RUN_BATCH = 64       # images per call of a dynamic-batch graph (edge pipeline's accuracy batch: fastest measured)
TOP_NODES = 5        # nodes named in a refusal
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


#: per precision (``edge quantize --precision``): jetson.accuracy_gate says why each number
THRESHOLDS = GRAPH_THRESHOLDS


@dataclass
class GateConfig:
    """How the gate runs: how many test images, how many for the per-node errors, and whether a graph
    below the thresholds is written anyway (``--accept-loss``)."""

    images: int = option(GATE_IMAGES, minimum=1, maximum=MAX_SAMPLES)
    node_images: int = option(NODE_IMAGES, minimum=1, maximum=1024)
    accept_loss: bool = False


class AccuracyLoss(EdgeError):
    """A converted graph below its precision's thresholds: nothing written; ``gate`` holds the figures."""

    def __init__(self, what: str, gate: dict, **parts: str) -> None:
        super().__init__(what, **parts)
        self.gate = gate


# the figures
def output_figures(reference: np.ndarray, candidate: np.ndarray, class_scores: bool) -> dict:
    """One output's figures against float32 (the module docstring defines them)."""
    a, b = reference.astype(np.float64), candidate.astype(np.float64)
    error = np.abs(a - b)
    norm = float(np.linalg.norm(a))
    figures = {"max_abs": float(error.max()), "mean_abs": float(error.mean()),
               "rel_l2": float(np.linalg.norm(a - b) / norm) if norm > 0 else float(np.linalg.norm(a - b)),
               "finite": bool(np.isfinite(b).all())}
    if class_scores:
        figures["top1_agreement"] = float((a.argmax(-1) == np.nan_to_num(b, nan=-np.inf).argmax(-1)).mean())
    return figures


def run_graph(model: onnx.ModelProto, inputs: np.ndarray, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """``model``'s outputs (or the tensors ``names``, exposed as outputs) on ``inputs``, by name, in the graph's
    static batch (whole batches only: images past the last full one are left out) or, a dynamic batch, in calls of
    :data:`RUN_BATCH` images. The calls run a few at once on one-thread sessions
    (:func:`~edge.check.compare.concurrent_calls` of ``OMP_NUM_THREADS``, else of the CPU count)."""
    import os

    from calib.data import graph_batch
    from edge.check.compare import concurrent_calls, default_threads, in_order, ort_session

    if names is not None:
        model = _exposing(model, names)
    calls, threads = concurrent_calls(default_threads() or os.cpu_count() or 1)
    session = ort_session(model.SerializeToString(), threads=threads)
    feed = model.graph.input[0].name
    static = graph_batch(model)
    batch = static or RUN_BATCH
    stop = len(inputs) - batch + 1 if static else len(inputs)
    outputs = [o.name for o in session.get_outputs()]
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    for result in in_order(lambda start: session.run(None, {feed: inputs[start:start + batch]}),
                           range(0, max(stop, 0), batch), calls):
        for name, value in zip(outputs, result, strict=True):
            pieces[name].append(value)
    # a tensor without a batch axis (a scalar of the shape arithmetic) is joined as it comes: the same in both graphs
    return {name: np.concatenate(parts) if parts[0].ndim else parts[0] for name, parts in pieces.items()}


def measure(reference: onnx.ModelProto, candidate: onnx.ModelProto, inputs: np.ndarray, classes: int | None,
            data: str, reference_outputs: dict[str, np.ndarray] | None = None) -> dict:
    """Every output of ``candidate`` against ``reference`` (float32) on ``inputs``: per output and the worst.
    ``classes`` None: ``inputs`` are not images (a graph recording no preprocessing), errors only.
    ``reference_outputs``: :func:`run_graph` of ``reference`` on ``inputs`` where the caller has them already."""
    from edge.check.accuracy import head_mismatch

    a = run_graph(reference, inputs) if reference_outputs is None else reference_outputs
    b = run_graph(candidate, inputs)
    per_output, notes = {}, []
    if classes is None:
        notes.append("the graph records no preprocessing: compared on seeded random inputs, not images (errors "
                     "only, no top-1 agreement); pass --input-size, --mean and --std to compare on images")
    for name, ref in a.items():
        if classes is None:
            per_output[name] = output_figures(ref, b[name], False)
            continue
        mismatch = head_mismatch(ref.shape, classes, data)
        if mismatch:  # another data set's head, or features: argmax agreement would mean nothing
            notes.append(f"{name}: {mismatch}: compared as features (errors only), no top-1 agreement; for "
                         f"accuracy on {data} use `edge eval MODEL --probe`")
        per_output[name] = output_figures(ref, b[name], mismatch is None)
    worst = {"max_abs": max(f["max_abs"] for f in per_output.values()),
             "mean_abs": max(f["mean_abs"] for f in per_output.values()),
             "rel_l2": max(f["rel_l2"] for f in per_output.values()),
             "finite": all(f["finite"] for f in per_output.values())}
    agreements = [f["top1_agreement"] for f in per_output.values() if "top1_agreement" in f]
    kind = "random inputs" if classes is None else "class scores" if agreements else "features"
    summary = {"images": int(len(next(iter(a.values())))), "data": data, **worst,
               "outputs": kind, "per_output": per_output}
    if agreements:
        summary["top1_agreement"] = min(agreements)
    if notes:
        summary["note"] = "; ".join(notes)
    return summary


def failures(figures: dict, thresholds: Thresholds) -> list[str]:
    """Why the outputs miss the thresholds, one line each; empty when they pass (jetson.accuracy_gate's rule)."""
    return graph_failures(figures["per_output"], thresholds)


# which nodes add the error
def _exposing(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` with the float tensors ``names`` among its outputs (each with its inferred type)."""
    from edge.precision.fp16 import float_tensor_types

    types = float_tensor_types(model)
    exposed = onnx.ModelProto.FromString(model.SerializeToString())
    present = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(helper.make_tensor_value_info(n, types[n], None) for n in names
                                if n not in present and types.get(n) in FLOAT_TYPES)
    return exposed


def reference_names(candidate: onnx.ModelProto, reference_tensors: set[str]) -> dict[str, str]:
    """Each float tensor of ``candidate`` that holds a value of the float32 graph -> that tensor's name there:
    the same name, or through a DequantizeLinear (back to its QuantizeLinear's input) or a Cast."""
    producers = {o: n for n in candidate.graph.node for o in n.output}
    names = {i.name: i.name for i in candidate.graph.input if i.name in reference_tensors}
    for node in candidate.graph.node:  # topological: a node's inputs are mapped before it
        for out in node.output:
            if out in reference_tensors:
                names[out] = out
        source = node.input[0] if node.input else ""
        if node.op_type == "Cast" and source in names:
            names[node.output[0]] = names[source]
        elif node.op_type == "DequantizeLinear" and source in producers and \
                producers[source].op_type == "QuantizeLinear" and producers[source].input[0] in names:
            names[node.output[0]] = names[producers[source].input[0]]
    return names


def tensor_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    """How far ``candidate`` is from ``reference``: the median over rows (the last axis: a token's channels, an
    image's scores) of ``||candidate - reference|| / ||reference||``. Per row and the median, because a few
    massive values (an outlier model's residual stream) would otherwise carry a whole tensor's norm and hide
    every other token being lost, or make one flipped outlier token look like a lost tensor."""
    a = reference.astype(np.float64).reshape(-1, reference.shape[-1] if reference.ndim else 1)
    b = candidate.astype(np.float64).reshape(a.shape)
    norms = np.linalg.norm(a, axis=1)
    rows = norms > 1e-12 * max(float(norms.max(initial=0.0)), 1e-30)  # all-zero rows (a ReLU's) have no scale
    if not rows.any():
        return float(np.linalg.norm(a - b))
    return float(np.median(np.linalg.norm((a - b)[rows], axis=1) / norms[rows]))


def node_errors(reference: onnx.ModelProto, candidate: onnx.ModelProto, inputs: np.ndarray,
                top: int = TOP_NODES) -> list[dict]:
    """The ``top`` nodes of ``candidate`` that add most error, measured on ``inputs`` (a few images).

    Both graphs run with every intermediate tensor exposed. Each float tensor of ``candidate`` that holds
    a float32 tensor's value (:func:`reference_names`) gets its :func:`tensor_error` against that tensor;
    a node's ``added`` error is its output's minus the largest of its inputs' (graph inputs: 0; a
    DequantizeLinear reads its QuantizeLinear's input; weights, whose quantization error the reading GEMM
    shows, are not inputs here). So a Q/DQ pair's rounding shows on its DequantizeLinear (the pair
    on an outlier model's residual stream: every token but the outliers' rounded to zero), a float16
    rounding on the node computing in float16, and a node that amplifies the error it reads on that node.
    """
    graph_inputs = {i.name for i in reference.graph.input}
    mapping = reference_names(candidate, graph_inputs | {o for n in reference.graph.node for o in n.output})
    a = run_graph(reference, inputs, sorted(set(mapping.values()) - graph_inputs))
    b = run_graph(candidate, inputs, sorted(set(mapping) - graph_inputs))
    error = {name: 0.0 if name in graph_inputs else tensor_error(a[ref], b[name])
             for name, ref in mapping.items() if name in graph_inputs or (name in b and ref in a)}
    producers = {o: n for n in candidate.graph.node for o in n.output}
    readers: dict[str, list[str]] = {}
    for node in candidate.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    found = []
    for node in candidate.graph.node:
        outputs = [error[o] for o in node.output if o in error]
        if not outputs or node.op_type in ("Cast", "Identity"):
            continue
        read = [producers[i].input[0] if node.op_type == "DequantizeLinear" and i in producers
                and producers[i].op_type == "QuantizeLinear" else i for i in node.input]  # a DQ reads its Q's input
        reads = [error[i] for i in read if i in error]
        quantized = [producers[i].name for i in node.input if i in producers
                     and producers[i].op_type == "DequantizeLinear"]
        found.append({"node": node.name, "op": node.op_type, "error": max(outputs),
                      "inputs_error": max(reads, default=0.0), "added": max(outputs) - max(reads, default=0.0),
                      "quantized_inputs": quantized,
                      "read_by": readers.get(node.output[0], []) if node.op_type == "DequantizeLinear" else []})
    return sorted(found, key=lambda n: -n["added"])[:top]


def node_line(node: dict) -> str:
    """One named node for people."""
    through = f", reads {', '.join(node['quantized_inputs'])}" if node["quantized_inputs"] else ""
    through += f", read by {', '.join(node['read_by'])}" if node["read_by"] else ""
    return (f"{node['node']} ({node['op']}): error {node['inputs_error']:.3g} -> {node['error']:.3g} "
            f"(+{node['added']:.3g}){through}")


# the verdict
def judge(reference: onnx.ModelProto, candidate: onnx.ModelProto, precision: str, inputs: np.ndarray,
          classes: int | None, data: str, source: str, config: GateConfig | None = None,
          node_reference: onnx.ModelProto | None = None,
          reference_outputs: dict[str, np.ndarray] | None = None) -> dict:
    """The gate of ``candidate`` (``precision``: fp16 or int8) made from ``reference``: its figures,
    thresholds and verdict. Below the thresholds it raises :class:`AccuracyLoss` naming the nodes that
    add most error, unless ``config.accept_loss``: then the figures carry ``accepted_loss`` and the nodes.
    ``node_reference``: the float graph the per-node errors compare with where it is not ``reference`` (an
    int8 graph placed in a SmoothQuant-rescaled float graph: its LayerNorm outputs differ by design).
    ``reference_outputs``: ``reference``'s outputs on ``inputs`` (:func:`run_graph`), when the caller has them."""
    config = config or GateConfig()
    thresholds = THRESHOLDS[precision]
    figures = measure(reference, candidate, inputs, classes, data, reference_outputs)
    missed = failures(figures, thresholds)
    gate = {**figures, "thresholds": thresholds.to_json(), "passed": not missed, "failures": missed,
            "accepted_loss": False}
    if not missed or not figures["finite"]:  # non-finite outputs: the caller refuses them whatever the gate says
        return gate
    gate["nodes"] = node_errors(node_reference or reference, candidate, inputs[:max(config.node_images, 1)])
    if config.accept_loss:
        return {**gate, "accepted_loss": True}
    fix = ("keep the named nodes (a DequantizeLinear: its readers) out of int8 (--exclude NODE) or try another "
           "--placement or --method"
           if precision == "int8" else "keep the named nodes' op types in float32 (--keep-fp32 OP)")
    raise AccuracyLoss(
        f"the {precision} graph of {source} is below the accuracy gate against float32 on {figures['images']} test "
        f"images of {data}", gate,
        expected=f"top-1 agreement >= {thresholds.min_top1_agreement:g} and rel L2 <= {thresholds.max_rel_l2:g} "
                 f"per output ({precision}; edge.precision.gate says why)",
        found="; ".join(missed) + f"; the nodes adding most error (median rel L2 per token on "
                                  f"{len(inputs[:config.node_images])} images, its inputs' -> its output's):\n    "
              + "\n    ".join(node_line(n) for n in gate["nodes"]),
        fix=f"nothing was written; {fix}; or write it anyway with --accept-loss")


def gate_record(gate: dict) -> str:
    """What the graph records of its gate (ONNX metadata ``edge.accuracy_gate``), for ``edge bundle`` and the
    device-side gate: the images, the thresholds, the verdict, the figures per output (no per-node errors)."""
    keys = ("images", "data", "outputs", "top1_agreement", "max_abs", "mean_abs", "rel_l2", "per_output",
            "thresholds", "passed", "accepted_loss")
    return json.dumps({k: gate[k] for k in keys if k in gate}, sort_keys=True)


def read_gate_record(metadata: dict[str, str]) -> dict | None:
    """The gate figures a graph records (:func:`gate_record`), None when it records none."""
    text = metadata.get(ACCURACY_GATE)
    return json.loads(text) if text else None
