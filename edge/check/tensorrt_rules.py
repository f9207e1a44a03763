"""What TensorRT will accept, checked on the ONNX graph without TensorRT: a list of findings.

Each rule reads the graph (ONNX only: no TensorRT, no torch) and returns :class:`Finding` s (the
rule, the node, what is wrong, the fix). An empty list of errors means the graph passes:

* ``operator``: every node is an operator the target TensorRT's ONNX parser imports (onnx-tensorrt's
  support table, :mod:`edge.check.tensorrt_support`), in the default ONNX domain, or one of edge's
  plugin ops (next rule);
* ``plugin``: an edge plugin op (``TokenDepthwiseConv``, written by ``edge clean --plugins``) is not in
  onnx-tensorrt's table: the parser imports it as a plugin (op type = plugin name) once the plugin
  library is loaded (information; ``edge bundle`` ships the library's sources with such a graph); its
  domain must be edge's (``edge.plugins``: the parser ignores it, but edge's ONNX Runtime reference and
  ``onnx.checker`` find the op there), its fields must be ones the plugin's creator takes and the
  TensorRT release must import IPluginV3 plugins (10.1 on) (errors). This one rule decides on
  plugin nodes everywhere: ``edge check``, ``edge bundle``'s refusal;
* ``opset``: the default-domain opset is in the range that parser supports;
* ``ir-version``: the IR version is at least the one the opset needs (ONNX's version table,
  ``onnx.helper.find_min_ir_version_for``): a graph below it is out of the ONNX spec;
* ``input-type``: each node's data input (input 0; a Constant's value) has a type the table lists;
* ``qdq-axis``: a per-channel Q/DQ (more than one scale) names its ``axis``; a weight's is its
  reader's output-channel axis (TensorRT's explicit quantization takes per-tensor scales, or
  per-channel ones along the output channels of a weight);
* ``qdq-scale``: every scale is > 0 and finite *in its stored type* (a float16 scale that rounded
  to 0 is a finding);
* ``qdq-zero-point``: every zero point is 0 (TensorRT's int8 is symmetric);
* ``qdq-input-type``: a QuantizeLinear's input has its scale's type;
* ``gemm-alpha-beta``: Gemm has alpha = beta = 1 (what edge writes: ``linear-to-gemm`` leaves both at
  their default 1);
* ``attention-fusion`` (information, never an error): each Softmax that is the middle of an
  attention block says whether the block keeps the shape TensorRT fuses into one multi-head
  attention kernel: MatMul(Q, K^T) -> [Mul/Div by a constant] -> Softmax -> MatMul(., V), the
  MatMul inputs optionally through Q/DQ pairs, with a head size that is a multiple of 8 in
  [16, 256] (the fp16 fused kernels' range); where not, the reason.

Where TensorRT's own rules are stated: onnx-tensorrt ``docs/operators.md`` (operators, types,
"``x_zero_point`` must be zero"); TensorRT developer guide, "Explicit quantization" (scales > 0,
per-tensor or per-channel along the weights' output-channel axis, zero point 0).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edge.check.plugin_ops import DOMAIN as PLUGIN_DOMAIN
from edge.check.plugin_ops import MIN_TENSORRT, PLUGIN_OPS, PLUGIN_VERSION, read_fields
from edge.check.tensorrt_support import DEFAULT_TENSORRT, ONNX_TYPE_NAMES, PARSERS, ParserSupport, tensor_types
from edge.errors import EdgeError

ERROR, INFO = "error", "info"
RULES = ("operator", "plugin", "opset", "ir-version", "input-type", "qdq-axis", "qdq-scale", "qdq-zero-point",
         "qdq-input-type", "gemm-alpha-beta", "attention-fusion")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: head sizes TensorRT's fused fp16 multi-head attention kernels take: multiples of 8 in [16, 256]
FUSED_HEAD_SIZE = (16, 256, 8)


@dataclass(frozen=True)
class Finding:
    """One way the graph breaks a rule (``severity`` error), or a note about it (``info``)."""

    rule: str
    node: str        # the node's name (op type and index when unnamed), or "graph"
    what: str
    fix: str
    severity: str = ERROR

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"[{self.rule}] {self.node}: {self.what} (fix: {self.fix})"


@dataclass
class GraphFacts:
    """What the rules read: the model, its default opset, tensor types, producers, readers, constants."""

    model: onnx.ModelProto
    opset: int
    types: dict[str, int]
    shapes: dict[str, tuple[int, ...]]
    producers: dict[str, onnx.NodeProto]
    readers: dict[str, list[onnx.NodeProto]]
    constants: dict[str, onnx.TensorProto]

    @staticmethod
    def of(model: onnx.ModelProto) -> GraphFacts:
        graph = model.graph
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                readers[name].append(node)
        constants = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    constants[node.output[0]] = value
        inferred = _inferred(model)
        producers = {o: n for n in graph.node for o in n.output}
        return GraphFacts(model, opset, tensor_types(inferred), _static_shapes(inferred), producers,
                          readers, constants)

    def value(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)


def _inferred(model: onnx.ModelProto) -> onnx.GraphProto:
    """The graph with ONNX shape inference's types and shapes (the graph as given where inference fails)."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - inference fails on some foreign graphs: the declared tensors only
        return model.graph


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor whose dimensions are all known numbers."""
    shapes = {}
    for value in (*graph.input, *graph.output, *graph.value_info):
        kind = value.type.tensor_type
        if kind.HasField("shape") and all(d.HasField("dim_value") for d in kind.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in kind.shape.dim)
    return shapes


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def _type_name(element_type: int) -> str:
    return TensorProto.DataType.Name(element_type) if element_type else "unknown"


# --- graph-wide rules -----------------------------------------------------------------------------

def check_opset(facts: GraphFacts, parser: ParserSupport) -> list[Finding]:
    if parser.min_opset <= facts.opset <= parser.max_opset:
        return []
    return [Finding("opset", "graph", f"default-domain opset {facts.opset}; TensorRT {parser.tensorrt}'s ONNX parser "
                    f"takes opsets {parser.min_opset} to {parser.max_opset}",
                    f"export at an opset in {parser.min_opset}..{parser.max_opset} (edge export --opset 17), or "
                    f"convert with onnx.version_converter")]


def check_ir_version(facts: GraphFacts) -> list[Finding]:
    opsets = list(facts.model.opset_import)
    needed = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    if facts.model.ir_version >= needed:
        return []
    imported = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in opsets)
    return [Finding("ir-version", "graph", f"IR version {facts.model.ir_version} is below {needed}, the lowest "
                    f"ONNX allows for opsets {imported} (onnx.helper.VERSION_TABLE)",
                    f"set model.ir_version = {needed} (onnx.helper.find_min_ir_version_for(model.opset_import))")]


# --- per-node rules -------------------------------------------------------------------------------

def _release(tensorrt: str) -> tuple[int, ...]:
    return tuple(int(part) for part in tensorrt.split(".") if part.isdigit())


def check_plugin(node: onnx.NodeProto, label: str, parser: ParserSupport,
                 facts: GraphFacts | None = None) -> list[Finding]:
    """An edge plugin op: an error if it is outside edge's domain, its creator would refuse it (its attributes, or
    its input's type and shape in ``facts``) or the parser imports no V3 plugins, else a note."""
    if node.domain != PLUGIN_DOMAIN:
        return [Finding("plugin", label, f"{node.op_type} is in the domain {node.domain or '(default)'!r}: edge's "
                        f"plugin ops are in {PLUGIN_DOMAIN!r} (TensorRT's parser ignores the domain; edge's ONNX "
                        "Runtime reference and onnx.checker find the op there)",
                        "rewrite the graph with `edge clean --plugins` from the plain export (it writes the node "
                        f"in {PLUGIN_DOMAIN!r} and declares the domain)")]
    tokens = node.input[0] if node.input and facts is not None else None
    try:
        read_fields(node, tokens_type=facts.types.get(tokens) if facts and tokens else None,
                    tokens_shape=facts.shapes.get(tokens) if facts and tokens else None)
    except EdgeError as e:
        return [Finding("plugin", label, f"{e.what}: {e.found or e.expected}", e.fix or "")]
    if _release(parser.tensorrt) < MIN_TENSORRT:
        need = ".".join(map(str, MIN_TENSORRT))
        return [Finding("plugin", label, f"{node.op_type} is an IPluginV3 plugin; TensorRT {parser.tensorrt}'s ONNX "
                        f"parser imports those from {need} on", f"use TensorRT >= {need}, or clean without --plugins")]
    return [Finding("plugin", label, f"{node.op_type} v{PLUGIN_VERSION} is edge's TensorRT plugin (plugins/), not an "
                    f"operator of TensorRT {parser.tensorrt}'s ONNX support table: the parser imports it through the "
                    "plugin registry, which needs libedge_plugins.so loaded before parsing",
                    "build plugins/ for the device and load it before parsing (edge bundle ships the sources, "
                    "the runner does both; trtexec --dynamicPlugins=libedge_plugins.so), or clean without "
                    "--plugins", INFO)]


def check_operator(node: onnx.NodeProto, label: str, parser: ParserSupport,
                   facts: GraphFacts | None = None) -> list[Finding]:
    if node.op_type in PLUGIN_OPS:
        return check_plugin(node, label, parser, facts)
    if node.domain not in ("", "ai.onnx"):
        return [Finding("operator", label, f"{node.domain}::{node.op_type} is not an ONNX operator TensorRT "
                        f"{parser.tensorrt}'s parser imports",
                        "rewrite it with standard ONNX operators, or ship a TensorRT plugin of that name (--plugin)")]
    if parser.types_of(node.op_type) is None:
        return [Finding("operator", label, f"{node.op_type} is not in TensorRT {parser.tensorrt}'s ONNX support "
                        "table", "rewrite it with supported operators (edge clean), or ship a plugin (--plugin)")]
    return []


def check_input_type(node: onnx.NodeProto, label: str, facts: GraphFacts, parser: ParserSupport) -> list[Finding]:
    allowed = parser.types_of(node.op_type)
    data = node.output[0] if node.op_type == "Constant" else (node.input[0] if node.input else "")
    element_type = facts.types.get(data, 0) if data else 0
    if allowed is None or not element_type:
        return []
    name = ONNX_TYPE_NAMES.get(element_type)
    if name in allowed:
        return []
    return [Finding("input-type", label, f"{node.op_type} reads {data!r} as {_type_name(element_type)}; TensorRT "
                    f"{parser.tensorrt} takes {', '.join(allowed)} there",
                    f"cast {data!r} to one of {', '.join(allowed)} before {node.op_type}")]


def check_gemm(node: onnx.NodeProto, label: str) -> list[Finding]:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    alpha, beta = float(attributes.get("alpha", 1.0)), float(attributes.get("beta", 1.0))
    if alpha == 1.0 and beta == 1.0:
        return []
    return [Finding("gemm-alpha-beta", label, f"Gemm with alpha {alpha:g}, beta {beta:g}",
                    "fold alpha into the weight and beta into the bias (edge clean writes alpha = beta = 1)")]


def _qdq_parts(node: onnx.NodeProto) -> tuple[str, str | None]:
    return node.input[1], (node.input[2] if len(node.input) > 2 and node.input[2] else None)


def check_qdq_scale(node: onnx.NodeProto, label: str, facts: GraphFacts) -> list[Finding]:
    scale_name, _ = _qdq_parts(node)
    scale = facts.value(scale_name)
    if scale is None:
        return [Finding("qdq-scale", label, f"scale {scale_name!r} is not a constant",
                        "store the scale as an initializer (TensorRT builds Q/DQ scales at build time)")]
    bad = ~np.isfinite(scale) | (scale <= 0)
    if not bad.any():
        return []
    stored = _type_name(facts.constants[scale_name].data_type)
    return [Finding("qdq-scale", label, f"{int(bad.sum())} of {scale.size} scales in {scale_name!r} are not > 0 and "
                    f"finite as stored ({stored}; smallest {float(np.min(scale)):.3g})",
                    "keep scales > 0 in their type: store float32 scales, or clamp tiny ranges before calibrating "
                    "(a float16 scale below 6e-8 rounds to 0)")]


def check_qdq_zero_point(node: onnx.NodeProto, label: str, facts: GraphFacts) -> list[Finding]:
    _, zero_name = _qdq_parts(node)
    if zero_name is None:
        return []
    zero = facts.value(zero_name)
    if zero is not None and not np.any(zero != 0):
        return []
    what = "is not a constant" if zero is None else f"holds {int(np.count_nonzero(zero))} non-zero values"
    return [Finding("qdq-zero-point", label, f"zero point {zero_name!r} {what}",
                    "quantize symmetrically (zero point 0): calib.qdq's ActivationSymmetric/WeightSymmetric")]


def check_qdq_input_type(node: onnx.NodeProto, label: str, facts: GraphFacts) -> list[Finding]:
    if node.op_type != "QuantizeLinear":
        return []
    scale_name, _ = _qdq_parts(node)
    have, scale_type = facts.types.get(node.input[0], 0), facts.types.get(scale_name, 0)
    if not have or not scale_type or have == scale_type:
        return []
    return [Finding("qdq-input-type", label, f"QuantizeLinear reads {_type_name(have)} with a {_type_name(scale_type)} "
                    f"scale {scale_name!r}", f"store the scale as {_type_name(have)}, or cast the input to "
                    f"{_type_name(scale_type)}")]


def output_channel_axis(reader: onnx.NodeProto, index: int, rank: int) -> int | None:
    """The axis of a weight (input ``index`` of ``reader``) that indexes the reader's output channels."""
    if reader.op_type == "Conv" and index == 1:
        return 0
    if reader.op_type == "MatMul" and index == 1:
        return rank - 1
    if reader.op_type == "Gemm" and index == 1:
        trans_b = next((a.i for a in reader.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return None


def _quantized_weight(node: onnx.NodeProto, facts: GraphFacts) -> np.ndarray | None:
    """The constant weight a Q/DQ quantizes: a DQ's int8 initializer, or the float one a Q (of a Q->DQ pair) reads."""
    weight = facts.value(node.input[0])
    if weight is None and node.op_type == "DequantizeLinear":
        q = facts.producers.get(node.input[0])
        weight = facts.value(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
    return weight


def _weight_readers(node: onnx.NodeProto, facts: GraphFacts) -> list[tuple[onnx.NodeProto, str]]:
    """(reader, the tensor it reads) of the dequantized weight: a DQ's readers, or those of a Q's DQs."""
    dqs = [node] if node.op_type == "DequantizeLinear" else [
        r for r in facts.readers.get(node.output[0], []) if r.op_type == "DequantizeLinear"]
    return [(reader, dq.output[0]) for dq in dqs for reader in facts.readers.get(dq.output[0], [])]


def check_qdq_axis(node: onnx.NodeProto, label: str, facts: GraphFacts) -> list[Finding]:
    scale = facts.value(_qdq_parts(node)[0])
    if scale is None or scale.size <= 1:
        return []
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    if axis is None:
        return [Finding("qdq-axis", label, f"per-channel {node.op_type} ({scale.size} scales) without an explicit axis",
                        "write the axis attribute (the weight's output-channel axis)")]
    weight = _quantized_weight(node, facts)
    if weight is None:
        return [Finding("qdq-axis", label, f"per-channel scales ({scale.size}) on an activation",
                        "quantize activations per tensor (one scale)")]
    findings = []
    for reader, tensor in _weight_readers(node, facts):
        expected = output_channel_axis(reader, list(reader.input).index(tensor), weight.ndim)
        if expected is not None and axis % weight.ndim != expected:
            findings.append(Finding("qdq-axis", label, f"axis {axis} of a {weight.shape} weight read by "
                                    f"{reader.op_type} {reader.name!r}; its output channels are axis {expected}",
                                    f"quantize the weight per channel along axis {expected}"))
    return findings


# --- attention blocks ------------------------------------------------------------------------------

def _through_qdq(name: str, facts: GraphFacts) -> str:
    """The float tensor behind a DequantizeLinear(QuantizeLinear(x)) pair, else ``name``."""
    dq = facts.producers.get(name)
    if dq is not None and dq.op_type == "DequantizeLinear":
        q = facts.producers.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            return q.input[0]
    return name


def _head_size(matmul: onnx.NodeProto, facts: GraphFacts) -> int | None:
    shape = _static_shape(matmul.input[0], facts)
    return shape[-1] if shape else None


def _static_shape(name: str, facts: GraphFacts) -> tuple[int, ...] | None:
    constant = facts.value(name)
    return facts.shapes.get(name) or (None if constant is None else tuple(constant.shape))


def _scores_matmul(softmax: onnx.NodeProto, facts: GraphFacts) -> tuple[onnx.NodeProto | None, str | None]:
    """The MatMul(Q, K^T) feeding ``softmax`` (through one Mul/Div by a constant), or why there is none."""
    node = facts.producers.get(softmax.input[0])
    if node is not None and node.op_type in ("Mul", "Div") and any(i in facts.constants for i in node.input):
        scaled = next((i for i in node.input if i not in facts.constants), "")
        node = facts.producers.get(_through_qdq(scaled, facts))
    if node is None or node.op_type != "MatMul":
        source = node.op_type if node else "a graph input"
        return None, f"Softmax reads {source}, not MatMul(Q, K^T) (a Cast splits it?)"
    return node, None


def _context_matmul(softmax: onnx.NodeProto, facts: GraphFacts) -> tuple[onnx.NodeProto | None, str | None]:
    """The one MatMul(., V) reading ``softmax`` (through a Q->DQ pair), or why there is none."""
    readers = facts.readers.get(softmax.output[0], [])
    if len(readers) == 1 and readers[0].op_type == "QuantizeLinear":
        dq_readers = [r for out in readers[0].output for r in facts.readers.get(out, [])]
        readers = [r for dq in dq_readers for out in dq.output for r in facts.readers.get(out, [])] \
            if all(r.op_type == "DequantizeLinear" for r in dq_readers) else dq_readers
    if len(readers) != 1 or readers[0].op_type != "MatMul":
        found = ", ".join(r.op_type for r in readers) or "nothing"
        return None, f"Softmax is read by {found}, not by one MatMul(., V)"
    if _through_qdq(readers[0].input[0], facts) != softmax.output[0]:
        return None, "Softmax's output is the second input of the MatMul, not the attention weights"
    return readers[0], None


def check_attention(softmax: onnx.NodeProto, label: str, facts: GraphFacts) -> list[Finding]:
    """Information: whether the attention block around ``softmax`` keeps the shape TensorRT fuses."""
    scores, reason = _scores_matmul(softmax, facts)
    context = None
    if scores is not None:
        context, reason = _context_matmul(softmax, facts)
    if scores is not None and context is not None:
        head = _head_size(scores, facts)
        low, high, step = FUSED_HEAD_SIZE
        if head is None:
            reason = "the head size is not static"
        elif not (low <= head <= high and head % step == 0):
            reason = (f"head size {head} is outside TensorRT's fused fp16 kernels (a multiple of {step} in "
                      f"[{low}, {high}])")
        else:
            return [Finding("attention-fusion", label, f"MatMul -> Softmax -> MatMul with head size {head}: the shape "
                            "TensorRT fuses into one attention kernel", "nothing to do", INFO)]
    return [Finding("attention-fusion", label, f"attention not in the fusable shape: {reason}",
                    "keep MatMul(Q, K^T) -> [scale] -> Softmax -> MatMul(., V) free of Casts (edge quantize "
                    "--softmax fp16) and the head size a multiple of 8 in [16, 256]", INFO)]


# --- all of them -----------------------------------------------------------------------------------

def parser_support(tensorrt: str) -> ParserSupport:
    if tensorrt not in PARSERS:
        raise EdgeError(f"TensorRT {tensorrt!r} has no support table here", expected=f"one of {', '.join(PARSERS)}",
                        fix=f"pass --trt {DEFAULT_TENSORRT} (JetPack 6) or --trt 10.16 (JetPack 7.2)")
    return PARSERS[tensorrt]


def check_node(node: onnx.NodeProto, label: str, facts: GraphFacts, parser: ParserSupport) -> list[Finding]:
    findings = check_operator(node, label, parser, facts)
    if findings:
        return findings
    findings += check_input_type(node, label, facts, parser)
    if node.op_type == "Gemm":
        findings += check_gemm(node, label)
    if node.op_type in QDQ_OPS:
        for rule in (check_qdq_axis, check_qdq_scale, check_qdq_zero_point, check_qdq_input_type):
            findings += rule(node, label, facts)
    if node.op_type == "Softmax":
        findings += check_attention(node, label, facts)
    return findings


def check_model(model: onnx.ModelProto, tensorrt: str = DEFAULT_TENSORRT) -> list[Finding]:
    """Every finding of every rule on ``model`` for the ONNX parser of TensorRT ``tensorrt`` (errors and notes)."""
    parser = parser_support(tensorrt)
    facts = GraphFacts.of(model)
    findings = check_opset(facts, parser) + check_ir_version(facts)
    for index, node in enumerate(model.graph.node):
        findings += check_node(node, node_label(node, index), facts, parser)
    return findings


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == ERROR]


def check_file(path: str | Path, tensorrt: str = DEFAULT_TENSORRT) -> dict:
    """The rules on the ONNX file ``path``: a report (``passed`` when no finding is an error)."""
    path = Path(path)
    if not path.is_file():
        raise EdgeError(f"{path} does not exist", expected="an ONNX file", fix="check the path")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise EdgeError(f"{path} is not an ONNX model", found=str(e)[:300], fix="pass an .onnx file") from e
    findings = check_model(model, tensorrt)
    return {"graph": str(path), "tensorrt": tensorrt, "source": parser_support(tensorrt).source,
            "passed": not errors(findings), "errors": len(errors(findings)),
            "findings": [f.as_dict() for f in findings]}


def check_files(paths: list[str | Path], tensorrt: str = DEFAULT_TENSORRT) -> dict:
    """The rules on each ONNX file of ``paths``: one report per graph, ``passed`` when none breaks a rule."""
    parser = parser_support(tensorrt)
    reports = [check_file(path, tensorrt) for path in paths]
    return {"tensorrt": tensorrt, "opsets": [parser.min_opset, parser.max_opset], "source": parser.source,
            "passed": all(r["passed"] for r in reports), "graphs": reports}


def refusal(reports: list[dict], tensorrt: str, fix: str) -> EdgeError:
    """The error that names every graph breaking a rule and its findings (the first 10 of each)."""
    lines = []
    for report in (r for r in reports if not r["passed"]):
        found = [Finding(**f) for f in report["findings"] if f["severity"] == ERROR]
        lines += [f"{report['graph']} ({len(found)}):"] + [f"  {f.line()}" for f in found[:10]]
    return EdgeError(f"{sum(not r['passed'] for r in reports)} graph(s) break the rules of TensorRT {tensorrt}'s "
                     "ONNX parser", found="\n    " + "\n    ".join(lines), fix=fix)
