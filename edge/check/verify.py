"""``edge verify``: do two models or graphs compute the same function (within tolerance)?

A side is a PyTorch model or an ONNX graph; both are run on the same seeded random inputs and
real images and compared with :mod:`edge.check.compare`. A side is made from what the caller
hands in (:func:`torch_side`: a loaded model, :func:`onnx_side`: a graph's path): loading a model
by name or from an artifact is the caller's (``edge verify`` uses :func:`edge.compress.load.load_model`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from edge.check.compare import Tolerance, compare_arrays
from edge.check.torch_compare import verification_inputs


@dataclass
class Side:
    """One side of ``edge verify``: a PyTorch model or an ONNX graph, called the same way."""

    name: str
    kind: str  # "torch" or "onnxruntime"
    data_config: dict | None
    run: object  # callable: float32 tensor [N, C, H, W] -> numpy array


def onnx_side(path: str, threads: int | None = None) -> Side:
    """The side of an ONNX graph, run with ONNX Runtime; its input from the graph's edge metadata, else unknown (a
    graph from another exporter: the other side says it, or the caller sets ``data_config``, as ``edge verify``
    does from ``--input-size``, ``--mean`` and ``--std``)."""
    from edge.check.onnx_classifier import OnnxClassifier
    from edge.errors import EdgeError

    graph = OnnxClassifier(path, threads=threads)
    try:
        config = graph.data_config()
    except EdgeError:   # no edge metadata
        config = None
    return Side(path, "onnxruntime", config, lambda x: graph(x).numpy())


def torch_side(name: str, model: torch.nn.Module) -> Side:
    """The side of a loaded PyTorch model (put in eval mode), named ``name`` in the result."""
    from edge.models import data_config

    model = model.eval()

    @torch.no_grad()
    def run(x: torch.Tensor) -> np.ndarray:
        return model(x).float().numpy()

    return Side(name, "torch", data_config(model), run)


def _input_config(a: Side, b: Side) -> dict:
    configs = [s.data_config for s in (a, b) if s.data_config is not None]
    if not configs:
        from edge.errors import EdgeError

        raise EdgeError(f"neither {a.name} nor {b.name} records its preprocessing (input size, mean, std)",
                        fix="pass --input-size, --mean and --std (edge verify), export ONNX files with "
                            "`edge export` (it records them), or compare against a model")
    sizes = {tuple(int(v) for v in c["input_size"]) for c in configs}
    if len(sizes) > 1:
        from edge.errors import EdgeError

        raise EdgeError(f"{a.name} and {b.name} take different inputs", found=" vs ".join(map(str, sorted(sizes))),
                        fix="compare a model with its own export or compressed variant")
    return configs[0]


def verify_pair(a: Side, b: Side, *, real=None, batch: int = 8, seed: int = 0,
                tolerance: Tolerance = Tolerance(), classes: int | None = None, data: str = "the data") -> dict:
    """Run ``a`` and ``b`` on seeded random inputs and on the first ``batch`` real images of ``real`` (an
    edge.data ImageSet, preprocessed as the sides' data config says); compare outputs.

    ``b`` is the candidate, ``a`` the reference: relative error is measured against ``a``. With
    ``classes`` (the real images' class count), outputs that are not ``classes`` scores per image
    (another data set's head, or features) are compared as features: no top-1 agreement, a note.
    """
    from edge.check.accuracy import head_mismatch
    from edge.data import InputSpec
    from edge.errors import EdgeError

    config = _input_config(a, b)
    spec = InputSpec.from_data_config(config)
    inputs = verification_inputs((spec.channels, spec.height, spec.width), batch, None, seed)
    if real is not None:
        inputs["real"] = real.inputs(spec, batch)
    results, agreement = [], {}
    for name, x in inputs.items():
        reference, candidate = a.run(x), b.run(x)
        if reference.shape != candidate.shape:
            raise EdgeError(f"{a.name} and {b.name} give outputs of different shapes",
                            found=f"{tuple(reference.shape)} vs {tuple(candidate.shape)}",
                            fix="compare a model with its own export (same head, same batch)")
        results.append(compare_arrays(reference, candidate, tolerance, name))
        mismatch = head_mismatch(tuple(reference.shape), classes, data) if classes else None
        if reference.ndim == 2 and not mismatch:
            agreement[name] = float((reference.argmax(1) == candidate.argmax(1)).mean())
    note = (f"{mismatch}: compared as features (max abs, relative L2), no top-1 agreement; for accuracy on "
            f"{data} use `edge eval MODEL --probe`") if classes and mismatch else None
    return {"outputs": "features" if note else "class scores", **({"note": note} if note else {}),
            "reference": {"model": a.name, "backend": a.kind}, "candidate": {"model": b.name, "backend": b.kind},
            "input_size": list(config["input_size"]), "batch": batch, "seed": seed,
            "tolerance": asdict(tolerance), "comparisons": [r.as_dict() for r in results],
            "top1_agreement": agreement, "passed": all(r.passed for r in results)}
