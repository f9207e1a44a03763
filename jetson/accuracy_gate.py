"""The accuracy gate: after each engine is built, the runner runs it on a few real images the bundle carries
and compares its outputs with the float32 ONNX Runtime outputs of the variant's source graph (computed on
the host by ``edge bundle``). A variant outside its precision's thresholds is marked ``wrong``: its
engine computes something else than its graph, so its latency is no speedup. Device-side: numpy only.

What is compared, per output:

* ``top1_agreement``: the share of images whose arg-max over the last axis is the reference's (outputs
  with a class axis only: rank 2 or more and more than one score);
* ``max_abs_error``: the largest ``|output - reference|`` (reported; its scale is the model's, so it
  judges nothing);
* ``max_rel_error``: ``max_abs_error`` divided by the largest ``|reference|`` of that output (an
  element-wise ratio is meaningless where a reference value is near zero, as logits often are; an
  all-zero reference: the absolute error);
* ``non_finite``: NaN and infinite values in the engine's output, which make the variant wrong.

The thresholds per precision (:data:`THRESHOLDS`; the bundle records the ones it chose per variant):

* fp32 with TF32 (TensorRT's default): ``max_rel_error`` 1e-2, agreement >= 0.9. TF32 rounds the inputs
  of every matrix product to 10 mantissa bits (2^-11, about 5e-4 each); through a dozen transformer
  blocks ONNX Runtime and the engine differ by about 1e-3 of the outputs' scale, and the worst element
  of 32 images lies above the typical one: 10x that leaves room without letting a wrong engine pass.
* fp32 without TF32 (``edge bundle --no-tf32``): 1e-3: only the kernels' summation order differs
  (about 1e-5..1e-4 through a deep network), plus TensorRT's approximations of erf/exp.
* fp16: 5e-2, agreement >= 0.9: float16 rounds every activation (2^-11), LayerNorm and Softmax
  reductions included; ViTs differ by about 1e-2 of the logits' scale. The published failures (a
  LayerNorm overflowing in float16: top-1 85 % -> 19 %; DINOv3 on TensorRT 10.3) are off by O(1).
* int8: agreement >= 0.8, no error bound: quantisation noise of 5-20 % of the logits' scale still
  classifies right, so int8 is judged by top-1; the published collapse (ModelOpt's default int8 of
  ViT-B/16 at 0.03-5 % top-1) agrees on almost no image.

The host's figures travel with the variant (``host``: what ``edge quantize``'s own gate measured of
the fp16 or int8 graph in ONNX Runtime against the same float32 graph, on the first held-out test
images of the same data, of which the device's images are the first ones; ``edge.accuracy_gate`` in the
graph's metadata). The verdict puts the engine's top-1 agreement beside the graph's
(``versus_host``): an engine well below its graph loses accuracy in TensorRT (its kernels, fusions or
precisions), not in the quantization. The comparison is reported, not judged: the thresholds judge.

The graph's gate (``edge quantize``: the fp16 or int8 graph against its float32 source in ONNX Runtime on
the host, 500 test images, per output ``top1_agreement`` and ``rel_l2`` = ``||graph - float32|| /
||float32||``) is judged here too, by :data:`GRAPH_THRESHOLDS` and :func:`graph_failures`. Its thresholds come
from what the two reference models measured (ONNX Runtime on this CPU; agreement and rel L2 of the logits;
"500-image slices": the four slices of the first 2,000 Fashion-MNIST test images,
calibration on 500 training images; "gate": the gate's own 500 images of fmnist-mini, calibration on 32
or 64 fmnist-mini training images as the tests and the documented commands use):

* fp16: top-1 agreement >= 0.99, rel L2 <= 1e-2. fmnist-deit-tiny: 1.000 and 1.3e-4;
  fmnist-deit-tiny-outliers: 1.000 and 1.1e-3 (1.4e-3 on its worst slice). A hundredth of the images
  may flip on a model with closer logits; 7x the worst error leaves room for other images without
  admitting a broken conversion (a float16 overflow is off by O(1)).
* int8: top-1 agreement >= 0.95, rel L2 <= 0.2. fmnist-deit-tiny, both placements: 0.976-0.990 on the
  slices, 0.980-0.984 on the gate's images, rel L2 0.023-0.049. The outlier model with the residual
  stream quantized collapses: ``--placement modelopt`` 0.66 and 0.61, ``--placement skip`` 0.19 and 1.15.
  Healthy int8 flips 1-2.5 % of these images; 5 % leaves room for a model with more near-ties (1,000
  classes) and stays far above any collapse; rel L2 0.2 is 4x the worst healthy figure.

Agreement thresholds allow near-ties: with 32 images 0.9 lets 3 images flip (a legitimate fp16 engine
flips about 1 %), 0.8 lets 6 flip (a legitimate int8 ViT about 5 %: 4+ flips of 32 happen 7 % of the
time, 7+ flips under 0.1 %).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jetson.errors import JetsonError

if TYPE_CHECKING:  # numpy is imported where it is used: `python3 -m jetson check` reports it missing
    import numpy as np

GATE = "gate"  # the bundle's folder of gate images and reference outputs
DEFAULT_GATE_IMAGES = 32
PASS, WRONG = "pass", "wrong"


@dataclass(frozen=True)
class Thresholds:
    """What a variant's engine must meet; None: not judged (still reported)."""

    min_top1_agreement: float | None
    max_rel_error: float | None
    max_abs_error: float | None = None
    max_rel_l2: float | None = None   # the graph's gate (edge quantize); engines are judged by max_rel_error

    def to_json(self) -> dict:
        record = asdict(self)
        if record["max_rel_l2"] is None:   # an engine's thresholds, as bundles have always recorded them
            del record["max_rel_l2"]
        return record

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Thresholds:
        try:
            values = {k: data[k] for k in ("min_top1_agreement", "max_rel_error")}
            values["max_abs_error"] = data.get("max_abs_error")
            values["max_rel_l2"] = data.get("max_rel_l2")
        except (KeyError, TypeError) as e:
            raise JetsonError(f"{where}: the accuracy gate's thresholds lack {e}",
                              fix="make the bundle again with `edge bundle`") from e
        for name, value in values.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise JetsonError(f"{where}: accuracy gate threshold {name} is {value!r}", expected="a number or null",
                                  fix="make the bundle again with `edge bundle`")
        return cls(**values)


#: per precision (fp32 with and without TF32): the module docstring says why each number
THRESHOLDS = {
    "fp32": Thresholds(min_top1_agreement=0.9, max_rel_error=1e-2),
    "fp32-no-tf32": Thresholds(min_top1_agreement=0.9, max_rel_error=1e-3),
    "fp16": Thresholds(min_top1_agreement=0.9, max_rel_error=5e-2),
    "int8": Thresholds(min_top1_agreement=0.8, max_rel_error=None),
}


#: the graph's gate, per precision of ``edge quantize`` (ONNX Runtime, 500 images): the docstring says why
GRAPH_THRESHOLDS = {
    "fp16": Thresholds(min_top1_agreement=0.99, max_rel_error=None, max_rel_l2=1e-2),
    "int8": Thresholds(min_top1_agreement=0.95, max_rel_error=None, max_rel_l2=0.2),
}


def thresholds_for(precision: str, tf32: bool = True) -> Thresholds:
    """The default thresholds of a variant built at ``precision`` (fp32: with TF32 or not)."""
    if precision == "fp32" and not tf32:
        return THRESHOLDS["fp32-no-tf32"]
    if precision not in THRESHOLDS:
        raise JetsonError(f"no accuracy gate thresholds for precision {precision!r}",
                          expected=f"one of {', '.join(k for k in THRESHOLDS if k != 'fp32-no-tf32')}")
    return THRESHOLDS[precision]


# the comparison
def top1_agreement(output: np.ndarray, reference: np.ndarray) -> float | None:
    """The share of rows whose arg-max over the last axis agrees; None for an output without a class axis."""
    import numpy as np

    if reference.ndim < 2 or reference.shape[-1] < 2:
        return None
    scores = np.nan_to_num(output, nan=-np.inf)  # a NaN row agrees with nothing it should not
    return float((scores.argmax(-1) == reference.argmax(-1)).mean())


def compare_output(output: np.ndarray, reference: np.ndarray, name: str, variant: str) -> dict:
    """The figures of one output against its reference (the module docstring defines them)."""
    import numpy as np

    if output.shape != reference.shape:
        raise JetsonError(f"{variant}: the engine's output {name!r} has shape {list(output.shape)}, the reference "
                          f"{list(reference.shape)}", expected="the shape of the source graph's output",
                          fix="the bundle's gate files do not belong to this graph: make the bundle again")
    out, ref = output.astype(np.float64), reference.astype(np.float64)
    finite = np.isfinite(out)
    error = np.abs(out - ref)[finite]
    max_abs = float(error.max()) if error.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    return {"top1_agreement": top1_agreement(out, ref), "max_abs_error": max_abs,
            "max_rel_error": max_abs / scale if scale > 0 else max_abs,  # an all-zero reference: the absolute
            "non_finite": int(out.size - finite.sum()), "reference_max_abs": scale}


def failures(figures: Mapping[str, dict], thresholds: Thresholds) -> list[str]:
    """Why the outputs miss the thresholds, one line each; empty when they pass."""
    found = []
    for name, f in figures.items():
        if f["non_finite"]:
            found.append(f"{name}: {f['non_finite']} non-finite values (NaN or infinity)")
        agreement, least = f["top1_agreement"], thresholds.min_top1_agreement
        if agreement is not None and least is not None and agreement < least:
            found.append(f"{name}: top-1 agreement {agreement:.3f} < {least:g}")
        for key, bound in (("max_rel_error", thresholds.max_rel_error), ("max_abs_error", thresholds.max_abs_error)):
            if bound is not None and f[key] > bound:
                found.append(f"{name}: {key.replace('_', ' ')} {f[key]:.3g} > {bound:g}")
    return found


def graph_failures(per_output: Mapping[str, dict], thresholds: Thresholds) -> list[str]:
    """The graph's gate (``edge quantize``): why its outputs (``top1_agreement`` where they are class scores,
    ``rel_l2``) miss the thresholds, one line each; empty when they pass."""
    found = []
    for name, f in per_output.items():
        agreement, least = f.get("top1_agreement"), thresholds.min_top1_agreement
        if agreement is not None and least is not None and agreement < least:
            found.append(f"{name}: top-1 agreement {agreement:.3f} < {least:g}")
        if thresholds.max_rel_l2 is not None and f["rel_l2"] > thresholds.max_rel_l2:
            found.append(f"{name}: rel L2 {f['rel_l2']:.3g} > {thresholds.max_rel_l2:g}")
    return found


def judge(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], thresholds: Thresholds,
          variant: str) -> dict:
    """Every reference output compared with the engine's: the figures, the failures and ``pass``/``wrong``."""
    import numpy as np

    missing = [name for name in reference if name not in outputs]
    if missing:
        raise JetsonError(f"{variant}: the engine has no output {missing[0]!r}, which the gate's reference has",
                          expected=f"outputs {', '.join(reference)}", found=", ".join(outputs) or "none",
                          fix="the bundle's gate files do not belong to this graph: make the bundle again")
    figures = {name: compare_output(np.asarray(outputs[name]), ref, name, variant) for name, ref in reference.items()}
    missed = failures(figures, thresholds)
    agreements = [f["top1_agreement"] for f in figures.values() if f["top1_agreement"] is not None]
    return {"status": WRONG if missed else PASS, "failures": missed, "thresholds": thresholds.to_json(),
            "top1_agreement": min(agreements) if agreements else None,
            "max_abs_error": max(f["max_abs_error"] for f in figures.values()) if figures else None,
            "max_rel_error": max(f["max_rel_error"] for f in figures.values()) if figures else None,
            "outputs": figures}


# running an engine on the images
def _chunk(inputs: Mapping[str, np.ndarray], start: int, batch: int) -> tuple[dict[str, np.ndarray], int]:
    """Images ``start .. start + batch`` of every input, the last chunk padded with its last image; the real count."""
    import numpy as np

    chunk = {name: array[start:start + batch] for name, array in inputs.items()}
    real = len(next(iter(chunk.values())))
    if real < batch:
        chunk = {name: np.concatenate([a, np.repeat(a[-1:], batch - real, axis=0)]) for name, a in chunk.items()}
    return chunk, real


def run_in_batches(run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
                   inputs: Mapping[str, np.ndarray], batch: int, label: str) -> dict[str, np.ndarray]:
    """``run`` (one inference of ``batch`` images) over every image, in chunks of ``batch`` (the last one padded);
    the outputs of the real images, by name. Every output's first axis must be the batch."""
    import numpy as np

    count = len(next(iter(inputs.values())))
    if any(len(array) != count for array in inputs.values()):
        raise JetsonError(f"{label}: the gate's inputs hold different numbers of images",
                          found=", ".join(f"{n} {len(a)}" for n, a in inputs.items()),
                          fix="make the bundle again with `edge bundle`")
    pieces: dict[str, list[np.ndarray]] = {}
    for start in range(0, count, batch):
        chunk, real = _chunk(inputs, start, batch)
        for name, output in run(chunk).items():
            output = np.asarray(output)
            if output.ndim == 0 or output.shape[0] != batch:
                raise JetsonError(f"{label}: output {name!r} has shape {list(output.shape)}",
                                  expected=f"the batch ({batch}) as its first dimension (the gate compares per image)",
                                  fix="bundle the graph with a leading batch dimension on every output, or "
                                      "make it with --gate-images 0 (no gate)")
            pieces.setdefault(name, []).append(output[:real])
    return {name: np.concatenate(parts) for name, parts in pieces.items()}


# what the bundle carries
@dataclass(frozen=True)
class GateSpec:
    """A variant's gate in the manifest: the image files per input, the reference file per output (paths
    relative to the bundle), how many images, where they came from, the thresholds, and the host's figures
    of the variant's graph (``edge quantize``'s gate; None for a graph it did not make)."""

    inputs: dict[str, str]
    reference: dict[str, str]
    images: int
    data: str
    source: str
    thresholds: Thresholds
    host: dict | None = None

    def to_json(self) -> dict:
        return {"inputs": dict(self.inputs), "reference": dict(self.reference), "images": self.images,
                "data": self.data, "source": self.source, "thresholds": self.thresholds.to_json(),
                "host": self.host}

    @classmethod
    def from_json(cls, data: Any, where: str) -> GateSpec:
        try:
            spec = cls(inputs=dict(data["inputs"]), reference=dict(data["reference"]), images=int(data["images"]),
                       data=str(data["data"]), source=str(data["source"]),
                       thresholds=Thresholds.from_json(data["thresholds"], where), host=data.get("host"))
        except (KeyError, TypeError, ValueError) as e:
            raise JetsonError(f"{where}: the accuracy gate lacks a field", found=f"{type(e).__name__}: {e}",
                              fix="make the bundle again with `edge bundle`") from e
        if not spec.inputs or not spec.reference:
            raise JetsonError(f"{where}: the accuracy gate names no inputs or no reference outputs",
                              fix="make the bundle again with `edge bundle`")
        if spec.host is not None and not isinstance(spec.host, dict):
            raise JetsonError(f"{where}: the accuracy gate's host figures are {type(spec.host).__name__}",
                              expected="an object (edge quantize's gate) or null",
                              fix="make the bundle again with `edge bundle`")
        return spec

    def files(self) -> list[str]:
        return [*self.inputs.values(), *self.reference.values()]


def load_arrays(root: Path, files: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The ``.npy`` files (relative to ``root``) by tensor name; never unpickles."""
    import numpy as np

    arrays = {}
    for name, relative in files.items():
        try:
            arrays[name] = np.load(root / relative, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise JetsonError(f"the accuracy gate's {relative} cannot be read", found=str(e)[:200],
                              fix="copy the bundle again, or make it again with `edge bundle`") from e
    return arrays


def gate_engine(backend: Any, spec: GateSpec, root: Path, variant: str) -> dict:
    """Run ``backend`` (the benchmark's own: ``run(feeds)`` and ``batch``) on the gate's images and judge its
    outputs: the ``accuracy`` of the variant's result."""
    inputs = load_arrays(root, spec.inputs)
    reference = load_arrays(root, spec.reference)
    batch = int(getattr(backend, "batch", None) or 1)
    outputs = run_in_batches(backend.run, inputs, batch, variant)
    verdict = judge(outputs, reference, spec.thresholds, variant)
    return {**verdict, "images": spec.images, "data": spec.data, "batch": batch,
            "reference": f"float32 ONNX Runtime outputs of {spec.source}",
            "host": spec.host, "versus_host": versus_host(verdict, spec.host)}


def versus_host(verdict: Mapping[str, Any], host: Mapping[str, Any] | None) -> dict | None:
    """The engine's top-1 agreement beside its graph's on the host (``edge quantize``'s gate); None when either
    has none."""
    device = verdict.get("top1_agreement")
    graph = (host or {}).get("top1_agreement")
    if device is None or not isinstance(graph, (int, float)) or isinstance(graph, bool):
        return None
    return {"device_top1_agreement": device, "host_top1_agreement": float(graph),
            "host_images": (host or {}).get("images"), "difference": device - float(graph)}


def summary_line(variant: str, accuracy: dict) -> str:
    """The gate's verdict in one log line."""
    agreement = accuracy["top1_agreement"]
    words = [f"{variant}: accuracy gate {accuracy['status']} on {accuracy['images']} images"]
    if agreement is not None:
        words.append(f"top-1 agreement {agreement:.3f}")
    words.append(f"max rel error {accuracy['max_rel_error']:.3g}, max abs {accuracy['max_abs_error']:.3g}")
    compared = accuracy.get("versus_host")
    if compared:
        words.append(f"its graph on the host {compared['host_top1_agreement']:.3f} on {compared['host_images']} images")
    line = ", ".join(words)
    if accuracy["failures"]:
        line += "; " + "; ".join(accuracy["failures"]) + " (its latency is no speedup: the engine computes " \
                                                          "other outputs than its graph)"
    return line


# a TensorRT engine's buffers (jetson.trt_backend.TensorRTEngineBackend.run)
def copy_inputs(backend: Any, feeds: Mapping[str, np.ndarray]) -> None:
    """``feeds`` into the backend's input buffers, each cast to its tensor's type and checked for its shape."""
    import numpy as np

    from jetson.cuda import check

    cudart = backend.cudart
    for name, io in backend.io.items():
        if io["io"] != "input":
            continue
        if name not in feeds:
            raise JetsonError(f"{backend.label}: the accuracy gate has no images for input {name!r}",
                              found=", ".join(feeds), fix="make the bundle again with `edge bundle`")
        host = np.ascontiguousarray(feeds[name], dtype=io["dtype"])
        if list(host.shape) != list(io["shape"]):
            raise JetsonError(f"{backend.label}: the accuracy gate's images for input {name!r} have shape "
                              f"{list(host.shape)}", expected=f"the engine's {io['shape']}",
                              fix="the bundle's gate files do not belong to this graph: make the bundle again")
        check(cudart.cudaMemcpy(backend.buffers[name], host.ctypes.data, host.nbytes,
                                cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")


def read_outputs(backend: Any) -> dict[str, np.ndarray]:
    """The backend's output buffers copied to the host, by name."""
    import numpy as np

    from jetson.cuda import check

    cudart = backend.cudart
    outputs = {}
    for name, io in backend.io.items():
        if io["io"] == "output":
            host = np.empty(io["shape"], dtype=io["dtype"])
            check(cudart.cudaMemcpy(host.ctypes.data, backend.buffers[name], host.nbytes,
                                    cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
            outputs[name] = host
    return outputs


def check_accuracy(backend: Any, gate: GateSpec | None, root: Path, variant: str,
                   log: Callable[[str], None]) -> dict | None:
    """The runner's gate of one variant's engine (before its benchmark), ``gate`` as the variant's entry of the
    bundle in ``root`` gives it: the result's ``accuracy``, None (and said) when the bundle carries no gate."""
    if gate is None:
        log(f"{variant}: no accuracy gate (the bundle carries no gate images for it: `edge bundle --gate-images`)")
        return None
    accuracy = gate_engine(backend, gate, root, variant)
    log(summary_line(variant, accuracy))
    return accuracy
