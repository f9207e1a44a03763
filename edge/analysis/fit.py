"""Closed-form maps from one block's representation to another's, from streamed sums.

* ``linear``: Y ~ X A, no bias, as TOAST (``lstsq(X, Y)``); solved as (X^T X + l I)^-1 X^T Y.
* ``affine``: Y ~ X A + b with centring: A = (Cxx + l I)^-1 Cxy, b = mu_y - mu_x A.
* ``identity``: A = I (b = 0).

All in float64. ``ridge`` is relative: ``l = ridge * trace(Cxx) / D`` so that one value fits
models of any scale. With ``ridge = 0`` the fit needs at least D (linear) or D+1 (affine)
rows and a well-conditioned Gram matrix; otherwise the error suggests a ridge term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge.analysis.moments import PairMoments
from edge.errors import EdgeError, InternalError


@dataclass(frozen=True)
class FittedMap:
    """``y = x @ weight + bias`` (weight ``[D_in, D_out]``, bias ``[D_out]`` or None), float64."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    method: str
    ridge: float


def _regulariser(gram: torch.Tensor, ridge: float) -> torch.Tensor:
    dim = gram.shape[0]
    scale = torch.trace(gram) / dim
    return ridge * scale * torch.eye(dim, dtype=gram.dtype)


def _solve(gram: torch.Tensor, rhs: torch.Tensor, ridge: float, rows: int, what: str) -> torch.Tensor:
    dim = gram.shape[0]
    if ridge == 0 and rows < dim:
        raise EdgeError(f"{what}: {rows} rows for a {dim}x{dim} map without regularisation",
                        expected=f"at least {dim} rows (tokens x samples)",
                        fix="add a ridge term (e.g. METHOD:S-E:ridge=1e-4 in --plan) or use more --samples")
    system = gram + _regulariser(gram, ridge) if ridge else gram
    factor, info = torch.linalg.cholesky_ex(system)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, factor)
    return _min_norm_solve(system, rhs)


def _min_norm_solve(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Minimum-norm least squares for a rank-deficient Gram matrix (what ``lstsq`` returns).

    Happens with enough rows when the features span fewer dimensions than they have, e.g. the
    embedding output of 4x4 one-channel patches: 16 pixel directions plus position embeddings.
    """
    values, vectors = torch.linalg.eigh(system)
    keep = values > values.max() * system.shape[0] * torch.finfo(system.dtype).eps
    inverse = (vectors[:, keep] / values[keep]) @ vectors[:, keep].T
    return inverse @ rhs


def gram_rank(moments: PairMoments, index: int, centred: bool) -> int:
    gram = moments.cov(index, index) if centred else moments.grams[index, index]
    values = torch.linalg.eigvalsh(gram)
    return int((values > values.max() * gram.shape[0] * torch.finfo(gram.dtype).eps).sum())


def fit_map(moments: PairMoments, source: int, target: int, method: str, ridge: float = 0.0) -> FittedMap:
    """Fit the map from representation ``source`` to ``target`` (indices into ``moments``)."""
    dim = moments.dim
    if method == "identity":
        return FittedMap(torch.eye(dim, dtype=torch.float64), None, method, 0.0)
    if method == "linear":
        weight = _solve(moments.grams[source, source], moments.grams[source, target], ridge, moments.count,
                        f"linear map {source}->{target}")
        return FittedMap(weight, None, method, ridge)
    if method == "affine":
        weight = _solve(moments.cov(source, source), moments.cov(source, target), ridge, moments.count - 1,
                        f"affine map {source}->{target}")
        bias = moments.mean(target) - moments.mean(source) @ weight
        return FittedMap(weight, bias, method, ridge)
    raise InternalError(f"fit_map called with method {method!r}, which has no closed form")


def fit_residual(moments: PairMoments, source: int, target: int, fitted: FittedMap) -> dict:
    """Mean squared error of the map on the rows it was fitted on, and R^2, from the sums alone."""
    a, b = fitted.weight, fitted.bias
    syy = torch.trace(moments.grams[target, target])
    sxy = torch.trace(a.T @ moments.grams[source, target])
    sxx = torch.trace(a.T @ moments.grams[source, source] @ a)
    sse = syy - 2 * sxy + sxx
    if b is not None:
        n = moments.count
        sse = sse + n * (b @ b) + 2 * b @ (a.T @ moments.sums[source]) - 2 * b @ moments.sums[target]
    total = torch.trace(moments.cov(target, target))
    rank = gram_rank(moments, source, centred=b is not None)
    return {"mse": float(sse / (moments.count * moments.dim)), "r2": float(1 - sse / total), "input_rank": rank,
            "min_norm": fitted.method in ("linear", "affine") and fitted.ridge == 0 and rank < moments.dim}
