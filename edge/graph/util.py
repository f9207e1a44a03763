"""Small onnx-graphsurgeon helpers shared by the passes."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs


def constant_value(tensor) -> np.ndarray | None:
    """The value of a Constant tensor (or of a Constant node's output), else None."""
    if isinstance(tensor, gs.Constant):
        return tensor.values
    if len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        return value.values if isinstance(value, gs.Constant) else None
    return None


def only_consumer(tensor) -> gs.Node | None:
    """The single node consuming ``tensor``, or None (several consumers, or a graph output)."""
    return tensor.outputs[0] if len(tensor.outputs) == 1 else None


def is_graph_output(graph: gs.Graph, tensor) -> bool:
    return any(out is tensor for out in graph.outputs)


def successor(graph: gs.Graph, node: gs.Node) -> gs.Node | None:
    """The single node reading ``node``'s first output, or None (several readers, or a graph output)."""
    if not node.outputs or is_graph_output(graph, node.outputs[0]):
        return None
    return only_consumer(node.outputs[0])


def same_op_pairs(graph: gs.Graph, op: str):
    """Yield (first, second): two ``op`` nodes where second is first's only reader."""
    for first in list(graph.nodes):
        if first.op == op and first.outputs:
            second = successor(graph, first)
            if second is not None and second.op == op:
                yield first, second


def detach(node: gs.Node) -> None:
    """Disconnect a node; ``graph.cleanup()`` then removes it."""
    node.inputs.clear()
    node.outputs.clear()


def bypass(graph: gs.Graph, node: gs.Node, keep: int = 0) -> None:
    """Remove a node whose output equals its input ``keep``: consumers read that input instead.

    If the node's output is a graph output, the output keeps its name: the producer of the
    kept input writes it directly (when the kept input has no other use).
    """
    source, result = node.inputs[keep], node.outputs[0]
    if is_graph_output(graph, result):
        producer = source.inputs[0] if len(source.inputs) == 1 else None
        if producer is None or len(source.outputs) != 1 or is_graph_output(graph, source):
            return  # cannot keep the output name; leave the node
        producer.outputs[producer.outputs.index(source)] = result
        detach(node)
        return
    for consumer in list(result.outputs):
        for i, tensor in enumerate(consumer.inputs):
            if tensor is result:
                consumer.inputs[i] = source
    detach(node)


def static_shape(tensor) -> tuple[int, ...] | None:
    shape = getattr(tensor, "shape", None)
    if shape is None or any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def infer_shapes(graph: gs.Graph) -> None:
    """Annotate the graph's variables with ONNX shape inference (dtype and static shape where known).

    onnx-graphsurgeon does not infer shapes itself; its constant folding folds ``Shape`` only of
    tensors whose shape is annotated. Annotations already present are kept.
    """

    model = gs.export_onnx(graph, do_type_check=False)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    tensors = graph.tensors()
    for info in inferred.graph.value_info:
        tensor = tensors.get(info.name)
        if not isinstance(tensor, gs.Variable) or tensor.shape is not None:
            continue
        kind = info.type.tensor_type
        if not kind.HasField("shape"):
            continue
        tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type) if kind.elem_type else tensor.dtype
        tensor.shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in kind.shape.dim]


def _producer(tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def erf_gelu_nodes(graph: gs.Graph) -> set[int]:
    """ids of the Mul/Div nodes of every erf GELU: x * 0.5 * (1 + erf(x / sqrt(2))), in either order.

    ONNX Runtime (Gelu) and TensorRT fuse this exact pattern; folding its 0.5 into the next
    MatMul would save one node and cost the fused kernel, so scale folding leaves these alone.
    """
    protected: set[int] = set()
    for erf in graph.nodes:
        if erf.op != "Erf" or not erf.outputs:
            continue
        before = _producer(erf.inputs[0])
        add = successor(graph, erf)
        if before is None or before.op not in ("Div", "Mul") or add is None or add.op != "Add":
            continue
        mul = successor(graph, add)
        if mul is None or mul.op != "Mul":
            continue
        protected.update({id(before), id(mul)})
        after = successor(graph, mul)
        if after is not None and after.op in ("Mul", "Div"):  # (x * (1 + erf)) * 0.5
            protected.add(id(after))
        for tensor in mul.inputs:  # (x * 0.5) * (1 + erf)
            source = _producer(tensor)
            if source is not None and source is not add and source.op in ("Mul", "Div"):
                protected.add(id(source))
    return protected
