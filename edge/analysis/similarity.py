"""Similarity measures between block representations, from :class:`PairMoments`.

``block_redundancy`` is RBA's Eq. 1, BR(b) = -mean_x ||h_b(x) - h_{b-1}(x)||^2, where h(x)
is the whole representation of image x (all tokens of the view). From the streamed sums
it is the per-row squared distance times the rows per image.
"""

from __future__ import annotations

import torch

from edge.analysis.moments import PairMoments


def linear_cka_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Direct linear CKA of two ``[n, d]`` matrices (for tests and small data)."""
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    return (y.T @ x).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm())


def block_redundancy(moments: PairMoments) -> torch.Tensor:
    """BR(b) for b = 0..L-1 (representation b+1 against b: index 0 is the embedding output)."""
    rows_per_image = moments.count / max(moments.sample_count, 1)
    distance = moments.squared_distance()
    return torch.stack([-distance[b + 1, b] * rows_per_image for b in range(moments.num_reps - 1)])
