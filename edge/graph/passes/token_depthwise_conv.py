"""Each depthwise mixer of edge's dwconv blocks becomes one ``TokenDepthwiseConv`` plugin node (opt-in).

Off by default: ``edge clean --plugins`` adds it (:data:`edge.graph.passes.PLUGIN_PASSES`). The
graph it writes needs edge's TensorRT plugin (``plugins/tokenDepthwiseConv/``) wherever it is
built; ONNX Runtime runs it here with the plugin's numpy reference (:mod:`edge.check.plugin_ops`).

What it replaces, V being the value projection's output ``[B, P + H*W, C]`` (the export of
``DepthwiseAttention`` after the default passes); the Linear before and after stay:

* the patch path: ``Reshape [B, H, W, C] -> Transpose (NCHW) -> Conv (group = C, k x k, odd k,
  zero padding k // 2, stride 1) -> Transpose (NHWC) -> Reshape [B, H*W, C]``;
* ``prefix=drop`` (or a model without prefix tokens): that path alone, read from V; the node gets
  ``prefix_tokens=0``;
* ``prefix=pool``: the path reads ``Slice(V, P:)`` and is concatenated (axis 1) after
  ``ReduceSum(Mul(Unsqueeze(V, 1), prefix_weights), axis 2)``, ``prefix_weights`` a constant
  ``[P, P + H*W, C]``;
* ``prefix=mean``: the value projection reads the patch tokens only (``Slice(x, P:)``) and the
  prefix outputs are the same projection of ``ReduceMean(Slice(x, P:), axis 1)`` (expanded to P
  rows when P > 1), concatenated before the patches. The projection then moves before the Slice:
  it projects all ``P + H*W`` tokens (P rows more of one MatMul) and its copy on the mean goes,
  since the plugin takes the mean of the patch tokens' V (V is affine, so the two are equal).

Left as they are, with a note that names the convolution: a mixer whose prefix outputs are
anything else, in particular ``prefix=attend`` (attention of the prefix queries over all tokens,
which needs q and k, not V); and a depthwise convolution whose layout round trip, padding,
stride or dilation is not the one above.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from edge.check.plugin_ops import DOMAIN, DOMAIN_VERSION, TOKEN_DEPTHWISE_CONV, TokenDepthwiseFields
from edge.graph.graph_pass import PassResult
from edge.graph.util import constant_value, infer_shapes, is_graph_output

NAME = "token-depthwise-conv"


@dataclass
class Mixer:
    """One depthwise mixer found in the graph: the tokens it reads, what it computes, the tensor it writes."""

    tokens: gs.Variable                     # V over all tokens (or over the patches, P = 0)
    fields: TokenDepthwiseFields
    output: gs.Variable
    conv: gs.Node
    new_nodes: list[gs.Node] = field(default_factory=list)   # a value projection moved before the Slice (mean)


def _producer(tensor, ops: tuple[str, ...]) -> gs.Node | None:
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1 and tensor.inputs[0].op in ops:
        return tensor.inputs[0]
    return None


def _only_reader(graph: gs.Graph, tensor, op: str) -> gs.Node | None:
    if is_graph_output(graph, tensor) or len(tensor.outputs) != 1 or tensor.outputs[0].op != op:
        return None
    return tensor.outputs[0]


def _ints(tensor) -> list[int] | None:
    value = constant_value(tensor)
    return None if value is None or not np.issubdtype(value.dtype, np.integer) else [int(v) for v in value.reshape(-1)]


def _dims(tensor) -> tuple | None:
    shape = getattr(tensor, "shape", None)
    return None if shape is None else tuple(shape)


def _token_layout(tensor, tokens: int, channels: int) -> bool:
    """Whether ``tensor`` is known to be ``[B, tokens, channels]``."""
    dims = _dims(tensor)
    return dims is not None and len(dims) == 3 and tuple(dims[1:]) == (tokens, channels)


def _depthwise(conv: gs.Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(weight [C, 1, k, k], bias) of a depthwise Conv with odd k, zero padding k // 2, stride 1, dilation 1."""
    weight = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is None or weight.ndim != 4 or weight.shape[1] != 1 or weight.shape[2] != weight.shape[3]:
        return None
    channels, k = int(weight.shape[0]), int(weight.shape[2])
    attrs = conv.attrs
    padding = attrs.get("auto_pad", "NOTSET")
    if k % 2 == 0 or int(attrs.get("group", 1)) != channels or padding not in ("NOTSET", b"NOTSET"):
        return None
    if list(attrs.get("kernel_shape", [k, k])) != [k, k] or list(attrs.get("pads", [0] * 4)) != [k // 2] * 4:
        return None
    steps = [*attrs.get("strides", [1, 1]), *attrs.get("dilations", [1, 1])]
    if any(int(step) != 1 for step in steps):
        return None
    bias = constant_value(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2].name else None
    if len(conv.inputs) > 2 and conv.inputs[2].name and bias is None:
        return None
    return weight, None if bias is None else bias.reshape(-1)


def _static(dims: tuple | None, rank: int) -> bool:
    """Whether ``dims`` has ``rank`` entries, every one after the first a known size."""
    return dims is not None and len(dims) == rank and all(isinstance(d, (int, np.integer)) and d > 0 for d in dims[1:])


def _read_from_shape(part, source) -> list | None:
    """``[("dim", i), ...]`` for a part of a shape tensor read from ``Shape(source)``: a Slice of it, or
    ``Unsqueeze(Gather(...))``; None otherwise."""
    unsqueeze = _producer(part, ("Unsqueeze",))
    read = _producer(unsqueeze.inputs[0], ("Gather",)) if unsqueeze is not None else _producer(part, ("Slice",))
    shape = _producer(read.inputs[0], ("Shape",)) if read is not None else None
    if shape is None or shape.inputs[0] is not source:
        return None
    if read.op == "Gather":
        index = _ints(read.inputs[1])
        return None if index is None else [("dim", i) for i in index]
    start, end = _ints(read.inputs[1]), _ints(read.inputs[2])
    axes = _ints(read.inputs[3]) if len(read.inputs) > 3 else [0]
    steps = _ints(read.inputs[4]) if len(read.inputs) > 4 else [1]
    if start is None or end is None or axes != [0] or steps != [1]:
        return None
    return [("dim", i) for i in range(start[0], min(end[0], len(_dims(source) or ())))]


def _shape_entries(shape, source) -> list | None:
    """The entries of a Reshape's shape tensor: numbers, or ``("dim", i)`` for dimension i of ``source`` read
    through Shape (a dynamic batch: ``Concat(Slice(Shape(source), 0, 1), [-1], ...)``); None if unknown."""
    value = _ints(shape)
    concat = _producer(shape, ("Concat",))
    if value is not None or concat is None:
        return value
    entries: list = []
    for part in concat.inputs:
        read = _ints(part)
        read = read if read is not None else _read_from_shape(part, source)
        if read is None:
            return None
        entries += read
    return entries


def _back_to_tokens(reshape: gs.Node, grid: tuple[int, int], channels: int) -> bool:
    """Whether ``reshape`` turns ``[B, H, W, C]`` back into ``[B, H*W, C]``."""
    tokens = grid[0] * grid[1]
    if _token_layout(reshape.outputs[0], tokens, channels):
        return True
    source = reshape.inputs[0]
    dims = _dims(source)
    entries = _shape_entries(reshape.inputs[1], source)
    if entries is None or len(entries) != 3 or dims is None:
        return False
    resolved = [dims[e[1]] if isinstance(e, tuple) and isinstance(dims[e[1]], (int, np.integer)) else e
                for e in entries]
    batch, middle, last = resolved
    return batch in (("dim", 0), 0) and middle in (tokens, -1) and last == channels


def _reshape_reader(graph: gs.Graph, tensor) -> gs.Node | None:
    """The one Reshape of ``tensor``, which may also be read by Shape nodes (a dynamic batch's target shape)."""
    readers = tensor.outputs
    reshapes = [r for r in readers if r.op == "Reshape" and r.inputs[0] is tensor]
    if is_graph_output(graph, tensor) or len(reshapes) != 1 or any(r.op not in ("Reshape", "Shape") for r in readers):
        return None
    return reshapes[0]


def _patch_path(graph: gs.Graph, conv: gs.Node):
    """((patch tokens, grid, weight, bias, output), None) of Reshape -> Transpose -> Conv -> Transpose -> Reshape;
    (None, why) when the round trip is there but its tokens are not ``[B, H*W, C]``; (None, None) when it is not."""
    found = _depthwise(conv)
    to_nchw = _producer(conv.inputs[0], ("Transpose",))
    if found is None or to_nchw is None or list(to_nchw.attrs.get("perm", [])) != [0, 3, 1, 2] or \
            _only_reader(graph, to_nchw.outputs[0], "Conv") is not conv:
        return None, None
    weight, bias = found
    channels = int(weight.shape[0])
    to_grid = _producer(to_nchw.inputs[0], ("Reshape",))
    on_grid = _dims(to_grid.outputs[0]) if to_grid is not None else None
    if not _static(on_grid, 4) or on_grid[3] != channels or \
            _only_reader(graph, to_grid.outputs[0], "Transpose") is not to_nchw:
        return None, None
    grid = (int(on_grid[1]), int(on_grid[2]))
    patches = to_grid.inputs[0]
    to_nhwc = _only_reader(graph, conv.outputs[0], "Transpose")
    if to_nhwc is None or list(to_nhwc.attrs.get("perm", [])) != [0, 2, 3, 1]:
        return None, None
    to_tokens = _reshape_reader(graph, to_nhwc.outputs[0])
    if to_tokens is None:
        return None, None
    tokens = grid[0] * grid[1]
    if not _token_layout(patches, tokens, channels) or not _back_to_tokens(to_tokens, grid, channels):
        shapes = f"{list(_dims(patches) or ['?'])} -> {list(_dims(to_tokens.outputs[0]) or ['?'])}"
        return None, (f"{TOKEN_DEPTHWISE_CONV}: the depthwise convolution {conv.name!r} is left as it is: its tokens "
                      f"are not [B, {tokens}, {channels}] on both sides ({shapes}; a graph cleaned before without "
                      "--plugins holds a projection's 2-D rows there: clean the export with --plugins instead)")
    if _dims(to_tokens.outputs[0]) is None or not _static(_dims(to_tokens.outputs[0]), 3):
        to_tokens.outputs[0].shape = [_dims(patches)[0], tokens, channels]
    return (patches, grid, weight, bias, to_tokens.outputs[0]), None


def _prefix_slice(tensor) -> tuple[gs.Variable, int] | None:
    """(x, P) for ``tensor = x[:, P:]``: a Slice on axis 1 from a constant P > 0 to the end."""
    node = _producer(tensor, ("Slice",))
    if node is None or len(node.inputs) < 4:
        return None
    starts, ends, axes = (_ints(node.inputs[i]) for i in (1, 2, 3))
    steps = _ints(node.inputs[4]) if len(node.inputs) > 4 else [1]
    if None in (starts, ends, axes, steps) or axes not in ([1], [-2]) or steps != [1] or starts[0] <= 0 or \
            ends[0] < 2 ** 31 - 1:
        return None
    return node.inputs[0], starts[0]


def _prefix_concat(graph: gs.Graph, patches_out) -> gs.Node | None:
    """The Concat(prefix outputs, patch outputs) on the token axis that reads the patch path's output."""
    concat = _only_reader(graph, patches_out, "Concat")
    if concat is None or int(concat.attrs.get("axis", 0)) not in (1, -2) or len(concat.inputs) != 2 or \
            concat.inputs[1] is not patches_out:
        return None
    return concat


def _pooled_prefix(prefix, values) -> np.ndarray | None:
    """``prefix_weights`` for ``prefix = ReduceSum(Mul(Unsqueeze(values, 1), prefix_weights), axis 2)``."""
    reduce = _producer(prefix, ("ReduceSum",))
    if reduce is None or int(reduce.attrs.get("keepdims", 1)) != 0:
        return None
    axes = reduce.attrs.get("axes") or (_ints(reduce.inputs[1]) if len(reduce.inputs) > 1 else None)
    mul = _producer(reduce.inputs[0], ("Mul",))
    if axes is None or list(axes) not in ([2], [-2]) or mul is None:
        return None
    for data, weights in ((0, 1), (1, 0)):
        unsqueeze = _producer(mul.inputs[data], ("Unsqueeze",))
        pool = constant_value(mul.inputs[weights])
        axis = (unsqueeze.attrs.get("axes") or _ints(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1
                else unsqueeze.attrs.get("axes")) if unsqueeze is not None else None
        if unsqueeze is not None and unsqueeze.inputs[0] is values and axis is not None and list(axis) == [1] and \
                pool is not None and pool.ndim == 3:
            return pool
    return None


def _linear(tensor):
    """(input, weight, bias, nodes) of ``tensor = MatMul(input, W) [+ b]`` with constant W [D, C] and b [C]."""
    add = _producer(tensor, ("Add",))
    bias = None
    if add is not None:
        for data, const in ((0, 1), (1, 0)):
            value = constant_value(add.inputs[const])
            if value is not None and _producer(add.inputs[data], ("MatMul",)) is not None:
                bias, tensor = value.reshape(-1), add.inputs[data]
                break
        else:
            return None
    matmul = _producer(tensor, ("MatMul",))
    weight = constant_value(matmul.inputs[1]) if matmul is not None else None
    if weight is None or weight.ndim != 2 or (bias is not None and bias.shape != (weight.shape[1],)):
        return None
    return matmul.inputs[0], weight, bias


def _mean_prefix(prefix, patch_values) -> tuple[gs.Variable, np.ndarray, np.ndarray | None, int] | None:
    """(x, W, b, P) when ``patch_values = x[:, P:] W [+ b]`` and ``prefix`` is the same projection of
    ``mean(x[:, P:], axis 1)`` (through an Expand to P rows when P > 1)."""
    projected = _linear(patch_values)
    sliced = _prefix_slice(projected[0]) if projected is not None else None
    if sliced is None:
        return None
    x, prefix_tokens = sliced
    expand = _producer(prefix, ("Expand",))
    if expand is not None:
        shape = _ints(expand.inputs[1])
        if shape is None or len(shape) != 3 or shape[1] != prefix_tokens:
            return None
        prefix = expand.inputs[0]
    elif prefix_tokens != 1:
        return None
    pooled = _linear(prefix)
    mean = _producer(pooled[0], ("ReduceMean",)) if pooled is not None else None
    if mean is None or mean.inputs[0] is not projected[0] or int(mean.attrs.get("keepdims", 1)) != 1:
        return None
    axes = mean.attrs.get("axes") or (_ints(mean.inputs[1]) if len(mean.inputs) > 1 else None)
    same_bias = (projected[2] is None and pooled[2] is None) or (
        projected[2] is not None and pooled[2] is not None and np.array_equal(projected[2], pooled[2]))
    if axes is None or list(axes) not in ([1], [-2]) or not np.array_equal(projected[1], pooled[1]) or not same_bias:
        return None
    return x, projected[1], projected[2], prefix_tokens


def _values_of_all_tokens(x, weight: np.ndarray, bias: np.ndarray | None, name: str) -> tuple[gs.Variable, list]:
    """``x W [+ b]`` as new MatMul (+ Add) nodes: the value projection over every token."""
    dims = _dims(x)
    shape = None if dims is None else [*dims[:-1], int(weight.shape[1])]
    product = gs.Variable(f"{name}/values_all_tokens", dtype=getattr(x, "dtype", None), shape=shape)
    nodes = [gs.Node("MatMul", f"{name}/value_all_tokens", inputs=[x, gs.Constant(f"{name}/value_weight", weight)],
                     outputs=[product])]
    if bias is None:
        return product, nodes
    values = gs.Variable(f"{name}/values_all_tokens_biased", dtype=getattr(x, "dtype", None), shape=shape)
    nodes.append(gs.Node("Add", f"{name}/value_bias_all_tokens",
                         inputs=[product, gs.Constant(f"{name}/value_bias", bias)], outputs=[values]))
    return values, nodes


def _base_name(conv: gs.Node, index: int) -> str:
    base = conv.name.rsplit("/conv/", 1)[0] if "/conv/" in (conv.name or "") else (conv.name or f"conv_{index}")
    return f"{base}/{TOKEN_DEPTHWISE_CONV}"


def find_mixer(graph: gs.Graph, conv: gs.Node, index: int) -> tuple[Mixer | None, str | None]:
    """The mixer around the depthwise Conv ``conv``, or (None, why it is left alone; None when it is no mixer)."""
    path, why = _patch_path(graph, conv)
    if path is None:
        return None, why
    patches, grid, weight, bias, patches_out = path
    k = int(weight.shape[2])
    concat = _prefix_concat(graph, patches_out)
    if concat is None:
        fields = TokenDepthwiseFields(k, grid, 0, "mean", weight, bias)
        return Mixer(patches, fields, patches_out, conv), None
    sliced = _prefix_slice(patches)
    if sliced is not None:
        values, prefix_tokens = sliced
        pool = _pooled_prefix(concat.inputs[0], values)
        if pool is not None and pool.shape == (prefix_tokens, prefix_tokens + grid[0] * grid[1], weight.shape[0]):
            fields = TokenDepthwiseFields(k, grid, prefix_tokens, "pool", weight, bias, pool)
            return Mixer(values, fields, concat.outputs[0], conv), None
    else:
        mean = _mean_prefix(concat.inputs[0], patches)
        if mean is not None:
            x, value_weight, value_bias, prefix_tokens = mean
            values, nodes = _values_of_all_tokens(x, value_weight, value_bias, _base_name(conv, index))
            fields = TokenDepthwiseFields(k, grid, prefix_tokens, "mean", weight, bias)
            return Mixer(values, fields, concat.outputs[0], conv, nodes), None
    return None, (f"{TOKEN_DEPTHWISE_CONV}: the depthwise convolution {conv.name!r} is left as it is: its prefix "
                  "tokens' outputs are neither a fixed pooling of V nor the mean of the patch tokens' V (the plugin "
                  "computes prefix=pool, mean and drop; prefix=attend keeps attention for the prefix tokens)")


def _replace(graph: gs.Graph, mixer: Mixer, index: int) -> None:
    name = _base_name(mixer.conv, index)
    attributes = {key: gs.Constant(f"{name}/{key}", np.ascontiguousarray(value)) if isinstance(value, np.ndarray)
                  else value for key, value in mixer.fields.attributes().items()}
    out = mixer.output
    producer = out.inputs[0]
    producer.outputs.clear()   # the old subgraph loses its output; graph.cleanup() removes what nothing reads
    if getattr(mixer.tokens, "dtype", None) is not None:   # the plugin's output: the input's type and shape
        out.dtype, out.shape = mixer.tokens.dtype, mixer.tokens.shape
    graph.nodes.extend(mixer.new_nodes)
    graph.nodes.append(gs.Node(TOKEN_DEPTHWISE_CONV, name, attributes, inputs=[mixer.tokens], outputs=[out],
                               domain=DOMAIN))


def _declare_domain(graph: gs.Graph) -> None:
    import onnx

    domains = list(graph.import_domains or [onnx.helper.make_opsetid("", graph.opset)])
    if not any(d.domain == DOMAIN for d in domains):
        domains.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    graph.import_domains = domains


@dataclass(frozen=True)
class TokenDepthwiseConvPass:
    """The graph pass (see the module's docstring); its notes name the mixers it leaves alone."""

    name: str = NAME
    summary: str = "each dwconv mixer (layout round trip, depthwise Conv, prefix) -> TokenDepthwiseConv plugin"
    min_opset: int | None = 13   # Slice/Unsqueeze/ReduceSum with constant inputs

    def __call__(self, graph: gs.Graph) -> PassResult:
        convs = [(i, n) for i, n in enumerate(graph.nodes) if n.op == "Conv" and n.outputs]
        if not convs:
            return PassResult(graph, False)
        infer_shapes(graph)
        notes, changed = [], False
        for index, conv in convs:
            mixer, note = find_mixer(graph, conv, index)
            if note:
                notes.append(note)
            if mixer is not None:
                _replace(graph, mixer, index)
                changed = True
        if changed:
            _declare_domain(graph)
        return PassResult(graph, changed, tuple(notes))


PASS = TokenDepthwiseConvPass()
