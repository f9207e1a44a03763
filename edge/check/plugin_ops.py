"""edge's TensorRT plugin ops in ONNX: the node a graph carries, and how ONNX Runtime runs it here.

A ``TokenDepthwiseConv`` node (written by ``edge clean --plugins``, the graph pass
``edge/graph/passes/token_depthwise_conv.py``) is in the form TensorRT's ONNX parser turns into
the plugin of ``plugins/tokenDepthwiseConv/``: the parser looks the creator up by the node's op
type, ``plugin_version`` and ``plugin_namespace``, and hands it every other attribute as a plugin
field of the attribute's type (INT -> kINT32, INTS -> kINT32 x n, STRING -> kCHAR, a float TENSOR
-> kFLOAT32). Every node input becomes a plugin input, so the weights are attributes, not
initializers: the node has one input, the tokens ``[B, P + H*W, C]``, and one output of that shape.
The parser ignores the node's domain; :data:`DOMAIN` keeps ``onnx.checker`` from looking for the
op among the default domain's schemas.

ONNX Runtime has no such op, and onnxruntime-extensions' Python ops read only scalar attributes.
:func:`session_model` therefore hands ONNX Runtime a copy in which each plugin node becomes a node
of onnxruntime-extensions' domain with the weights as initializer inputs and the grid as two
integers, computed by the plugin's numpy reference (``plugins/tokenDepthwiseConv/reference.py``,
the maths the CUDA kernel is tested against). Every ONNX Runtime session edge makes goes through
:func:`edge.check.compare.ort_session`, which does this, so ``edge clean``, ``edge verify`` and
``edge eval`` run such a graph like any other. Its CPU latency there is the reference's, not the
plugin's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edge.errors import EdgeError

TOKEN_DEPTHWISE_CONV = "TokenDepthwiseConv"    # the plugin's name (tokenDepthwiseConvPlugin.cpp, kPluginName)
PLUGIN_VERSION = "1"                           # kPluginVersion
PLUGIN_NAMESPACE = ""                          # kPluginNamespace
DOMAIN = "edge.plugins"                        # ignored by TensorRT's parser; keeps the op out of the default domain
DOMAIN_VERSION = 1
PLUGIN_OPS = (TOKEN_DEPTHWISE_CONV,)
#: the prefix modes the kernel computes (``prefix=drop`` is ``prefix_tokens=0``; ``prefix=attend`` is not one)
PREFIX_MODES = ("mean", "pool")
#: TensorRT's ONNX parser imports IPluginV3 plugins (IPluginCreatorV3One creators) from this version on: its
#: fallback plugin importer takes them from onnx-tensorrt 10.0-GA (onnxOpImporters.cpp, FallbackPluginImporter)
MIN_TENSORRT = (10, 0)
#: the plugin field type TensorRT's parser makes of each attribute type (onnx-tensorrt onnxOpImporters.cpp,
#: loadFields, 10.0-GA to 10.16): FLOAT(S) -> kFLOAT32, INT(S) -> kINT32, STRING -> kCHAR; a TENSOR by its
#: element type (FLOAT -> kFLOAT32, FLOAT16 -> kFLOAT16, BFLOAT16 -> kBF16, INT32 -> kINT32, DOUBLE -> kFLOAT64,
#: INT8, INT16; INT64, UINT8, BOOL and the rest stop the parse: "is unsupported in plugin fields")
_A = onnx.AttributeProto
_T = onnx.TensorProto
FIELD_TYPE = {_A.FLOAT: "kFLOAT32", _A.FLOATS: "kFLOAT32", _A.INT: "kINT32", _A.INTS: "kINT32",
              _A.STRING: "kCHAR", _A.STRINGS: "kCHAR"}
TENSOR_FIELD_TYPE = {_T.FLOAT: "kFLOAT32", _T.FLOAT16: "kFLOAT16", _T.BFLOAT16: "kBF16", _T.INT32: "kINT32",
                     _T.DOUBLE: "kFLOAT64", _T.INT8: "kINT8", _T.INT16: "kINT16", _T.STRING: "kCHAR"}
#: what the plugin's creator reads of each field (tokenDepthwiseConvPlugin.cpp: readInts, readFloats, readString)
INT_FIELDS = {"kernel_size": 1, "grid": 2, "prefix_tokens": 1}
FLOAT_FIELDS = ("weight", "bias", "prefix_weights")          # kFLOAT32 or kFLOAT16 values, [C, 1, k, k] etc.
STRING_FIELDS = ("prefix_mode", "plugin_version", "plugin_namespace")
#: the token types the plugin takes (supportsFormatCombination: kFLOAT or kHALF, the output the input's)
TOKEN_TYPES = (_T.FLOAT, _T.FLOAT16)

ORT_DOMAIN = "ai.onnx.contrib"                 # onnxruntime-extensions' domain for Python ops
ORT_OP = "EdgeTokenDepthwiseConvReference"    # float32 in and out (onnxruntime-extensions' Python ops take no float16)
INSTALL = "pip install onnxruntime-extensions (or pip install -e '.[test]' in edge's checkout)"


@dataclass(frozen=True)
class TokenDepthwiseFields:
    """The plugin fields of one ``TokenDepthwiseConv`` node (names, layouts: plugins/tokenDepthwiseConv/README.md)."""

    kernel_size: int
    grid: tuple[int, int]
    prefix_tokens: int
    prefix_mode: str
    weight: np.ndarray                         # [C, 1, k, k], as PyTorch's depthwise Conv2d stores it
    bias: np.ndarray | None = None             # [C]
    prefix_weights: np.ndarray | None = None   # [P, P + H*W, C], prefix_mode "pool" with P > 0 only

    @property
    def channels(self) -> int:
        return int(self.weight.shape[0])

    @property
    def tokens(self) -> int:
        return self.prefix_tokens + self.grid[0] * self.grid[1]

    def problems(self) -> list[str]:
        """What the plugin's creator would refuse (its validate()), in its words; empty when it takes them."""
        k, (rows, cols), p = self.kernel_size, self.grid, self.prefix_tokens
        found = []
        if rows <= 0 or cols <= 0:
            found.append(f"grid: expected two positive sizes H, W, found {rows}, {cols}")
        elif k <= 0 or k % 2 == 0 or k > min(rows, cols):
            found.append(f"kernel_size={k}: expected an odd size <= min(H, W) = {min(rows, cols)}")
        if p < 0:
            found.append(f"prefix_tokens={p}: expected >= 0")
        if self.prefix_mode not in PREFIX_MODES:
            found.append(f"prefix_mode={self.prefix_mode!r}: expected one of {', '.join(PREFIX_MODES)} (prefix=drop "
                         "is prefix_tokens=0; prefix=attend stays in the graph)")
        if self.weight.ndim != 4 or self.weight.shape[1:] != (1, k, k):
            found.append(f"weight of shape {list(self.weight.shape)}: expected [C, 1, {k}, {k}]")
        if self.bias is not None and self.bias.shape != (self.channels,):
            found.append(f"bias of shape {list(self.bias.shape)}: expected [{self.channels}]")
        pooled = self.prefix_mode == "pool" and p > 0
        wanted = (p, self.tokens, self.channels)
        have = None if self.prefix_weights is None else tuple(self.prefix_weights.shape)
        if (pooled and have != wanted) or (not pooled and have is not None):
            found.append(f"prefix_weights of shape {have}: expected {list(wanted) if pooled else 'none'} "
                         "([P, P + H*W, C] for prefix_mode 'pool' with P > 0, none otherwise)")
        return found

    def attributes(self) -> dict:
        """The node's attributes: plugin fields (arrays for TENSOR ones), then the plugin's version and namespace."""
        attributes = {"kernel_size": int(self.kernel_size), "grid": [int(d) for d in self.grid],
                      "prefix_tokens": int(self.prefix_tokens), "prefix_mode": self.prefix_mode,
                      "weight": self.weight}
        if self.bias is not None:
            attributes["bias"] = self.bias
        if self.prefix_weights is not None:
            attributes["prefix_weights"] = self.prefix_weights
        attributes.update(plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_NAMESPACE)
        return attributes


def _node_label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} node {node.name!r}" if node.name else f"a {node.op_type} node"


def _type_name(attribute: onnx.AttributeProto) -> str:
    kind = onnx.AttributeProto.AttributeType.Name(attribute.type)
    if attribute.type == onnx.AttributeProto.TENSOR:
        kind += f" of {onnx.TensorProto.DataType.Name(attribute.t.data_type)}"
    return kind


def attribute_problems(node: onnx.NodeProto) -> list[str]:
    """The attributes TensorRT's parser would hand the creator as fields it refuses (by loadFields' type mapping,
    :data:`FIELD_TYPE`), or could not import at all; and a namespace the creator is not registered under."""
    found = []
    for attribute in node.attribute:
        name, kind = attribute.name, attribute.type
        if kind == onnx.AttributeProto.TENSOR:
            field_type = TENSOR_FIELD_TYPE.get(attribute.t.data_type)
        else:
            field_type = FIELD_TYPE.get(kind)
        if field_type is None:
            found.append(f"{name}: a {_type_name(attribute)} attribute, which TensorRT's parser cannot pass to a "
                         "plugin (\"unsupported in plugin fields\")")
        elif name in INT_FIELDS and (kind not in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)
                                     or (len(attribute.ints) if kind == onnx.AttributeProto.INTS else 1)
                                     != INT_FIELDS[name]):
            want = "an INT" if INT_FIELDS[name] == 1 else f"INTS of {INT_FIELDS[name]}"
            found.append(f"{name}: a {_type_name(attribute)} attribute ({field_type} field): expected {want} "
                         f"(kINT32 x {INT_FIELDS[name]})")
        elif name in FLOAT_FIELDS and field_type not in ("kFLOAT32", "kFLOAT16"):
            found.append(f"{name}: a {_type_name(attribute)} attribute ({field_type} field): expected a FLOAT or "
                         "FLOAT16 tensor (the creator reads float32 or float16 values)")
        elif name in FLOAT_FIELDS and kind != onnx.AttributeProto.TENSOR:
            found.append(f"{name}: a {_type_name(attribute)} attribute (its values without their shape): expected a "
                         "FLOAT or FLOAT16 tensor")
        elif name in STRING_FIELDS and kind != onnx.AttributeProto.STRING:
            found.append(f"{name}: a {_type_name(attribute)} attribute ({field_type} field): expected a STRING")
    values = {a.name: a.s.decode(errors="replace") for a in node.attribute if a.type == onnx.AttributeProto.STRING}
    namespace = values.get("plugin_namespace", PLUGIN_NAMESPACE)
    if namespace != PLUGIN_NAMESPACE:
        found.append(f"plugin_namespace {namespace!r}: the creator is registered under {PLUGIN_NAMESPACE!r}; the "
                     "parser looks it up by name, version and namespace and would not find it (\"Plugin not found\")")
    return found


def token_problems(fields: TokenDepthwiseFields, element_type: int | None,
                   shape: tuple[int | None, ...] | None) -> list[str]:
    """What the plugin refuses of its input (supportsFormatCombination: float32 or float16; configurePlugin:
    ``[B, P + H*W, C]``); unknown type or dimensions (None, 0 or negative) are not judged."""
    found = []
    if element_type and element_type not in TOKEN_TYPES:
        found.append(f"tokens of type {onnx.TensorProto.DataType.Name(element_type)}: expected FLOAT or FLOAT16")
    if shape is not None:
        wanted = (None, fields.tokens, fields.channels)
        if len(shape) != 3 or any(d is not None and d > 0 and w is not None and d != w
                                  for d, w in zip(shape, wanted)):
            found.append(f"tokens of shape {list(shape)}: expected [B, {fields.tokens}, {fields.channels}] "
                         "(P + H*W tokens of C channels, from the fields)")
    return found


def read_fields(node: onnx.NodeProto, *, tokens_type: int | None = None,
                tokens_shape: tuple[int | None, ...] | None = None) -> TokenDepthwiseFields:
    """The fields of a ``TokenDepthwiseConv`` node; EdgeError naming the node and the field when they are unusable.
    With ``tokens_type`` (an ONNX element type) and ``tokens_shape``, the node's input is checked too."""
    label = _node_label(node)
    problems = attribute_problems(node)
    if problems:
        raise EdgeError(f"{label}: TensorRT would refuse its attributes", found="; ".join(problems),
                        fix="rewrite the graph with `edge clean --plugins` from the plain export")
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    missing = [name for name in ("kernel_size", "grid", "prefix_tokens", "weight") if name not in values]
    version = values.get("plugin_version", PLUGIN_VERSION)
    version = version.decode() if isinstance(version, bytes) else version
    if missing or version != PLUGIN_VERSION or len(node.input) != 1 or len(node.output) != 1:
        raise EdgeError(f"{label} is not a TokenDepthwiseConv v{PLUGIN_VERSION} plugin node",
                        expected="one input, one output, attributes kernel_size, grid, prefix_tokens, weight "
                                 f"(plugin_version {PLUGIN_VERSION!r})",
                        found=f"{len(node.input)} input(s), {len(node.output)} output(s), missing {missing or 'none'}, "
                              f"plugin_version {version!r}",
                        fix="rewrite the graph with `edge clean --plugins` from the plain export")
    mode = values.get("prefix_mode", b"mean")

    def array(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(values[name]) if name in values else None

    grid = [int(d) for d in values["grid"]] if isinstance(values["grid"], list) else [int(values["grid"])]
    if len(grid) != 2:
        raise EdgeError(f"{label}: TensorRT's plugin creator would refuse its fields",
                        found=f"grid {grid}: expected two sizes H, W",
                        fix="rewrite the graph with `edge clean --plugins` from the plain export")
    def scalar(name: str) -> int:  # an INT, or INTS of one (both are kINT32 x 1 to the creator)
        value = values[name]
        return int(value[0] if isinstance(value, list) else value)

    fields = TokenDepthwiseFields(scalar("kernel_size"), (grid[0], grid[1]), scalar("prefix_tokens"),
                                  mode.decode() if isinstance(mode, bytes) else mode,
                                  array("weight"), array("bias"), array("prefix_weights"))
    problems = fields.problems() + token_problems(fields, tokens_type, tokens_shape)
    if problems:
        raise EdgeError(f"{label}: TensorRT's plugin creator would refuse its fields", found="; ".join(problems),
                        fix="rewrite the graph with `edge clean --plugins` from the plain export")
    return fields


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of ``model``'s main graph that are edge's plugin ops."""
    return [n for n in model.graph.node if n.op_type in PLUGIN_OPS and n.domain == DOMAIN]


# --- ONNX Runtime --------------------------------------------------------------------------------

def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> element type, by ONNX shape inference (the pass declares its plugin nodes' outputs)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.output, *inferred.value_info)}
    types.update({t.name: t.data_type for t in inferred.initializer})
    return types


def _reference_nodes(node: onnx.NodeProto, index: int, initializers: list[onnx.TensorProto],
                     types: dict[str, int]) -> list[onnx.NodeProto]:
    """The onnxruntime-extensions node computing ``node`` with the numpy reference (weights go to
    ``initializers``); float16 tokens (a graph converted to fp16) are cast to float32 and back around it."""
    fields = read_fields(node)
    element_type = types.get(node.input[0]) or onnx.TensorProto.FLOAT
    if element_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        raise EdgeError(f"{_node_label(node)} reads {onnx.TensorProto.DataType.Name(element_type)} tokens",
                        expected="float32 or float16 tokens (the types the plugin takes)",
                        fix="cast the tokens to float32 or float16 before the node")
    empty = np.zeros(0, np.float32)
    stem = f"{node.name or 'token_depthwise_conv'}.{index}"
    names = []
    for field, value in (("weight", fields.weight), ("bias", fields.bias), ("prefix_weights", fields.prefix_weights)):
        names.append(f"{stem}/{field}")
        value = empty if value is None else np.ascontiguousarray(value, np.float32)   # the op's inputs are float32
        initializers.append(numpy_helper.from_array(value, names[-1]))
    tokens, out = node.input[0], node.output[0]
    half = element_type == onnx.TensorProto.FLOAT16
    nodes = []
    if half:
        tokens, out = f"{stem}/tokens_float32", f"{stem}/out_float32"
        nodes.append(helper.make_node("Cast", [node.input[0]], [tokens], to=onnx.TensorProto.FLOAT))
    nodes.append(helper.make_node(ORT_OP, [tokens, *names], [out], name=node.name, domain=ORT_DOMAIN,
                                  kernel_size=fields.kernel_size, grid_rows=fields.grid[0], grid_cols=fields.grid[1],
                                  prefix_tokens=fields.prefix_tokens, prefix_mode=fields.prefix_mode))
    if half:
        nodes.append(helper.make_node("Cast", [out], [node.output[0]], to=onnx.TensorProto.FLOAT16))
    return nodes


def reference_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose plugin nodes run as the numpy reference under onnxruntime-extensions."""
    runnable = onnx.ModelProto()
    runnable.CopyFrom(model)
    initializers: list[onnx.TensorProto] = []
    types = _element_types(model)
    nodes = [new for i, n in enumerate(model.graph.node) for new in (
        _reference_nodes(n, i, initializers, types) if n.op_type in PLUGIN_OPS and n.domain == DOMAIN else [n])]
    del runnable.graph.node[:]
    runnable.graph.node.extend(nodes)
    runnable.graph.initializer.extend(initializers)
    if not any(o.domain == ORT_DOMAIN for o in runnable.opset_import):
        runnable.opset_import.append(helper.make_opsetid(ORT_DOMAIN, 1))
    return runnable


def _run_reference(tokens, weight, bias, prefix_weights, **attributes):
    from plugins.tokenDepthwiseConv import reference

    return reference.token_depthwise_conv(
        tokens, weight, bias if bias.size else None, grid=(attributes["grid_rows"], attributes["grid_cols"]),
        prefix_tokens=attributes["prefix_tokens"], prefix_mode=attributes["prefix_mode"],
        prefix_weights=prefix_weights if prefix_weights.size else None)


@functools.cache
def reference_library() -> str:
    """The path of onnxruntime-extensions' custom-op library, with the reference op defined in it (once)."""
    try:
        from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
    except ImportError as e:
        raise EdgeError("the graph holds TensorRT plugin ops (TokenDepthwiseConv), which ONNX Runtime runs here "
                        "through onnxruntime-extensions, and that package is not installed",
                        fix=INSTALL) from e
    try:
        import plugins.tokenDepthwiseConv.reference  # noqa: F401 - checked here, used by the op
    except ImportError as e:
        raise EdgeError("the graph holds TensorRT plugin ops (TokenDepthwiseConv); their numpy reference "
                        "(plugins/tokenDepthwiseConv/reference.py) cannot be imported", found=str(e),
                        fix="install edge from its checkout (pip install -e .), which installs plugins/ beside it"
                        ) from e
    real, text, integer = PyCustomOpDef.dt_float, PyCustomOpDef.dt_string, PyCustomOpDef.dt_int64
    onnx_op(op_type=ORT_OP, inputs=[real, real, real, real], outputs=[real],
            attrs={"kernel_size": integer, "grid_rows": integer, "grid_cols": integer, "prefix_tokens": integer,
                   "prefix_mode": text})(_run_reference)
    return get_library_path()


def _model_of(model_bytes_or_path) -> onnx.ModelProto | None:
    """The model behind a session's argument if it holds plugin ops (cheap byte search first), else None."""
    if isinstance(model_bytes_or_path, (bytes, bytearray)):
        data = bytes(model_bytes_or_path)
    else:
        data = Path(model_bytes_or_path).read_bytes()
    if TOKEN_DEPTHWISE_CONV.encode() not in data or DOMAIN.encode() not in data:
        return None
    model = onnx.load_from_string(data) if isinstance(model_bytes_or_path, (bytes, bytearray)) \
        else onnx.load(str(model_bytes_or_path))   # with its external data, next to the file
    return model if plugin_nodes(model) else None


def session_model(model_bytes_or_path) -> tuple[bytes | str, str | None]:
    """What ONNX Runtime loads for ``model_bytes_or_path`` (bytes, or a path), and the custom-op library it needs.

    A graph without plugin ops is handed on as it came (library None).
    """
    model = _model_of(model_bytes_or_path)
    if model is None:
        return model_bytes_or_path, None
    return reference_form(model).SerializeToString(), reference_library()
