"""A graph's image input and the size a user gives for it (``--input-size CxHxW`` or ``HxW``).

Graphs from other exporters record no input size; their input's declared shape may say it, in part or
not at all (Hugging Face exporters declare ``pixel_values`` as ``[batch, channels, height, width]``,
all dynamic). edge clean checks every change on random inputs, a dynamic dimension becoming 2, which a
ViT's patch embedding refuses: :func:`with_input_size` writes the given C, H and W into the input's
declared shape (the batch stays as it is), like onnxsim's ``--overwrite-input-shape``; the computation
is untouched. :mod:`edge.precision.calibration` resolves the size of calibration images the same way.
"""

from __future__ import annotations

import onnx

from edge.check.feeds import graph_inputs
from edge.errors import EdgeError

Dims = list[int | None]   # a declared shape, None where dynamic


def image_input(model: onnx.ModelProto) -> tuple[str, Dims] | None:
    """The graph's one input (name, declared dims), or None with several inputs."""
    inputs = graph_inputs(model)
    if len(inputs) != 1:
        return None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in inputs[0].type.tensor_type.shape.dim]
    return inputs[0].name, dims


def input_count(model: onnx.ModelProto) -> int:
    return len(graph_inputs(model))


def shown(dims: Dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def parse_input_size(text: str) -> tuple[int, ...]:
    """``"3x224x224"`` -> (3, 224, 224); ``"224x224"`` -> (224, 224) (channels from the graph)."""
    parts = text.strip().lower().split("x")
    expected = "CxHxW (e.g. 3x224x224) or HxW (e.g. 224x224), positive integers"
    if len(parts) not in (2, 3):
        raise EdgeError(f"input size {text!r}", expected=expected, found=f"{len(parts)} numbers",
                        fix="pass e.g. --input-size 1x28x28")
    try:
        size = tuple(int(p) for p in parts)
    except ValueError as e:
        raise EdgeError(f"input size {text!r}", expected=expected, fix="pass e.g. --input-size 1x28x28") from e
    if min(size) < 1:
        raise EdgeError(f"input size {text!r}", expected=expected, found="a value below 1",
                        fix="pass e.g. --input-size 1x28x28")
    return size


def with_channels(size: tuple[int, ...], channels: int | None, dims: Dims | None, source: str) -> tuple[int, int, int]:
    """(C, H, W) of a given size: C as given, else ``channels`` (known otherwise), else the graph's static C."""
    if len(size) == 3:
        return size[0], size[1], size[2]
    if channels is None and dims is not None and len(dims) == 4:
        channels = dims[1]
    if channels is None:
        raise EdgeError(f"--input-size {'x'.join(map(str, size))} for {source} gives no channel count",
                        expected="CxHxW where the graph's input shape does not say the channels",
                        found=f"input shape {shown(dims) if dims is not None else 'unknown'}",
                        fix=f"pass --input-size Cx{size[0]}x{size[1]} (e.g. 3x{size[0]}x{size[1]} for RGB)")
    return channels, size[0], size[1]


def check_fits(size: tuple[int, int, int], dims: Dims | None, name: str, source: str) -> None:
    """Images of ``size`` (C, H, W), batched NCHW, must fit the graph's input where its shape is static."""
    if dims is None:
        return
    if len(dims) != 4:
        raise EdgeError(f"{source}: input {name!r} has shape {shown(dims)}",
                        expected="one image input [N, C, H, W] (NCHW, as timm and torch.onnx write it)",
                        fix="export the model with an NCHW image input")
    wrong = [(axis, want, have) for axis, want, have in zip("CHW", size, dims[1:], strict=True)
             if have is not None and have != want]
    if wrong:
        raise EdgeError(f"{source}: input size {'x'.join(map(str, size))} does not fit input {name!r} of shape "
                        f"{shown(dims)}", expected="the graph's own C, H and W (NCHW)",
                        found=", ".join(f"{axis} {want} where the graph has {have}" for axis, want, have in wrong),
                        fix=f"pass --input-size {'x'.join(str(d or s) for d, s in zip(dims[1:], size, strict=True))}")


def with_input_size(model: onnx.ModelProto, size: tuple[int, ...], source: str) -> onnx.ModelProto:
    """A copy of ``model`` whose one image input [N, C, H, W] declares ``size`` (C, H, W; or H, W with a static
    C); a dimension already static must agree."""
    image = image_input(model)
    if image is None:
        raise EdgeError(f"--input-size for {source}: the graph has {input_count(model)} inputs",
                        expected="one image input [N, C, H, W]",
                        fix="leave --input-size out and store sample inputs next to the model "
                            "(test_data_set_0/input_0.pb, the ONNX model zoo layout)")
    name, dims = image
    full = with_channels(size, None, dims, source)
    check_fits(full, dims, name, source)
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    target = next(i for i in pinned.graph.input if i.name == name)
    for dim, value in zip(list(target.type.tensor_type.shape.dim)[1:], full, strict=True):
        dim.dim_value = value   # clears dim_param (one field of a oneof)
    return pinned
