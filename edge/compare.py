"""Numerical equivalence of graphs and models: ONNX Runtime against PyTorch or another graph.

One comparator with explicit tolerances (fp32 defaults: max absolute error <= 1e-4 and
relative L2 error <= 1e-5), run on real images and on seeded random inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch


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


def verification_inputs(input_size: tuple[int, ...], batch: int, real: torch.Tensor | None, seed: int = 0) -> dict:
    """Named input batches: seeded random normal inputs, and real images when given."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {"random": torch.randn(batch, *input_size, generator=generator)}
    if real is not None:
        inputs["real"] = real[:batch]
    return inputs


@torch.no_grad()
def compare_with_torch(model: torch.nn.Module, session, inputs: dict[str, torch.Tensor],
                       tolerance: Tolerance = Tolerance()) -> list[Comparison]:
    model.eval()
    results = []
    for name, x in inputs.items():
        reference = model(x).float().numpy()
        results.append(compare_arrays(reference, run_ort(session, x.numpy()), tolerance, name))
    return results

