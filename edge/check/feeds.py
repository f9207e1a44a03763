"""The inputs a graph is verified on, and the comparison of all its outputs.

A graph from elsewhere may have several inputs and outputs, integer or string tensors and
dynamic dimensions. Floating-point inputs can be made up (seeded normal values; a dynamic
dimension becomes 2, or its size in the stored inputs); other inputs cannot (an index or a
shape must be valid), so they come from the sample inputs stored next to the model in the ONNX
model zoo layout, ``test_data_set_N/input_K.pb``, which are used whenever present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from edge.check.compare import Comparison, Tolerance, compare_arrays, ort_session
from edge.errors import EdgeError

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class InputSet:
    """Named inputs for every graph input; ``expected``: the outputs stored with them, if any."""

    name: str
    feeds: Feeds
    expected: list[np.ndarray] | None = None


# dimensions of unknown size are 2 in made-up inputs: a batch of 2 shows batch mix-ups that 1 hides
DYNAMIC_DIM = 2

SAMPLE_LAYOUT = "test_data_set_0/input_0.pb, input_1.pb, ... (onnx.TensorProto files, the ONNX model zoo layout)"


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: graph inputs less initializers (IR < 4 lists every weight as an input)."""
    weights = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


def check_tensor_io(model: onnx.ModelProto, source: str) -> None:
    """Refuse a graph whose inputs or outputs are not tensors (sequences, maps, optionals)."""
    for kind, values in (("input", graph_inputs(model)), ("output", model.graph.output)):
        for value in values:
            if value.type.WhichOneof("value") != "tensor_type":
                raise EdgeError(f"{source}: {kind} {value.name!r} is a {value.type.WhichOneof('value')}",
                                expected="tensor inputs and outputs (edge clean compares outputs tensor by tensor)",
                                fix="clean the part of the graph between tensors, or deploy this graph as it is")


def _dtype(value: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))


def floating_inputs(model: onnx.ModelProto) -> bool:
    """Whether every input is floating-point, so random values can stand in for real ones."""
    return all(np.issubdtype(_dtype(v), np.floating) for v in graph_inputs(model))


def random_feeds(model: onnx.ModelProto, seed: int, scale: float = 1.0, source: str = "the model",
                 like: Feeds | None = None) -> Feeds:
    """Seeded normal values of each input's declared shape, or of its shape in ``like`` (stored
    sample inputs, which fix the dynamic dimensions); refused for a non-float input."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph_inputs(model):
        dtype = _dtype(value)
        if not np.issubdtype(dtype, np.floating):
            raise EdgeError(f"{source}: input {value.name!r} is {dtype} and no sample inputs are stored with it",
                            expected="floating-point inputs (random values stand in for them), or sample inputs",
                            fix=f"put sample inputs next to the model: {SAMPLE_LAYOUT}")
        dims = like[value.name].shape if like else \
            [d.dim_value if d.dim_value > 0 else DYNAMIC_DIM for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal(dims) * scale).astype(dtype)
    return feeds


def _load_tensors(files: list[Path]) -> list[np.ndarray]:
    tensors = []
    for file in files:
        try:
            tensors.append(numpy_helper.to_array(onnx.load_tensor(str(file))))
        except Exception as e:  # noqa: BLE001 - protobuf raises several types
            raise EdgeError(f"{file} is not an ONNX tensor", found=str(e)[:200],
                            fix="fix or remove its test_data_set folder") from e
    return tensors


def _numbered(folder: Path, prefix: str) -> list[Path]:
    return sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.rpartition("_")[2]))


def stored_sets(model_path: Path, model: onnx.ModelProto) -> list[InputSet]:
    """The sample inputs (and outputs) in ``test_data_set_*`` folders next to ``model_path``; none if absent."""
    names = [v.name for v in graph_inputs(model)]
    sets = []
    for folder in sorted(model_path.parent.glob("test_data_set_*")):
        inputs, outputs = _numbered(folder, "input"), _numbered(folder, "output")
        if not inputs:
            continue
        if len(inputs) != len(names):
            raise EdgeError(f"{folder} holds {len(inputs)} inputs for {model_path}",
                            expected=f"{len(names)}, one per graph input ({', '.join(names)})",
                            fix="fix or remove the folder")
        expected = _load_tensors(outputs) if len(outputs) == len(model.graph.output) else None
        sets.append(InputSet(folder.name, dict(zip(names, _load_tensors(inputs), strict=True)), expected))
    return sets


def input_sets(model_path: Path | None, model: onnx.ModelProto, randoms: Sequence[tuple[str, int, float]],
               source: str = "the model") -> list[InputSet]:
    """The stored sample inputs, then ``randoms`` (name, seed, scale) if every input is floating-point,
    shaped like the first stored set if there is one."""
    stored = stored_sets(model_path, model) if model_path is not None else []
    if stored and not floating_inputs(model):
        return stored
    like = stored[0].feeds if stored else None
    return stored + [InputSet(name, random_feeds(model, seed, scale, source, like)) for name, seed, scale in randoms]


def _session(model: onnx.ModelProto):
    return ort_session(model.SerializeToString())


def _run(session, inputs: Sequence[InputSet]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failed run raises with the message; ORT's log line would repeat it
    return [session.run(None, s.feeds, quiet) for s in inputs]


def run_graph(model: onnx.ModelProto, inputs: Sequence[InputSet]) -> list[list[np.ndarray]]:
    """All outputs of ``model`` in ONNX Runtime, for each input set."""
    return _run(_session(model), inputs)


def reference_outputs(model: onnx.ModelProto, inputs: Sequence[InputSet], source: str) -> list[list[np.ndarray]]:
    """The outputs every change is checked against; a graph ONNX Runtime cannot load or run is refused."""
    try:
        session = _session(model)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        raise EdgeError(f"ONNX Runtime cannot load {source} (edge clean checks every change in it)",
                        found=str(e).strip()[:600],
                        fix="the graph uses an operator ONNX Runtime does not implement, or cannot set up here "
                            "(its message above says which): deploy the graph as it is, or re-export it with "
                            "standard operators at opset 17 or later") from e
    try:
        return _run(session, inputs)
    except Exception as e:  # noqa: BLE001
        shapes = "; ".join(f"{s.name}: " + ", ".join(f"{k} {list(v.shape)}" for k, v in s.feeds.items())
                           for s in inputs)
        raise EdgeError(f"ONNX Runtime fails running {source} (edge clean checks every change in it)",
                        found=f"{str(e).strip()[:400]} (inputs {shapes[:300]})",
                        fix="if the inputs are made up (random values; dynamic dimensions 2), give an image "
                            "input's size (edge clean --input-size CxHxW) or store sample inputs "
                            f"next to the model: {SAMPLE_LAYOUT}; if the graph relies on an old operator "
                            "version's rules (e.g. broadcasting), re-export it at opset 17 or later") from e


def _compare_one(ref: np.ndarray, cand: np.ndarray, tolerance: Tolerance, inputs: str) -> Comparison:
    """Floating-point outputs within ``tolerance`` (NaN and infinities where the reference has them,
    as sqrt of a random negative gives), any other output exactly."""
    if ref.shape == cand.shape and np.issubdtype(ref.dtype, np.floating):
        finite = np.isfinite(ref)
        if np.array_equal(ref[~finite], cand[~finite], equal_nan=True):
            with np.errstate(over="ignore"):  # float64 outputs near their limit (exp of a large input)
                return compare_arrays(ref[finite], cand[finite], tolerance, inputs)
    same = ref.shape == cand.shape and ref.dtype == cand.dtype and bool(np.array_equal(ref, cand))
    return Comparison(0.0 if same else float("inf"), 0.0 if same else float("inf"), inputs, same)


def compare_outputs(reference: list, candidate: list, tolerance: Tolerance, inputs: str) -> Comparison:
    """All outputs compared (see :func:`_compare_one`): the worst figures, passed if all pass."""
    worst = Comparison(0.0, 0.0, inputs, True)
    for ref, cand in zip(reference, candidate, strict=True):
        one = _compare_one(np.asarray(ref), np.asarray(cand), tolerance, inputs)
        worst = Comparison(max(worst.max_abs, one.max_abs), max(worst.rel_l2, one.rel_l2), inputs,
                           worst.passed and one.passed)
    return worst


def compare_sets(reference: list, candidate: list, inputs: Sequence[InputSet], tolerance: Tolerance) -> Comparison:
    """Outputs against ``reference`` for every input set: the first failure, else the worst."""
    comparisons = [compare_outputs(ref, out, tolerance, s.name)
                   for s, ref, out in zip(inputs, reference, candidate, strict=True)]
    failed = [c for c in comparisons if not c.passed]
    return failed[0] if failed else max(comparisons, key=lambda c: c.max_abs)
