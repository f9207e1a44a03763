"""Numerical equivalence of graphs: one comparator with explicit tolerances (fp32 defaults: max
absolute error <= 1e-4 and relative L2 error <= 1e-5), and ONNX Runtime sessions to run them.

Pure numpy and ONNX Runtime (the graph passes verify each change with it); the comparison with a
PyTorch model is :mod:`edge.torch_compare`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    max_abs: float = 1e-4
    rel_l2: float = 1e-5


@dataclass
class Comparison:
    max_abs: float
    rel_l2: float
    inputs: str
    passed: bool

    def as_dict(self) -> dict:
        return asdict(self)


def compare_arrays(reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance, inputs: str) -> Comparison:
    if reference.shape != candidate.shape:
        raise ValueError(f"output shapes differ: {reference.shape} vs {candidate.shape}")
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    max_abs = float(np.abs(ref - cand).max()) if ref.size else 0.0
    rel = float(np.linalg.norm(ref - cand) / max(np.linalg.norm(ref), 1e-30))
    finite = bool(np.isfinite(cand).all())
    return Comparison(max_abs, rel, inputs, finite and max_abs <= tolerance.max_abs and rel <= tolerance.rel_l2)


def ort_session(model_bytes_or_path, threads: int | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # errors only: ORT's optimiser warns about fusions it skips ("UnsqueezeElimination cannot
    # remove node ..."), which are neither errors nor anything a user of edge can act on
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes_or_path, options, providers=["CPUExecutionProvider"])


def run_ort(session, x: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    return session.run(None, {name: x})[0]
