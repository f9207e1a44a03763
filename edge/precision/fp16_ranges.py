"""Range-aware float16: which nodes must stay float32 because their values leave float16's range.

:mod:`edge.precision.fp16` keeps op types (norms, reductions, ``Pow``, ``Sqrt``) and the head in
float32 whatever the values. Pretrained ViTs carry "massive activations" (a few residual channels
in the thousands): a ViT-B whose residual stream reached 1418 fell to 18.96 % top-1 in TensorRT
fp16 because a decomposed LayerNorm squared it (1418^2 > 65504). This module measures instead:

1. :func:`record_ranges` runs the float32 graph in ONNX Runtime on calibration images and records
   each float tensor's largest magnitude;
2. :func:`nodes_beyond_fp16` names the nodes that must stay float32, each with its reason:
   a node whose output reaches ``FP16_MAX / margin``; a square (``Pow(x, 2)``, ``Mul(x, x)``: a
   norm's variance) whose output reaches ``FP16_MAX / margin^2``, the margin applying to ``x``;
   a norm (``LayerNormalization``) whose input's square would (its variance is computed inside);
   and every node reading a tensor beyond range (a float16 reader would cast it to inf);
3. the caller hands the names to :class:`~edge.precision.fp16.Fp16Config` as ``node_block_list``,
   so the float16 pass itself is unchanged.

The margin (default :data:`DEFAULT_MARGIN`, 2x on the magnitude) covers images the calibration
sample did not contain: a maximum over a few hundred images understates the maximum over all.
Measured on the reference model (fmnist-deit-tiny, 394 float tensors): a tensor's maximum over
2,000 Fashion-MNIST test images is at most 1.30x its maximum over the 500 calibration images
(99th percentile 1.18x), and at most 1.49x over 64 (99th percentile 1.36x); 2x leaves room above
both. An overflow is not a rounding error but an inf that a LayerNorm turns into NaN for the
whole token, while a float32 node costs at most two Casts: the margin errs on the float32 side.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge.config import MAX_SAMPLES, MAX_SEED, option
from edge.errors import EdgeError
from edge.precision.fp16 import FP16_MAX, TYPE_AGNOSTIC, float_tensor_types

DEFAULT_MARGIN = 2.0
#: ops that compute a variance of their input inside one node
NORM_OPS = ("LayerNormalization",)
#: images per ONNX Runtime run while every intermediate tensor is an output (memory, not speed)
RANGE_BATCH = 4


@dataclass
class RangeCheck:
    """Where the float32 ranges come from, and the margin kept below float16's largest value."""

    data: str | None = None   # None: the bundled model's data set (edge.models.data_for), else --data is needed
    samples: int = option(500, minimum=1, maximum=MAX_SAMPLES)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    margin: float = option(DEFAULT_MARGIN, minimum=1.0, maximum=1e4)

    def check(self) -> None:
        if not 1.0 <= self.margin <= 1e4:
            raise EdgeError(f"range margin {self.margin}", expected="1 <= margin <= 10000 (1: no margin)",
                            fix="pass --range-margin 2 (the default) or another factor >= 1")
        if self.samples < 1:
            raise EdgeError(f"--samples {self.samples}", expected="at least 1 calibration sample for the range check")


@dataclass(frozen=True)
class KeptNode:
    """A node the range check keeps in float32, and why."""

    node: str
    op: str
    tensor: str       # the tensor whose range decided it
    max_abs: float    # that tensor's largest magnitude on the calibration images (float32)
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def recorded_tensors(model: onnx.ModelProto) -> list[str]:
    """The float32 tensors whose ranges are recorded: graph inputs and every node output."""
    types = float_tensor_types(model)
    names = [v.name for v in model.graph.input]
    names += [out for node in model.graph.node if node.op_type != "Constant" for out in node.output]
    return [name for name in dict.fromkeys(names) if name and types.get(name) == TensorProto.FLOAT]


def _exposing(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` with every tensor in ``names`` among its outputs."""
    exposed = onnx.ModelProto.FromString(model.SerializeToString())
    present = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                for n in names if n not in present)
    return exposed


def record_ranges(model: onnx.ModelProto, images: np.ndarray) -> dict[str, float]:
    """Tensor name -> largest |value| of the float32 graph on ``images`` (inf where a value is already inf).

    A graph with a fixed batch size runs whole batches of it only (the last images may be left out).
    """
    from calib.data import graph_batch
    from edge.check.compare import ort_session

    static_batch = graph_batch(model)
    if static_batch and len(images) < static_batch:
        raise EdgeError(f"{len(images)} calibration images for a graph with a fixed batch of {static_batch}",
                        expected=f"at least {static_batch} images", fix=f"pass --samples {static_batch} or more")
    names = recorded_tensors(model)
    session = ort_session(_exposing(model, names).SerializeToString())
    input_name = model.graph.input[0].name
    outputs = [o.name for o in session.get_outputs()]
    ranges = dict.fromkeys(names, 0.0)
    batch = static_batch or RANGE_BATCH
    last = len(images) - batch + 1 if static_batch else len(images)
    for start in range(0, last, batch):
        feed = images[start:start + batch]
        values = dict(zip(outputs, session.run(None, {input_name: feed}), strict=True))
        for name in names:
            magnitude = np.abs(values[name])
            ranges[name] = max(ranges[name], float(np.nanmax(magnitude)) if magnitude.size else 0.0)
    return ranges


def _is_square(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """``Pow(x, 2)`` or ``Mul(x, x)``."""
    if node.op_type == "Mul":
        return len(node.input) == 2 and node.input[0] == node.input[1]
    exponent = constants.get(node.input[1]) if node.op_type == "Pow" else None
    return exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                values[node.output[0]] = onnx.numpy_helper.to_array(value)
    return values


def nodes_beyond_fp16(model: onnx.ModelProto, ranges: dict[str, float],
                      margin: float = DEFAULT_MARGIN) -> list[KeptNode]:
    """The nodes of ``model`` (named: :func:`edge.precision.fp16.name_nodes`) that must stay float32,
    each once, with the first reason found, in graph order."""
    limit, square_limit = FP16_MAX / margin, FP16_MAX / margin ** 2
    constants = _constants(model.graph)
    kept: dict[str, KeptNode] = {}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            readers[name].append(node)

    def keep(node: onnx.NodeProto, tensor: str, reason: str) -> None:
        if node.name not in kept:
            kept[node.name] = KeptNode(node.name, node.op_type, tensor, ranges[tensor], reason)

    for node in model.graph.node:
        for out in (o for o in node.output if o in ranges):
            square = _is_square(node, constants)
            bound = square_limit if square else limit
            if ranges[out] > bound:
                what = "its square" if square else "its output"
                keep(node, out, f"{what} {out} reaches {ranges[out]:.4g} > {FP16_MAX:.0f} / "
                                f"{margin:g}{'^2' if square else ''} (float16's range with a {margin:g}x margin)")
        source = node.input[0] if node.input else ""
        if node.op_type in NORM_OPS and ranges.get(source, 0.0) ** 2 > square_limit:
            keep(node, source, f"its variance squares {source} (max |x| {ranges[source]:.4g}, square "
                               f"{ranges[source] ** 2:.4g} > {FP16_MAX:.0f} / {margin:g}^2)")
    for name, value in ranges.items():
        if value > limit:
            for reader in readers[name]:
                if reader.op_type not in TYPE_AGNOSTIC:
                    keep(reader, name, f"reads {name} (max |x| {value:.4g} > {FP16_MAX:.0f} / {margin:g}): "
                                       "a float16 reader would cast it to inf")
    order = {node.name: i for i, node in enumerate(model.graph.node)}
    return sorted(kept.values(), key=lambda k: order[k.node])
