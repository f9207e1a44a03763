"""The accuracy gate's files for a bundle (jetson.accuracy_gate runs it on the device): a few held-out images
preprocessed as the source graph takes them, and the source graph's float32 ONNX Runtime outputs for them.

Images come from ``data``'s test split (the images `edge quantize` checks its graphs on), preprocessed by the
graph's own recorded preprocessing (``edge export``'s metadata) and shaped as its input. A graph without that
metadata, or with several inputs, gets seeded normal values instead (recorded as ``random``): its outputs are
still compared, but no images stand behind the top-1 agreement. Every variant made from one source graph
(each precision) shares its files; equal images are written once.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edge.errors import EdgeError
from jetson.accuracy_gate import GATE, GateSpec, run_in_batches, thresholds_for


@dataclass(frozen=True)
class GateFiles:
    """A source graph's gate: its files relative to the bundle, the image count, where the images came from."""

    inputs: dict[str, str]
    reference: dict[str, str]
    images: int
    data: str
    source: str

    def spec(self, precision: str, tf32: bool) -> GateSpec:
        """The manifest's gate of the variant at ``precision`` (its thresholds: jetson.accuracy_gate's)."""
        return GateSpec(inputs=self.inputs, reference=self.reference, images=self.images, data=self.data,
                        source=self.source, thresholds=thresholds_for(precision, tf32))


def _float_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    from edge.check.feeds import graph_inputs

    return graph_inputs(model)


def _sample_shape(value: onnx.ValueInfoProto) -> list[int]:
    """An input's shape less the batch (a dynamic dimension: 1)."""
    return [d.dim_value if d.dim_value > 0 else 1 for d in value.type.tensor_type.shape.dim[1:]]


def _input_spec(model: onnx.ModelProto):
    """The preprocessing ``edge export`` recorded in the graph (an edge.data InputSpec); None without it."""
    from edge.data import InputSpec
    from edge.onnx_metadata import metadata_of, preprocessing

    try:
        config = preprocessing(metadata_of(model))
    except KeyError:
        return None
    return InputSpec(*config["input_size"], config["mean"], config["std"], config["interpolation"])


def _dataset_images(model: onnx.ModelProto, data: str | None, count: int,
                    source: str) -> tuple[np.ndarray, str] | None:
    """Up to ``count`` test images of ``data`` (None: a bundled model's check set, else refused naming --gate-data)
    preprocessed as the graph records, in its input's shape, and the data set's name; None when the graph records
    no preprocessing or its input holds another number of values per image."""
    from edge.data import load_dataset
    from edge.models import data_for

    inputs = _float_inputs(model)
    spec = _input_spec(model)
    if len(inputs) != 1 or spec is None:
        return None
    data = data_for(data, source, "--gate-data", check=True)
    dataset = load_dataset(data, "test")
    if len(dataset) < count:   # a default larger than the data: what there is, said
        print(f"note: --gate-images {count}: {dataset.name} holds {len(dataset)} test images: the accuracy gate "
              f"uses all {len(dataset)}", file=sys.stderr)
        count = len(dataset)
    images = dataset.inputs(spec, count).numpy().astype(np.float32)
    shape = _sample_shape(inputs[0])
    if int(np.prod(images.shape[1:])) != int(np.prod(shape)):
        return None
    return images.reshape(count, *shape), data


def gate_inputs(model: onnx.ModelProto, source: str, data: str | None, count: int, seed: int = 0) \
        -> tuple[dict[str, np.ndarray], str]:
    """The gate's inputs by name (``count`` per input, fewer when the data holds fewer) and what they are
    (``DATA:test`` or ``random``)."""
    found = _dataset_images(model, data, count, source)
    inputs = _float_inputs(model)
    if found is not None:
        images, name = found
        return {inputs[0].name: images}, f"{name}:test"
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in inputs:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        if not np.issubdtype(dtype, np.floating):
            raise EdgeError(f"{source}: input {value.name!r} is {dtype}, so no accuracy gate inputs can be made up",
                            expected="floating-point inputs, or one image input with edge export's preprocessing",
                            fix="bundle with --gate-images 0 (no accuracy gate on the device)")
        feeds[value.name] = rng.standard_normal((count, *_sample_shape(value))).astype(np.float32)
    return feeds, "random"


def graph_batch_size(model: onnx.ModelProto) -> int:
    """The static batch of the graph's first input (1 when it is dynamic)."""
    dims = _float_inputs(model)[0].type.tensor_type.shape.dim
    return dims[0].dim_value if dims and dims[0].dim_value > 0 else 1


def reference_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's ONNX Runtime outputs (float32) for every image, run in its batch (the last chunk padded)."""
    from edge.check.compare import ort_session

    model = onnx.load(str(path), load_external_data=False)
    session = ort_session(str(path))
    names = [o.name for o in session.get_outputs()]
    typed = {i.name: i for i in _float_inputs(model)}

    def run(chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cast = {n: v.astype(onnx.helper.tensor_dtype_to_np_dtype(typed[n].type.tensor_type.elem_type))
                for n, v in chunk.items()}
        return dict(zip(names, session.run(None, cast), strict=True))

    outputs = run_in_batches(run, feeds, graph_batch_size(model), str(path))
    for name, array in outputs.items():
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise EdgeError(f"{path}: output {name!r} is not finite on the accuracy gate's inputs",
                            expected="finite reference outputs to compare the device's engines with",
                            fix="check the graph on these images (`edge check`), or bundle with --gate-images 0")
    return {name: array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array
            for name, array in outputs.items()}


def _save(array: np.ndarray, out: Path, relative: str) -> str:
    (out / relative).parent.mkdir(parents=True, exist_ok=True)
    np.save(out / relative, array, allow_pickle=False)
    return relative


def write_gate(name: str, source: Path, out: Path, data: str | None, count: int) -> GateFiles:
    """The gate of variant ``name``'s float32 source graph in the bundle folder ``out``: the inputs in
    ``gate/inputs/SHA.npy`` (written once per content), the reference outputs in ``gate/NAME/reference_K.npy``."""
    model = onnx.load(str(source), load_external_data=False)
    feeds, kind = gate_inputs(model, str(source), data, count)
    inputs = {}
    for input_name, array in feeds.items():
        digest = hashlib.sha256(array.tobytes() + str(array.shape).encode()).hexdigest()[:16]
        relative = f"{GATE}/inputs/{digest}.npy"
        inputs[input_name] = relative if (out / relative).exists() else _save(array, out, relative)
    reference = {output: _save(array, out, f"{GATE}/{name}/reference_{k}.npy")
                 for k, (output, array) in enumerate(reference_outputs(source, feeds).items())}
    images = len(next(iter(feeds.values())))   # fewer than count when the data holds fewer test images
    return GateFiles(inputs=inputs, reference=reference, images=images, data=kind, source=str(source))
