"""Streamed second-order statistics of block representations, in float64.

For representations ``X_0 .. X_{L}`` (row = one token of one image, column = one feature)
:class:`PairMoments` accumulates, batch by batch,

* ``count``            number of rows seen
* ``sums[i]``          column sums of ``X_i``                          (L+1, D)
* ``grams[i, j]``      ``X_i^T X_j`` for every pair of representations  (L+1, L+1, D, D)
* ``cosine_sums[i,j]`` sum over rows of ``cos(x_i, x_j)``              (L+1, L+1)

Memory does not grow with the number of samples. Everything later steps need follows
exactly from these sums: centred covariances, linear CKA, mean squared distances, Block
Redundancy, and the closed-form least-squares maps between any two blocks. Being sums, they
are added over processes (:meth:`PairMoments.all_reduce`) before anything is derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge import distributed


@dataclass
class PairMoments:
    count: int
    sums: torch.Tensor
    grams: torch.Tensor
    cosine_sums: torch.Tensor
    sample_count: int = 0   # images seen (rows are tokens; several rows per image)

    @classmethod
    def zeros(cls, num_reps: int, dim: int) -> PairMoments:
        f64 = torch.float64
        return cls(0, torch.zeros(num_reps, dim, dtype=f64), torch.zeros(num_reps, num_reps, dim, dim, dtype=f64),
                   torch.zeros(num_reps, num_reps, dtype=f64))

    @property
    def num_reps(self) -> int:
        return int(self.sums.shape[0])

    @property
    def dim(self) -> int:
        return int(self.sums.shape[1])

    def update(self, reps: list[torch.Tensor] | torch.Tensor, images: int | None = None) -> None:
        """Add rows: ``reps[i]`` is ``[rows, D]`` (the same rows for every representation)."""
        x = torch.stack([r.reshape(-1, self.dim) for r in reps]).to(torch.float64)  # [R, rows, D]
        self.count += int(x.shape[1])
        self.sample_count += int(images if images is not None else x.shape[1])
        self.sums += x.sum(1).cpu()   # the sums live on the CPU; the products where the rows are
        flat = x.permute(1, 0, 2).reshape(x.shape[1], -1)  # [rows, R*D]
        # X_i^T X_j for j >= i only (X_j^T X_i is its transpose): 7/13 of the products of one [R*D, R*D] product
        d = self.dim
        for i in range(self.num_reps):
            upper = (flat[:, i * d:(i + 1) * d].T @ flat[:, i * d:]).reshape(d, -1, d).permute(1, 0, 2).cpu()
            self.grams[i, i:] += upper
            self.grams[i + 1:, i] += upper[1:].transpose(1, 2)
        unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        self.cosine_sums += torch.einsum("ird,jrd->ij", unit, unit).cpu()

    def all_reduce(self) -> PairMoments:
        """Sum every process's moments into this one (in place; nothing changes in one process)."""
        for tensor in (self.sums, self.grams, self.cosine_sums):
            distributed.all_reduce_sum(tensor)
        self.count = distributed.all_reduce_count(self.count)
        self.sample_count = distributed.all_reduce_count(self.sample_count)
        return self

    def merge(self, other: PairMoments) -> PairMoments:
        return PairMoments(self.count + other.count, self.sums + other.sums, self.grams + other.grams,
                           self.cosine_sums + other.cosine_sums, self.sample_count + other.sample_count)

    # ---- derived quantities -------------------------------------------------------------
    def mean(self, i: int) -> torch.Tensor:
        return self.sums[i] / self.count

    def cov(self, i: int, j: int) -> torch.Tensor:
        """Centred cross-product ``(X_i - mu_i)^T (X_j - mu_j)`` (not divided by the count)."""
        return self.grams[i, j] - torch.outer(self.sums[i], self.sums[j]) / self.count

    def constant(self, i: int) -> bool:
        """True when representation ``i`` does not vary over the rows (e.g. the class token before block 0)."""
        return bool(self.cov(i, i).norm() <= 1e-10 * self.grams[i, i].norm())

    def cka(self) -> torch.Tensor:
        """Linear CKA of every pair (TOAST, Eq. 1): ||Xe^T Xs||_F^2 / (||Xs^T Xs||_F ||Xe^T Xe||_F), centred.

        NaN where a representation is constant over the rows: CKA is 0/0 there, undefined.
        """
        n = self.num_reps
        norms = torch.stack([self.cov(i, i).norm() for i in range(n)])
        constant = [self.constant(i) for i in range(n)]
        out = torch.empty(n, n, dtype=torch.float64)
        for i in range(n):
            for j in range(i, n):
                value = self.cov(i, j).norm() ** 2 / (norms[i] * norms[j]) if not (constant[i] or constant[j]) \
                    else torch.tensor(float("nan"), dtype=torch.float64)
                out[i, j] = out[j, i] = value
        return out

    def cosine(self) -> torch.Tensor:
        """Mean cosine similarity between the two representations of the same token."""
        return (self.cosine_sums / self.count).clamp(-1.0, 1.0)

    def squared_distance(self) -> torch.Tensor:
        """Mean over rows of ``||x_i - x_j||^2``, from the Gram traces."""
        traces = torch.diagonal(self.grams, dim1=-2, dim2=-1).sum(-1)  # [R, R] = tr(X_i^T X_j)
        sq = torch.diagonal(traces)
        return (sq[:, None] + sq[None, :] - 2 * traces) / self.count
