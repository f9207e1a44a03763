"""Where Q/DQ pairs go for TensorRT, and a check that a graph follows it.

Four placements, all symmetric int8 (zero point 0), per-channel weights (the output-channel
axis: the only per-channel scales TensorRT takes), per-tensor activations, Q/DQ on the *inputs*
of MatMul/Gemm/Conv, never their outputs:

``linear``: Q/DQ only on the two
inputs of the *weight GEMMs*, the MatMul/Gemm/Conv whose second input is a constant weight (a
ViT's patch-embedding Conv, qkv, proj, fc1, fc2); the attention MatMuls (two variable inputs),
the residual Adds, LayerNorm, Softmax and the head (everything downstream of the last
LayerNorm, as ``modelopt``) stay float, so the residual stream never meets a per-tensor int8
scale and TensorRT's FP16 fused attention stays usable. What pretrained ViTs' massive residual
channels break (``modelopt``'s LayerNorm inputs, ``skip``'s skip inputs) is not quantized.

``linear-sq`` (the default): ``linear`` on the graph smoothed first (SmoothQuant,
:mod:`calib.smoothquant`): the post-LayerNorm channels that one per-tensor scale serves badly are
evened out. Measured on all 10,000 test images (docs/results/int8-placements.md): within 0.2
point of float32 on the outlier model and the reference, where ``linear`` loses 1.55 points on
the outlier model and ``modelopt`` falls to 65 %.

``skip`` (TensorRT Developer Guide, "Q/DQ layer placement"): quantize the residual (skip) input
of a residual Add so the Add fuses into the epilogue of the GEMM/Conv producing its other input;
LayerNorm, Softmax and everything else read float tensors; the classifier head is quantized too.

``modelopt`` (what NVIDIA ModelOpt's ONNX INT8 quantization writes for a ViT, read
from its output on the reference graph, benchmarks/quant_peers.py): quantize the *branch* input
of a residual Add (the GEMM's result) and the residual stream where a LayerNorm reads it (the
LayerNorm reads the dequantized stream; the skip input of the next Add reads the float one);
the head (everything downstream of the last LayerNorm, a GEMV at batch 1) stays unquantized.
Fine on the reference model (docs/results/quant-peers.md); it quantizes the residual stream, which
collapses a model with massive residual channels.

ONNX Runtime's QDQ quantizer shares one Q/DQ pair between all readers of a tensor and quantizes
every input of an op it quantizes (both Add inputs, a LayerNorm's scale).
:func:`restrict_to_placement` hands every input the placement does not quantize its float
tensor back (the float graph's input of the same node) and drops the pairs nobody reads.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

GEMM_OPS = ("MatMul", "Gemm", "Conv")
PLACEMENTS = ("linear-sq", "linear", "modelopt", "skip")
#: placements that quantize the weight GEMMs only
LINEAR_PLACEMENTS = ("linear", "linear-sq")
#: ops whose output is the GEMM's result up to a constant (bias, LayerScale, reshape)
THROUGH_OPS = ("Add", "Mul", "Reshape", "Transpose", "Identity")


def _constants(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer}
    names.update(o for n in graph.node if n.op_type == "Constant" for o in n.output)
    return names


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


def is_gemm_branch(tensor: str, producers: dict[str, onnx.NodeProto], constants: set[str]) -> bool:
    """Whether ``tensor`` is a MatMul/Gemm/Conv output, possibly after bias/scale/reshape by constants."""
    seen = 0
    while tensor in producers and seen < 8:
        node = producers[tensor]
        if node.op_type in GEMM_OPS:
            return True
        if node.op_type == "DequantizeLinear":
            tensor = producers[node.input[0]].input[0] if node.input[0] in producers else node.input[0]
            continue
        if node.op_type not in THROUGH_OPS:
            return False
        variable = [i for i in node.input[:2 if node.op_type in ("Add", "Mul") else 1] if i not in constants]
        if len(variable) != 1:
            return False
        tensor, seen = variable[0], seen + 1
    return False


def residual_adds(graph: onnx.GraphProto) -> dict[str, str]:
    """Residual Adds of the float graph: node name -> the skip input to quantize.

    A residual Add has two variable inputs, exactly one of which comes from a GEMM/Conv branch;
    the other (the residual stream) is the one TensorRT wants quantized.
    """
    constants, producers = _constants(graph), _producers(graph)
    found = {}
    for node in graph.node:
        if node.op_type != "Add" or any(i in constants for i in node.input):
            continue
        branch = [is_gemm_branch(i, producers, constants) for i in node.input]
        if sum(branch) == 1:
            found[node.name] = node.input[branch.index(False)]
    return found


def weight_gemms(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The MatMul/Gemm/Conv nodes whose second input is a constant weight (not an attention MatMul)."""
    constants = _constants(graph)
    return [n for n in graph.node if n.op_type in GEMM_OPS and len(n.input) > 1 and n.input[1] in constants]


def placement_plan(graph: onnx.GraphProto, placement: str, head: frozenset[str] = frozenset()) -> dict[str, tuple]:
    """Node name -> the input indices ``placement`` quantizes (``head``: the head's node names)."""
    if placement in LINEAR_PLACEMENTS:
        return {n.name: (0, 1) for n in weight_gemms(graph) if n.name not in head}
    residual = residual_adds(graph)
    plan: dict[str, tuple] = {}
    for node in graph.node:
        if node.op_type in GEMM_OPS and not (placement == "modelopt" and node.name in head):
            plan[node.name] = tuple(range(len(node.input)))[:2]
        elif node.name in residual:
            skip = list(node.input).index(residual[node.name])
            plan[node.name] = (skip,) if placement == "skip" else (1 - skip,)
        elif placement == "modelopt" and node.op_type == "LayerNormalization" and node.name not in head:
            plan[node.name] = (0,)
    return plan


def _quantized_source(dq: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> str | None:
    """The float tensor an activation Q->DQ pair rounds (None for a weight: DQ of an int8 initializer)."""
    q = producers.get(dq.input[0])
    return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else None


def restrict_to_placement(model: onnx.ModelProto, plan: dict[str, tuple], float_model: onnx.ModelProto) -> dict:
    """Give every input that ``plan`` does not quantize its float tensor back; drop unread Q/DQ pairs."""
    graph = model.graph
    producers = _producers(graph)
    float_nodes = {n.name: n for n in float_model.graph.node}
    float_weights = {t.name: t for t in float_model.graph.initializer}
    present = {t.name for t in graph.initializer}
    rewired = 0
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for i, name in enumerate(node.input):
            dq = producers.get(name)
            if dq is None or dq.op_type != "DequantizeLinear" or i in plan.get(node.name, ()):
                continue
            node.input[i] = original = float_nodes[node.name].input[i]
            if original in float_weights and original not in present:  # a weight quantized for a float reader
                graph.initializer.append(float_weights[original])
                present.add(original)
            rewired += 1
    removed = _drop_unread(model)
    return {"rewired_to_float": rewired, "qdq_nodes_removed": removed}


def _drop_unread(model: onnx.ModelProto) -> int:
    graph = model.graph
    outputs = {o.name for o in graph.output}
    removed = 0
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(o in read for o in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
        removed += len(dead)
    read = {i for n in graph.node for i in n.input} | outputs
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)
    return removed


def qdq_violations(model: onnx.ModelProto, placement: str = "skip") -> list[str]:
    """Every way the graph breaks TensorRT's Q/DQ rules and ``placement`` (an empty list: it follows them).

    A Cast between a DQ and its reader is looked through. Checks: each Q/DQ is int8 with every
    zero point 0; per-channel scales sit on weights only;
    a DQ output is read only by MatMul/Gemm/Conv, or by a residual Add on its skip input
    (``skip``) or its branch input and by a LayerNormalization's input (``modelopt``); for
    ``linear`` and ``linear-sq`` only by a MatMul/Gemm/Conv whose second input is a constant
    weight (no attention MatMul, no Add); no Q/DQ on a Softmax input; a GEMM's output is
    quantized only as a residual Add's branch input (``modelopt``) or as a weight GEMM's input (the
    attention's output read by ``proj``, ``linear``), never by ``skip``.
    """
    linear = placement in LINEAR_PLACEMENTS
    allowed_readers = GEMM_OPS if linear else \
        (*GEMM_OPS, "Add") + (("LayerNormalization",) if placement == "modelopt" else ())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = _producers(graph)
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    residual = residual_adds(_float_view(model))
    weighted = {n.name for n in graph.node if _reads_weight(n, inits, producers)}
    problems = []
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if len(node.input) < 3 or node.input[2] not in inits:
            problems.append(f"{node.name}: no constant zero point")
            continue
        zero_point = inits[node.input[2]]
        if zero_point.data_type != TensorProto.INT8:
            problems.append(f"{node.name}: zero point type {TensorProto.DataType.Name(zero_point.data_type)}, not INT8")
        if np.any(numpy_helper.to_array(zero_point) != 0):
            problems.append(f"{node.name}: non-zero zero point")
        scale = numpy_helper.to_array(inits[node.input[1]]) if node.input[1] in inits else None
        is_weight = node.op_type == "DequantizeLinear" and node.input[0] in inits
        if scale is not None and scale.size > 1 and not is_weight:
            problems.append(f"{node.name}: per-channel scale on an activation")
        if node.op_type == "QuantizeLinear":
            source = producers.get(node.input[0])
            if source is not None and source.op_type in GEMM_OPS and placement == "skip":
                problems.append(f"{node.name}: quantizes the output of {source.op_type} {source.name}")
            continue
        for tensor, reader in _readers_through_casts(node.output[0], readers):
            index = list(reader.input).index(tensor)
            if reader.op_type not in allowed_readers or (reader.op_type == "LayerNormalization" and index != 0):
                problems.append(f"{node.name}: read by {reader.op_type} {reader.name}")
            elif linear and reader.name not in weighted:
                problems.append(f"{node.name}: read by {reader.op_type} {reader.name}, which has no constant "
                                f"weight (an attention MatMul: {placement} leaves it float)")
            elif reader.op_type == "Add":
                is_skip = residual.get(reader.name) == _quantized_source(node, producers)
                if reader.name not in residual or is_skip != (placement == "skip"):
                    wanted = "skip" if placement == "skip" else "branch"
                    problems.append(f"{node.name}: on an Add input that is not a residual {wanted} input")
    return problems


def _readers_through_casts(tensor: str, readers: dict[str, list[onnx.NodeProto]]) -> list[tuple[str, onnx.NodeProto]]:
    """(tensor read, reader) for each reader of ``tensor``, looking through Casts (a float16 DQ cast to float32
    for a float32 LayerNorm, :mod:`edge.precision.fp16`'s form for NVIDIA/TensorRT#4832)."""
    found = []
    for reader in readers[tensor]:
        if reader.op_type == "Cast":
            found.extend(_readers_through_casts(reader.output[0], readers))
        else:
            found.append((tensor, reader))
    return found


def _reads_weight(node: onnx.NodeProto, inits: dict, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether a GEMM's second input is a weight: an initializer, or a DQ of an int8 initializer."""
    if node.op_type not in GEMM_OPS or len(node.input) < 2:
        return False
    second = node.input[1]
    dq = producers.get(second)
    return second in inits or (dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits)


def _float_view(model: onnx.ModelProto) -> onnx.GraphProto:
    """The graph with every activation Q->DQ pair bypassed (to find residual Adds as in the float graph)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    producers = _producers(graph)
    for node in graph.node:
        for i, name in enumerate(node.input):
            dq = producers.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                source = _quantized_source(dq, producers)
                if source is not None:
                    node.input[i] = source
    return graph
