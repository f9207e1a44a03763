"""Where Q/DQ pairs go for TensorRT, and a check that a graph follows it.

TensorRT's explicit-quantization rules (Developer Guide, "Q/DQ layer placement"): quantize the
*inputs* of MatMul/Gemm/Conv, not their outputs; quantize the residual (skip) input of a residual
Add so the Add fuses into the epilogue of the GEMM/Conv producing its other input; leave
LayerNorm, Softmax and everything else reading float tensors. Symmetric int8 (zero point 0),
per-channel weights (the output-channel axis), per-tensor activations.

ONNX Runtime's QDQ quantizer shares one Q/DQ pair between all readers of a tensor, so a tensor
read by a MatMul and a LayerNorm hands the LayerNorm a dequantized (rounded) input, and it puts
a pair on both inputs of an Add. ``restrict_to_tensorrt_placement`` rewires every other reader
back to the float tensor and drops the pairs nobody reads any more.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

GEMM_OPS = ("MatMul", "Gemm", "Conv")
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


def _quantized_source(dq: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> str | None:
    """The float tensor an activation Q->DQ pair rounds (None for a weight: DQ of an int8 initializer)."""
    q = producers.get(dq.input[0])
    return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else None


def restrict_to_tensorrt_placement(model: onnx.ModelProto, residual: dict[str, str]) -> dict:
    """Rewire readers that TensorRT wants float back to the float tensor; drop unread Q/DQ pairs."""
    graph = model.graph
    producers = _producers(graph)
    rewired = 0
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for i, name in enumerate(node.input):
            dq = producers.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            source = _quantized_source(dq, producers)
            if source is None:
                continue  # weights stay quantized for the node that owns them
            keep = node.op_type in GEMM_OPS or (node.name in residual and residual[node.name] == source)
            if not keep:
                node.input[i] = source
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


def qdq_violations(model: onnx.ModelProto, allowed_readers: tuple[str, ...] = (*GEMM_OPS, "Add")) -> list[str]:
    """Every way the graph breaks TensorRT's Q/DQ rules (an empty list: it follows them).

    Checks: each Q/DQ is int8 with every zero point 0; per-channel scales sit on weights only;
    a DQ output is read only by MatMul/Gemm/Conv, or by a residual Add on its skip input; no Q/DQ
    on a LayerNormalization or Softmax input, nor on a GEMM's output.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = _producers(graph)
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    residual = residual_adds(_float_view(model))
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
            if source is not None and source.op_type in GEMM_OPS:
                problems.append(f"{node.name}: quantizes the output of {source.op_type} {source.name}")
            continue
        for reader in readers[node.output[0]]:
            if reader.op_type not in allowed_readers:
                problems.append(f"{node.name}: read by {reader.op_type} {reader.name}")
            elif reader.op_type == "Add":
                source = _quantized_source(node, producers)
                if residual.get(reader.name) != source:
                    problems.append(f"{node.name}: on an Add input that is not a residual skip input")
    return problems


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
