"""ONNX Runtime against PyTorch: seeded verification inputs and the comparison of a graph with its model."""

from __future__ import annotations

import torch

from edge.check.compare import Comparison, Tolerance, compare_arrays, run_ort


def verification_inputs(input_size: tuple[int, ...], batch: int, real: torch.Tensor | None, seed: int = 0) -> dict:
    """Named input batches: seeded random normal inputs, and real images when given.

    A static graph takes exactly ``batch`` images: fewer real images than that are repeated in order to
    fill the batch (``edge export --batch 16`` with 8 real images verifies 16).
    """
    generator = torch.Generator().manual_seed(seed)
    inputs = {"random": torch.randn(batch, *input_size, generator=generator)}
    if real is not None and len(real):
        inputs["real"] = real[torch.arange(batch) % len(real)]
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

