"""SmoothQuant (Xiao et al. 2023) folded into a float graph: outlier channels moved from activations to weights.

A GEMM ``Y = X W`` computes the same with ``X' = X / s`` and ``W' = diag(s) W`` for any positive
per-input-channel ``s``. SmoothQuant picks ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``
(``alpha = 0.5`` by default): the activation channels that are tens of times wider than the rest
(post-LayerNorm inter-channel variation, RepQ-ViT) shrink to the others' range, so one per-tensor
int8 scale serves them all, and the weights, quantized per output channel, take the difference.

Here ``X / s`` costs nothing: it is folded into the affine of the LayerNormalization that writes
``X`` (scale and bias divided by ``s``), and ``W * s`` into the GEMM's constant weight. So only a
GEMM whose input is a LayerNorm output is smoothed (a ViT's qkv and fc1; the head's input norm is
left to the head, which the linear placements leave float), and only when every reader of that
LayerNorm output is such a GEMM (through Reshapes that keep the channel axis last), all of which
are smoothed with one ``s`` from the largest of their weights. In float32 the smoothed graph
computes the same function up to rounding (a test: within 1e-5 relative).

``max|X_j|`` is measured by running the float32 graph on the calibration images (ONNX Runtime CPU).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from calib.data import graph_batch
from calib.errors import CalibError

DEFAULT_ALPHA = 0.5
#: floor of a channel's max |x| and max |w| (a channel that is always 0 gets s from the floor, not inf)
EPSILON = 1e-5
#: ops between a LayerNorm and the GEMM that leave the channel axis last and untouched
CHANNEL_KEEPING = ("Reshape", "Identity")
#: readers that see only a tensor's shape (a dynamic-batch export reads the LayerNorm output's Shape)
SHAPE_ONLY = ("Shape", "Size")


@dataclass(frozen=True)
class SmoothTarget:
    """One LayerNormalization and the weight GEMMs that read its output (``gemms``: node names)."""

    norm: str
    output: str
    gemms: tuple[str, ...]


def _initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in graph.initializer}


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    return readers


def _weight_axis(node: onnx.NodeProto) -> int | None:
    """The input-channel axis of the GEMM's constant weight (None: a form this module does not smooth)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "MatMul":
        return 0
    if node.op_type == "Gemm" and not attrs.get("transA", 0):
        return 1 if attrs.get("transB", 0) else 0
    return None


def _gemms_reading(tensor: str, readers: dict[str, list[onnx.NodeProto]], inits: dict) -> list[onnx.NodeProto] | None:
    """The weight GEMMs reading ``tensor`` (through channel-keeping ops), or None if anything else reads its
    values (a Shape reads none)."""
    found = []
    for node in readers.get(tensor, []):
        if node.op_type in SHAPE_ONLY:
            continue
        if node.op_type in CHANNEL_KEEPING:
            below = _gemms_reading(node.output[0], readers, inits)
            if below is None:
                return None
            found.extend(below)
        elif node.op_type in ("MatMul", "Gemm") and list(node.input).index(tensor) == 0 \
                and len(node.input) > 1 and node.input[1] in inits and _weight_axis(node) is not None \
                and len(inits[node.input[1]].dims) == 2:
            found.append(node)
        else:
            return None
    return found


def smooth_targets(graph: onnx.GraphProto, head: frozenset[str] = frozenset()) -> list[SmoothTarget]:
    """The LayerNorms outside ``head`` whose output only weight GEMMs read, with a constant 1-D scale (and bias).

    A 1-D scale means the norm's affine is per channel of the last axis, the GEMMs' input channels; a
    Reshape between them keeps the last axis whole in a ViT (tokens x channels -> rows x channels),
    which :func:`smooth` checks against the weights' input channels.
    """
    inits, readers = _initializers(graph), _readers(graph)
    targets = []
    for node in graph.node:
        if node.op_type != "LayerNormalization" or node.name in head or node.input[1] not in inits:
            continue
        if len(node.input) > 2 and node.input[2] and node.input[2] not in inits:
            continue
        gemms = _gemms_reading(node.output[0], readers, inits)
        if gemms and len(inits[node.input[1]].dims) == 1:
            targets.append(SmoothTarget(node.name, node.output[0], tuple(g.name for g in gemms)))
    return targets


def activation_channel_max(model: onnx.ModelProto, images: np.ndarray, tensors: list[str],
                           threads: int = 0) -> dict[str, np.ndarray]:
    """max |x| per channel (the last axis) of each of ``tensors``, over ``images`` run through ``model``."""
    import onnxruntime

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in outputs:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    batch = graph_batch(model) or min(32, len(images))
    if not images.size or len(images) < batch:
        raise CalibError(f"{len(images)} calibration images for SmoothQuant", expected=f"at least one batch ({batch})",
                         fix="pass more calibration samples")
    found: dict[str, np.ndarray] = {}
    for start in range(0, len(images) - batch + 1, batch):
        values = session.run(tensors, {model.graph.input[0].name: images[start:start + batch]})
        for name, value in zip(tensors, values):
            channel = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            found[name] = np.maximum(found[name], channel) if name in found else channel
    return found


def smoothing_scales(activation_max: np.ndarray, weight_max: np.ndarray, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """SmoothQuant's ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (both floored at :data:`EPSILON`)."""
    if not 0 <= alpha <= 1:
        raise CalibError(f"SmoothQuant alpha {alpha}", expected="0 <= alpha <= 1 (0.5: the paper's default)")
    a = np.maximum(activation_max.astype(np.float64), EPSILON)
    w = np.maximum(weight_max.astype(np.float64), EPSILON)
    return (a ** alpha / w ** (1 - alpha)).astype(np.float32)


def _weight(inits: dict, node: onnx.NodeProto) -> np.ndarray:
    return numpy_helper.to_array(inits[node.input[1]])


def _weight_in_max(weight: np.ndarray, axis: int) -> np.ndarray:
    """max |w| per input channel (``axis`` is the input-channel axis)."""
    return np.abs(weight).max(axis=1 - axis)


def smooth(model: onnx.ModelProto, activation_max: dict[str, np.ndarray], alpha: float = DEFAULT_ALPHA,
           head: frozenset[str] = frozenset()) -> tuple[onnx.ModelProto, dict]:
    """A copy of ``model`` with SmoothQuant folded into each target's LayerNorm affine and GEMM weights.

    ``activation_max``: max |x| per channel of each target LayerNorm's output
    (:func:`activation_channel_max`). Returns the smoothed model and a report (per LayerNorm: the
    GEMMs, the range spread of ``max|X_j|`` before and after).
    """
    smoothed = onnx.ModelProto()
    smoothed.CopyFrom(model)
    graph = smoothed.graph
    inits = _initializers(graph)
    nodes = {n.name: n for n in graph.node}
    readers = _readers(graph)
    report = []
    for target in smooth_targets(graph, head):
        if target.output not in activation_max:
            raise CalibError(f"no activation range for {target.output} (LayerNorm {target.norm})",
                             expected="max |x| per channel of every LayerNorm output SmoothQuant smooths",
                             fix="measure them with calib.smoothquant.activation_channel_max on the same graph")
        gemms = [nodes[g] for g in target.gemms]
        weight_max = np.max([_weight_in_max(_weight(inits, g), _weight_axis(g)) for g in gemms], axis=0)
        x_max = activation_max[target.output]
        if x_max.shape != weight_max.shape:
            raise CalibError(f"LayerNorm {target.norm}: {x_max.shape[0]} activation channels",
                             expected=f"{weight_max.shape[0]}, the weights' input channels")
        s = smoothing_scales(x_max, weight_max, alpha)
        norm = nodes[target.norm]
        for index in (1, 2):
            if len(norm.input) > index and norm.input[index]:
                _replace(graph, inits, readers, norm, index, numpy_helper.to_array(inits[norm.input[index]]) / s)
        for gemm in gemms:
            axis = _weight_axis(gemm)
            factor = s[:, None] if axis == 0 else s[None, :]
            _replace(graph, inits, readers, gemm, 1, _weight(inits, gemm) * factor)
        report.append({"layernorm": target.norm, "gemms": list(target.gemms),
                       "channel_spread_before": float(x_max.max() / max(x_max.min(), EPSILON)),
                       "channel_spread_after": float((x_max / s).max() / max((x_max / s).min(), EPSILON))})
    return smoothed, {"alpha": alpha, "smoothed": report}


def _replace(graph: onnx.GraphProto, inits: dict, readers: dict, node: onnx.NodeProto, index: int,
             value: np.ndarray) -> None:
    """Give ``node``'s input ``index`` the constant ``value``: in place when only it reads the old one, else a copy."""
    old = node.input[index]
    value = value.astype(numpy_helper.to_array(inits[old]).dtype)
    if len(readers[old]) == 1:
        inits[old].CopyFrom(numpy_helper.from_array(value, old))
        return
    name = f"{old}_smoothed_{node.name}"
    graph.initializer.append(numpy_helper.from_array(value, name))
    inits[name] = graph.initializer[-1]
    readers[old].remove(node)
    readers[name].append(node)
    node.input[index] = name
