"""FP16 conversion for strongly typed TensorRT networks: float16 everywhere except float32 islands.

A strongly typed TensorRT network (the only kind TensorRT 11 builds) takes every tensor's type
from the ONNX graph, so the precision has to be baked into the graph. This pass:

* assigns each node float16 or float32: nodes whose op is in the block list (LayerNormalization
  and the reductions by default; Softmax when ``softmax="float32"``) and, optionally, the head
  (every node downstream of the last LayerNormalization: final norm, pooling, classifier) stay
  float32; all other nodes that compute on floats become float16;
* in a Q/DQ (int8) graph, each QuantizeLinear/DequantizeLinear pair takes the precision of the
  node that reads it, so a DQ feeds its MatMul directly (the scales follow; float16 scales need
  opset 19, which :mod:`calib.qdq` asks for); except a pair whose scale float16 cannot hold: a
  constant scale below float16's smallest normal number (6.1e-5; smaller ones become subnormals
  with a few significant bits, or 0) keeps its Q/DQ nodes, and so the scale, in float32, a Cast
  after the DQ where a float16 node reads it (:func:`underflowing_qdq_scales`, reported as
  ``qdq_scales_fp32``); and a pair whose readers are all float32 islands other than a GEMM (the
  LayerNorm inputs of the ``modelopt`` placement) is float16 too, a Cast to float32 after the DQ
  (``dq_output_fp16``, the default: TensorRT 10.16 on SM 8.7 fails to compile an int8
  DequantizeLinear with float32 output, NVIDIA/TensorRT#4832; the Cast costs what the Cast before
  the Q cost in the float32 form). A DQ read by a float32 GEMM (the ``skip`` placement's head)
  stays float32, so TensorRT can still fuse it into that GEMM;
* stores each float weight once in the precision of its readers (a weight read by both gets a
  float16 copy beside the float32 one, never a Cast);
* inserts a Cast only where a tensor crosses from one precision to the other: one Cast per
  (tensor, target type), shared by all readers, so consecutive float32 nodes form one island;
* keeps the graph's inputs and outputs float32 (a Cast right after the input and before the
  output), so callers feed and read the same arrays as before.

Why our own pass rather than onnxconverter-common's ``convert_float_to_float16``: on the reference
model both give about the same number of Casts (74 here, 76 there), but the converter silently
rewrites small weights to +-1e-7 (values TensorRT represents as float16 subnormals), needs the
head named node by node, and casts Shape inputs; this pass shares one Cast per boundary tensor,
stores each weight in its readers' precision and finds the head itself. benchmarks/precision.py
records both Cast counts.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edge.check.tensorrt_support import tensor_types
from edge.errors import EdgeError

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = float(np.finfo(np.float16).max)
#: float16's smallest normal number (6.1e-5): below it a value keeps fewer than 11 significant bits, or becomes 0
FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).smallest_normal)

#: ops kept in float32 by default: normalisations and reductions (accumulations overflow in fp16); Softmax: SOFTMAX
DEFAULT_BLOCK_LIST = ("LayerNormalization", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare",
                      "ReduceL2", "ReduceLogSumExp", "ReduceProd", "Pow", "Sqrt", "CumSum", "TopK", "NonMaxSuppression",
                      "Range", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial")
#: (op, input index) that ONNX requires to be float32 whatever the node's precision
FLOAT32_ONLY_INPUTS = {("Resize", 2), ("Upsample", 1)}
#: ops that read any type and whose output does not depend on it: their input is never cast
TYPE_AGNOSTIC = {"Shape", "Size"}


#: Softmax precision choices. Between the two attention MatMuls a float32 Softmax puts two Casts in
#: the MatMul-Softmax-MatMul chain that TensorRT fuses into one attention kernel; ModelOpt keeps it
#: float16. SOFTMAX_DEFAULT and the accuracy behind it: docs/results/quant-peers.md.
SOFTMAX_PRECISIONS = ("float16", "float32")
SOFTMAX_DEFAULT = "float16"
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
GEMM_OPS = ("MatMul", "Gemm", "Conv")


@dataclass
class Fp16Config:
    block_list: tuple[str, ...] = DEFAULT_BLOCK_LIST
    keep_head_fp32: bool = True
    node_block_list: tuple[str, ...] = ()  # node names kept float32 in addition to the ops above
    keep_io_types: bool = True
    softmax: str = SOFTMAX_DEFAULT         # float16 | float32
    #: a DQ read only by float32 non-GEMM nodes outputs float16 and a Cast follows (False: float32 output)
    dq_output_fp16: bool = True

    def check(self) -> None:
        if self.softmax not in SOFTMAX_PRECISIONS:
            raise EdgeError(f"Softmax precision {self.softmax!r} is unknown",
                            expected=f"one of {', '.join(SOFTMAX_PRECISIONS)}", fix="pass --softmax fp16 or fp32")

    def fp32_ops(self) -> tuple[str, ...]:
        """The op types kept in float32: the block list, and Softmax when asked."""
        return tuple(sorted(set(self.block_list) | ({"Softmax"} if self.softmax == "float32" else set())))

    def softmax_precision(self) -> str:
        return "float32" if "Softmax" in self.fp32_ops() else "float16"


@dataclass
class Fp16Report:
    nodes_fp16: int = 0
    nodes_fp32: int = 0
    casts: int = 0
    weights_converted: int = 0
    weights_duplicated: int = 0
    clipped_values: int = 0
    fp32_nodes: list[str] = field(default_factory=list)
    qdq_scales_fp32: list[dict] = field(default_factory=list)  # Q/DQ scales float16 cannot hold, kept float32
    dq_fp32_outputs: list[str] = field(default_factory=list)  # int8 DQs writing float32 (NVIDIA/TensorRT#4832)

    def as_dict(self) -> dict:
        return {"nodes_fp16": self.nodes_fp16, "nodes_fp32": self.nodes_fp32, "casts": self.casts,
                "weights_converted": self.weights_converted, "weights_duplicated": self.weights_duplicated,
                "clipped_values": self.clipped_values, "fp32_nodes": self.fp32_nodes,
                "qdq_scales_fp32": self.qdq_scales_fp32, "dq_fp32_outputs": self.dq_fp32_outputs}


def float_tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type, for inputs, outputs, inferred intermediates, weights and Constants."""
    return tensor_types(onnx.shape_inference.infer_shapes(model, strict_mode=False).graph)

def head_nodes(graph: onnx.GraphProto) -> set[str]:
    """Names of the nodes downstream of the last LayerNormalization (final norm, pooling, classifier)."""
    norms = [n for n in graph.node if n.op_type == "LayerNormalization"]
    if not norms:
        return set()
    readers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    seen = {norms[-1].name}
    frontier = list(norms[-1].output)
    while frontier:
        for node in readers[frontier.pop()]:
            if node.name not in seen:
                seen.add(node.name)
                frontier.extend(node.output)
    return seen


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node a unique name (``OP_i``): the names reports and node block lists use."""
    used = {n.name for n in graph.node if n.name}
    for i, node in enumerate(graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)


def _to_half(array: np.ndarray, report: Fp16Report) -> np.ndarray:
    finite = np.isfinite(array)
    clipped = int(np.count_nonzero(finite & (np.abs(array) > FP16_MAX)))
    report.clipped_values += clipped
    return np.clip(array, -FP16_MAX, FP16_MAX).astype(np.float16) if clipped else array.astype(np.float16)


def _convert_attributes(node: onnx.NodeProto, report: Fp16Report) -> None:
    """Attributes that carry a float type or a float tensor follow the node into float16."""
    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i == FLOAT:
            attr.i = HALF
        elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:
            attr.t.CopyFrom(numpy_helper.from_array(_to_half(numpy_helper.to_array(attr.t), report), attr.t.name))


def float32_output_dqs(model: onnx.ModelProto) -> list[str]:
    """The DequantizeLinear nodes whose output is float32: what TensorRT 10.16 on SM 8.7 fails to compile
    from int8 (NVIDIA/TensorRT#4832). A DQ's output type is its scale's (input 1)."""
    types = float_tensor_types(model)
    return [n.name for n in model.graph.node if n.op_type == "DequantizeLinear" and types.get(n.input[1]) == FLOAT]


def underflowing_qdq_scales(graph: onnx.GraphProto) -> list[dict]:
    """The constant Q/DQ scales float16 cannot hold: ``{"scale", "min_abs", "nodes"}`` for each scale
    with a value whose magnitude is below :data:`FP16_SMALLEST_NORMAL` (0 included)."""
    constants = {t.name: t for t in graph.initializer}
    found: dict[str, dict] = {}
    for node in graph.node:
        if node.op_type not in QDQ_OPS or len(node.input) < 2 or node.input[1] not in constants:
            continue
        scale = numpy_helper.to_array(constants[node.input[1]])
        smallest = float(np.abs(scale).min()) if scale.size else 0.0
        if scale.dtype == np.float32 and smallest < FP16_SMALLEST_NORMAL:
            entry = found.setdefault(node.input[1], {"scale": node.input[1], "min_abs": smallest, "nodes": []})
            entry["nodes"].append(node.name)
    return list(found.values())


def _qdq_follow_readers(graph: onnx.GraphProto, node_type: dict[str, int], fp32_scales: set[str],
                        dq_output_fp16: bool = True) -> None:
    """A DequantizeLinear takes its readers' precision (float16 if any reads float16), a QuantizeLinear its DQ's;
    a Q/DQ whose scale is in ``fp32_scales`` stays float32. With ``dq_output_fp16`` a DQ read only by
    float32 nodes none of which is a GEMM is float16 too (a Cast to float32 follows it)."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    for node in reversed(graph.node):  # readers come later in a topologically sorted graph
        if node.op_type in QDQ_OPS:
            wanted = {node_type.get(r.name, FLOAT) for r in readers[node.output[0]]}
            kept = len(node.input) > 1 and node.input[1] in fp32_scales
            no_gemm = all(r.op_type not in GEMM_OPS for r in readers[node.output[0]])
            half = HALF in wanted or (dq_output_fp16 and node.op_type == "DequantizeLinear" and no_gemm)
            node_type[node.name] = HALF if half and not kept else FLOAT


def convert_to_fp16(model: onnx.ModelProto, config: Fp16Config | None = None) -> tuple[onnx.ModelProto, Fp16Report]:
    """A float16 copy of ``model`` with float32 islands (see the module docstring)."""
    config = config or Fp16Config()
    config.check()
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    name_nodes(graph)
    types = float_tensor_types(model)
    report = Fp16Report()
    blocked_names = set(config.node_block_list) | (head_nodes(graph) if config.keep_head_fp32 else set())

    def is_float(name: str) -> bool:
        return bool(name) and types.get(name) == FLOAT

    # 1. precision of every node that computes on floats
    node_type: dict[str, int] = {}
    fp32_ops = set(config.fp32_ops())
    for node in graph.node:
        if not any(is_float(t) for t in (*node.input, *node.output)) and node.op_type != "Cast":
            continue
        node_type[node.name] = FLOAT if node.op_type in fp32_ops or node.name in blocked_names else HALF
    report.qdq_scales_fp32 = underflowing_qdq_scales(graph)
    _qdq_follow_readers(graph, node_type, {entry["scale"] for entry in report.qdq_scales_fp32}, config.dq_output_fp16)
    report.fp32_nodes = [n.name for n in graph.node if node_type.get(n.name) == FLOAT]
    report.nodes_fp32 = sum(1 for t in node_type.values() if t == FLOAT)
    report.nodes_fp16 = sum(1 for t in node_type.values() if t == HALF)

    # 2. where each float tensor lives (the precision its producer writes)
    home: dict[str, int] = {}
    inputs = {v.name for v in graph.input}
    for name in inputs:
        if is_float(name):
            home[name] = FLOAT if config.keep_io_types else HALF
    producer_of: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for out in node.output:
            producer_of[out] = node
            if is_float(out):
                home[out] = node_type.get(node.name, FLOAT)

    # 3. weights: in the precision of their float readers; a copy when both read them
    initializers = {t.name: t for t in graph.initializer if t.data_type == FLOAT}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers[name].append((node, i))

    def wanted(node: onnx.NodeProto, index: int) -> int:
        if (node.op_type, index) in FLOAT32_ONLY_INPUTS:
            return FLOAT
        if node.op_type in TYPE_AGNOSTIC:
            return home.get(node.input[index], FLOAT)
        return node_type.get(node.name, FLOAT)

    new_initializers = []
    for name, tensor in initializers.items():
        needs = {wanted(n, i) for n, i in readers[name]}
        if needs == {HALF}:
            tensor.CopyFrom(numpy_helper.from_array(_to_half(numpy_helper.to_array(tensor), report), name))
            home[name] = HALF
            report.weights_converted += 1
        elif needs == {FLOAT, HALF}:
            half_name = f"{name}_fp16"
            new_initializers.append(numpy_helper.from_array(_to_half(numpy_helper.to_array(tensor), report),
                                                            half_name))
            for n, i in readers[name]:
                if wanted(n, i) == HALF:
                    n.input[i] = half_name
            home[name] = FLOAT
            report.weights_duplicated += 1
        else:
            home[name] = FLOAT
    graph.initializer.extend(new_initializers)

    # 4. attributes of float16 nodes (Cast targets, Constant values)
    for node in graph.node:
        if node_type.get(node.name) == HALF:
            _convert_attributes(node, report)

    # 5. graph outputs stay float32 when asked: the producer writes NAME_fp16, a Cast restores NAME
    casts: list[tuple[int, onnx.NodeProto]] = []
    order = {node.name: i for i, node in enumerate(graph.node)}
    if config.keep_io_types:
        for out in graph.output:
            if is_float(out.name) and home.get(out.name) == HALF:
                producer = producer_of[out.name]
                inner = f"{out.name}_fp16"
                producer.output[list(producer.output).index(out.name)] = inner
                for n, i in readers[out.name]:
                    n.input[i] = inner
                home[inner] = HALF
                cast = helper.make_node("Cast", [inner], [out.name], name=f"{out.name}_to_fp32", to=FLOAT)
                casts.append((order[producer.name] + 1, cast))
    else:
        for v in (*graph.input, *graph.output):
            if is_float(v.name):
                v.type.tensor_type.elem_type = HALF

    # 6. a Cast on every edge between precisions, one per (tensor, target), shared by the readers
    made: dict[tuple[str, int], str] = {}
    for node in list(graph.node):
        for i, name in enumerate(node.input):
            if not is_float(name) and name not in home:
                continue
            source = home.get(name)
            target = wanted(node, i)
            if source is None or source == target:
                continue
            key = (name, target)
            if key not in made:
                suffix = "fp16" if target == HALF else "fp32"
                made[key] = f"{name}_to_{suffix}"
                cast = helper.make_node("Cast", [name], [made[key]], name=f"{name}_cast_{suffix}", to=target)
                position = order[producer_of[name].name] + 1 if name in producer_of else 0
                casts.append((position, cast))
            node.input[i] = made[key]
    report.casts = len(casts)

    # insert the Casts right after their producers, keeping the graph topologically sorted
    nodes = list(graph.node)
    by_position: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    for position, cast in casts:
        by_position[position].append(cast)
    ordered = []
    for i in range(len(nodes) + 1):
        ordered.extend(by_position.get(i, []))
        if i < len(nodes):
            ordered.append(nodes[i])
    del graph.node[:]
    graph.node.extend(ordered)
    del graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    report.dq_fp32_outputs = float32_output_dqs(model)
    if report.clipped_values:
        warnings.warn(f"{report.clipped_values} weight values beyond the float16 range were clipped to +-{FP16_MAX}",
                      stacklevel=2)
    return model, report
