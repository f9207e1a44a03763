"""What TensorRT's ONNX parser accepts, per TensorRT release: onnx-tensorrt's support table as data.

Read from onnx-tensorrt's ``docs/operators.md`` (the "Operator Support Matrix": operator,
supported Y/N, supported types), written here by hand as data, supported operators only (an
operator missing here is one the table marks N, or does not list):

* **10.3** (JetPack 6.1/6.2): the table of branch ``release/10.1-GA`` ("TensorRT 10.0 supports operators in
  the inclusive range of opset 9 to opset 20"). onnx-tensorrt's ``docs/Changelog.md`` adds no operator in
  10.2 ("minor changes to op importers for GRU and Squeeze") or 10.3 ("tensor axes inputs for Slice";
  "ScatterElements importer uses an updated plugin"), so 10.3 parses the same operators and opsets.
* **10.16** (JetPack 7.2): the table as released with TensorRT 10.15 ("opset 9 to opset 24"; 10.15 added
  RotaryEmbedding, RMSNormalization, TensorScatter), the newest version of the file the stored copies
  hold; 10.16's own table could not be read here. Operators 10.16 added beyond it are refused
  (a false finding, never a missed one); check 10.16's ``docs/operators.md`` when one is reported.

The types are the table's own names (FP32, FP16, BF16, INT32, INT64, INT8, UINT8, BOOL, FP8, FP4, INT4);
:data:`ONNX_TYPE_NAMES` maps ONNX element types to them. "Supported Types" is what the operator's data
input may be (for DequantizeLinear the quantized input, for Constant its value). The header of every
table adds that DOUBLE is accepted by casting down to FLOAT ("limited support"), so DOUBLE counts as FP32.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto


@dataclass(frozen=True)
class ParserSupport:
    """What one TensorRT release's ONNX parser takes: the default-domain opsets, each operator's types."""

    tensorrt: str
    min_opset: int
    max_opset: int
    operators: dict[str, tuple[str, ...]]   # operator -> the types its data input may have
    source: str                             # where the table was read

    def types_of(self, op: str) -> tuple[str, ...] | None:
        """The types ``op`` takes, or None when the parser has no importer for it."""
        return self.operators.get(op)


#: ONNX element type -> the support table's name of it (DOUBLE: cast down to FP32 by the parser)
ONNX_TYPE_NAMES = {
    TensorProto.FLOAT: "FP32", TensorProto.DOUBLE: "FP32", TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16", TensorProto.INT32: "INT32", TensorProto.INT64: "INT64",
    TensorProto.INT8: "INT8", TensorProto.UINT8: "UINT8", TensorProto.BOOL: "BOOL",
    TensorProto.FLOAT8E4M3FN: "FP8", TensorProto.FLOAT4E2M1: "FP4", TensorProto.INT4: "INT4",
}


def _by_operator(groups: dict[tuple[str, ...], tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    return {op: types for types, ops in groups.items() for op in ops}


# operators grouped by the types the table gives them (one group per distinct type list)
_OPS_10_3 = {
    ("FP32", "FP16", "BF16"): (
        "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization", "Ceil", "Celu",
        "Clip", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "Dropout", "Einsum", "Elu", "Erf", "Exp", "Floor",
        "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "GroupNormalization", "GRU", "Hardmax",
        "HardSigmoid", "HardSwish", "ImageScaler", "InstanceNormalization", "IsInf", "LayerNormalization",
        "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "LpPool", "LRN", "LSTM", "MatMul", "MaxPool",
        "MeanVarianceNormalization", "ParametricSoftplus", "Pow", "PRelu", "QuantizeLinear", "RandomNormal",
        "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Reciprocal", "Resize", "RNN", "Round",
        "ScaledTanh", "Scan", "Selu", "Sigmoid", "Sin", "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Tan",
        "Tanh", "ThresholdedRelu", "Upsample",
    ),
    ("FP32", "FP16", "BF16", "INT32", "INT64"): (
        "Abs", "Add", "ArgMax", "ArgMin", "DepthToSpace", "Div", "Equal", "Greater", "GreaterOrEqual", "IsNaN",
        "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Pad", "Range", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
        "ReduceSumSquare", "Relu", "Scatter", "ScatterElements", "ScatterND", "Shrink", "Sign", "SpaceToDepth",
        "Sub", "Sum", "TopK",
    ),
    # ConstantOfShape: the table writes "INF64", read as INT64 (as 10.15's table has it)
    ("FP32", "FP16", "BF16", "INT32", "INT64", "BOOL"): (
        "Concat", "Constant", "ConstantOfShape", "Expand", "EyeLike", "Flatten", "Gather", "GatherElements",
        "GatherND", "Identity", "If", "Loop", "OneHot", "Reshape", "ReverseSequence", "Shape", "Size", "Slice",
        "Split", "Squeeze", "Tile", "Transpose", "Trilu", "Unsqueeze", "Where",
    ),
    ("FP32", "FP16"): (
        "DeformConv", "GridSample", "Mish", "NonMaxSuppression", "NonZero", "RoiAlign",
    ),
    ("BOOL",): (
        "And", "Not", "Or", "Xor",
    ),
    ("FP32", "FP16", "BF16", "INT32", "INT64", "UINT8", "BOOL"): (
        "Cast", "CastLike",
    ),
    ("FP32", "FP16", "BF16", "FP8", "INT32", "INT64"): (
        "Mean",
    ),
    ("FP32", "FP16", "BF16", "INT8", "INT32", "INT64"): (
        "Gelu",
    ),
    ("INT8", "FP8", "INT4"): (
        "DequantizeLinear",
    ),
}

_OPS_10_16 = {
    ("FP32", "FP16", "BF16"): (
        "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization", "Ceil", "Celu",
        "Clip", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "Dropout", "Einsum", "Elu", "Erf", "Exp", "Floor",
        "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "GroupNormalization", "GRU", "Hardmax",
        "HardSigmoid", "HardSwish", "ImageScaler", "InstanceNormalization", "IsInf", "LayerNormalization",
        "LeakyRelu", "Log", "LogSoftmax", "LpNormalization", "LpPool", "LRN", "LSTM", "MatMul", "MaxPool",
        "MeanVarianceNormalization", "ParametricSoftplus", "PRelu", "QuantizeLinear", "RandomNormal",
        "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Reciprocal", "Resize", "RMSNormalization", "RNN",
        "RotaryEmbedding", "Round", "ScaledTanh", "Scan", "Selu", "Sigmoid", "Sin", "Sinh", "Softmax", "Softplus",
        "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Upsample",
    ),
    ("FP32", "FP16", "BF16", "INT32", "INT64"): (
        "Abs", "Add", "ArgMax", "ArgMin", "DepthToSpace", "Div", "Equal", "Greater", "GreaterOrEqual", "IsNaN",
        "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Pad", "Pow", "Range", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
        "ReduceSumSquare", "Relu", "Scatter", "ScatterElements", "ScatterND", "Shrink", "Sign", "SpaceToDepth",
        "Sub", "Sum", "TopK",
    ),
    ("FP32", "FP16", "BF16", "INT32", "INT64", "BOOL"): (
        "Concat", "Expand", "EyeLike", "Flatten", "Gather", "GatherElements", "GatherND", "Identity", "If", "Loop",
        "OneHot", "Reshape", "ReverseSequence", "Shape", "Size", "Slice", "Split", "Squeeze", "Tile", "Transpose",
        "Trilu", "Unsqueeze", "Where",
    ),
    ("FP32", "FP16"): (
        "BlackmanWindow", "DeformConv", "GridSample", "HammingWindow", "HannWindow", "Mish", "NonMaxSuppression",
        "NonZero", "RoiAlign",
    ),
    ("BOOL",): (
        "And", "Not", "Or", "Xor",
    ),
    ("FP32", "FP16", "BF16", "FP8", "FP4", "INT4", "INT32", "INT64", "BOOL"): (
        "Constant", "ConstantOfShape",
    ),
    ("FP32", "FP16", "BF16", "INT32", "INT64", "UINT8", "BOOL"): (
        "Cast", "CastLike",
    ),
    ("FP32",): (
        "STFT",
    ),
    ("FP32", "FP16", "BF16", "FP8", "INT32", "INT64"): (
        "Mean",
    ),
    ("FP32", "FP16", "BF16", "INT32"): (
        "TensorScatter",
    ),
    ("FP32", "FP16", "BF16", "INT8", "FP8"): (
        "Attention",
    ),
    ("FP32", "FP16", "BF16", "INT8", "INT32", "INT64"): (
        "Gelu",
    ),
    ("INT8", "FP8", "FP4", "INT4"): (
        "DequantizeLinear",
    ),
}


PARSERS = {
    "10.3": ParserSupport("10.3", 9, 20, _by_operator(_OPS_10_3),
                          "onnx-tensorrt docs/operators.md at release/10.1-GA; Changelog 10.2, 10.3: no new operator"),
    "10.16": ParserSupport("10.16", 9, 24, _by_operator(_OPS_10_16),
                           "onnx-tensorrt docs/operators.md as of TensorRT 10.15 (10.16's own not read)"),
}
#: JetPack 6.1/6.2 (the Orin Nano's main target) ships TensorRT 10.3
DEFAULT_TENSORRT = "10.3"


def tensor_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name -> ONNX element type of every typed tensor of ``graph``: inputs, outputs, the intermediates
    its ``value_info`` holds (run shape inference first to have them all), initializers and Constants."""
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output, *graph.value_info)}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    return types
