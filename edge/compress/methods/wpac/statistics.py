"""WPAC statistics and rotations (SKD, "Weighted PCA for Attention Concentration").

One pass over the calibration images, forward and backward, measures per block of the model:

* the first-order Taylor importance ``|g x a|`` of every element of the attention's Q, K and V
  (``a`` the ``qkv`` output, ``g`` the gradient of the summed correct-class logits), and of
  every hidden unit of the MLP (``a`` the input of ``fc2``, the activation a unit's removal
  zeroes);
* per head, one weight per token: the importance averaged over the head's dims (Eq. 9-10 of
  the paper), and the weighted first and second moments of the head's Q, K and V features under
  those weights, streamed in float64 (``sum w``, ``sum w x``, ``sum w x x^T``).

Every token takes part ([CLS], register tokens and patches alike): the paper's ablation (Table 6)
finds all tokens with importance weights best. The sums are reduced across processes
(:func:`edge.distributed.all_reduce_sum`) before anything is derived from them, so a run under
torchrun measures exactly what one process measures on all the images (each process reads its
:func:`edge.distributed.shard_of` them).

The covariance of a head's feature is the weighted one, centred on the weighted mean:
``C = sum w x x^T / sum w - m m^T`` with ``m = sum w x / sum w`` (the reference code centred each
batch on its unweighted mean, in float16). Q and K share one rotation per head, the
eigenvectors of ``C_q + C_k`` (each a covariance in its own right, so a head whose gradients are
larger at its keys than its queries does not weight one side more); V has its own from ``C_v``.
Eigenvectors are sorted by eigenvalue, largest first, and each is signed so its largest
component is positive (the same basis on every machine).

Folding (:func:`rotate_attention`): with ``R`` orthogonal, Q and K rows of a head's ``qkv``
weight and bias become ``R W`` and ``R b`` (so ``q' . k' = q^T R^T R k = q . k``), the V rows
become ``R_v W_v`` and the output projection's columns of the head ``W_o R_v^T`` (so
``W_o' v' = W_o v``; the attention's weighted sum over tokens is linear and commutes). The
model is the same function; truncation then keeps the leading rows (:mod:`edge.compress.methods.wpac.build`).

The other criteria of the paper's Table 3 give permutations instead of rotations
(:func:`criterion_bases`): ``taylor`` (the per-dim Taylor sums; Q and K dims as pairs),
``magnitude`` (L1 norm of a dim's weights: Q and K rows for a Q/K pair, the V row and the output
projection's column for a V dim, the fc1 row and fc2 column for an MLP unit) and ``random``
(seeded per block). The MLP is ordered by its Taylor importance under ``wpac`` and ``taylor``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edge.data.preprocess import InputSpec
from edge.distributed import all_reduce_count, all_reduce_sum, shard_of
from edge.errors import EdgeError
from edge.runtime import computing_on


@dataclass
class WeightedMoments:
    """Streamed float64 sums of ``groups`` feature streams (one per head), one weight per row."""

    weight: torch.Tensor   # [G]        sum of w
    first: torch.Tensor    # [G, d]     sum of w x
    second: torch.Tensor   # [G, d, d]  sum of w x x^T
    rows: int = 0          # rows seen per group (tokens)

    @classmethod
    def zeros(cls, groups: int, dim: int) -> WeightedMoments:
        f64 = torch.float64
        return cls(torch.zeros(groups, dtype=f64), torch.zeros(groups, dim, dtype=f64),
                   torch.zeros(groups, dim, dim, dtype=f64))

    def update(self, x: torch.Tensor, w: torch.Tensor) -> None:
        """``x``: ``[G, M, d]`` features, ``w``: ``[G, M]`` non-negative weights (both float64)."""
        self.weight += w.sum(1).cpu()   # the sums live on the CPU; the products where the features are
        weighted = x * w.unsqueeze(-1)
        self.first += weighted.sum(1).cpu()
        self.second += (weighted.transpose(1, 2) @ x).cpu()
        self.rows += int(x.shape[1])

    def reduce(self) -> None:
        """Sum over all processes (identity in one process)."""
        for tensor in (self.weight, self.first, self.second):
            all_reduce_sum(tensor)
        self.rows = all_reduce_count(self.rows)

    def mean(self) -> torch.Tensor:
        return self.first / self.weight.clamp_min(torch.finfo(torch.float64).tiny).unsqueeze(-1)

    def covariance(self) -> torch.Tensor:
        """``[G, d, d]``: the weighted covariance about the weighted mean (zero for a group of zero weight)."""
        total = self.weight.clamp_min(torch.finfo(torch.float64).tiny)[:, None, None]
        mean = self.mean()
        cov = self.second / total - mean.unsqueeze(-1) * mean.unsqueeze(-2)
        cov = 0.5 * (cov + cov.transpose(-1, -2))
        return torch.where((self.weight > 0)[:, None, None], cov, torch.zeros_like(cov))


@dataclass
class BlockStatistics:
    """What one pass measures in one block (original index ``block``)."""

    block: int
    q: WeightedMoments
    k: WeightedMoments
    v: WeightedMoments
    taylor_qkv: torch.Tensor   # [3, H, head_dim] float64: sum over tokens and images of |g x a|
    taylor_mlp: torch.Tensor   # [hidden] float64
    images: int = 0

    @classmethod
    def zeros(cls, block: int, heads: int, head_dim: int, hidden: int) -> BlockStatistics:
        f64 = torch.float64
        return cls(block, WeightedMoments.zeros(heads, head_dim), WeightedMoments.zeros(heads, head_dim),
                   WeightedMoments.zeros(heads, head_dim), torch.zeros(3, heads, head_dim, dtype=f64),
                   torch.zeros(hidden, dtype=f64))

    def update_attention(self, qkv: torch.Tensor, grad: torch.Tensor, heads: int) -> None:
        """``qkv`` and its gradient: the ``qkv`` Linear's output ``[B, N, 3 x H x head_dim]``."""
        B, N, width = qkv.shape
        a = qkv.detach().to(torch.float64).reshape(B, N, 3, heads, width // (3 * heads))
        g = grad.detach().to(torch.float64).reshape(a.shape)
        importance = (a * g).abs()
        self.taylor_qkv += importance.sum((0, 1)).cpu()
        token_weight = importance.mean(-1)                       # [B, N, 3, H]: one weight per token and head
        for part, moments in enumerate((self.q, self.k, self.v)):
            x = a[:, :, part].permute(2, 0, 1, 3).reshape(heads, B * N, -1)
            moments.update(x, token_weight[:, :, part].permute(2, 0, 1).reshape(heads, B * N))
        self.images += B

    def update_mlp(self, hidden: torch.Tensor, grad: torch.Tensor) -> None:
        a, g = hidden.detach().to(torch.float64), grad.detach().to(torch.float64)
        self.taylor_mlp += (a * g).abs().reshape(-1, a.shape[-1]).sum(0).cpu()

    def reduce(self) -> None:
        for moments in (self.q, self.k, self.v):
            moments.reduce()
        all_reduce_sum(self.taylor_qkv)
        all_reduce_sum(self.taylor_mlp)
        self.images = all_reduce_count(self.images)


def collect_statistics(model: nn.Module, blocks: dict[int, int], images, spec: InputSpec, *,
                       batch_size: int = 64, device: torch.device | None = None) -> dict[int, BlockStatistics]:
    """One forward and backward pass over this process's share of ``images`` (on ``device``); sums reduced over
    processes, on the CPU.

    ``blocks`` maps original block index -> position in ``model.blocks``. The model is not changed
    (its parameters' gradients are neither computed nor touched).
    """
    if not getattr(model, "num_classes", 0):
        raise EdgeError("the model has no classifier head (num_classes=0)",
                        expected="a classifier: WPAC weighs tokens by the gradient of the correct-class logit",
                        fix="use criterion=magnitude or criterion=random, which need no data")
    from edge.check.accuracy import require_head

    require_head(model, images, "WPAC's Taylor weights (the gradient of the correct class's logit)",
                 "use criterion=magnitude or criterion=random, which read no labels")
    stats, captured, handles = {}, {}, []
    for b, pos in blocks.items():
        block = model.blocks[pos]
        attn, mlp = block.attn, block.mlp
        stats[b] = BlockStatistics.zeros(b, attn.num_heads, attn.head_dim, mlp.fc1.out_features)

        def keep_qkv(_m, _args, out, b=b):
            captured[(b, "qkv")] = out

        def keep_hidden(_m, args, b=b):
            captured[(b, "mlp")] = args[0]

        handles += [attn.qkv.register_forward_hook(keep_qkv), mlp.fc2.register_forward_pre_hook(keep_hidden)]
    images = shard_of(images)
    preprocess = images.preprocess_for(spec)
    dtype = next(model.parameters()).dtype
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), computing_on(model, device) as put:
            for x, labels in images.batches(batch_size, preprocess):
                captured.clear()
                x = put(x).to(dtype).requires_grad_(True)   # gradients reach the activations whatever the parameters
                score = model(x).gather(1, put(labels).unsqueeze(1)).sum()
                keys = list(captured)
                grads = torch.autograd.grad(score, [captured[k] for k in keys])
                for (b, part), grad in zip(keys, grads):
                    if part == "qkv":
                        stats[b].update_attention(captured[(b, part)], grad, model.blocks[blocks[b]].attn.num_heads)
                    else:
                        stats[b].update_mlp(captured[(b, part)], grad)
                captured.clear()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    for s in stats.values():
        s.reduce()
    return stats


def principal_axes(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``R[g]``: the eigenvectors of ``cov[g]`` by eigenvalue, largest first, largest component > 0.

    Returns ``(R [G, d, d], eigenvalues [G, d])``, float64.
    """
    values, vectors = torch.linalg.eigh(cov.to(torch.float64))
    values, vectors = values.flip(-1), vectors.flip(-1)
    largest = vectors.abs().argmax(dim=-2, keepdim=True)
    signs = torch.sign(vectors.gather(-2, largest))
    vectors = vectors * torch.where(signs == 0, torch.ones_like(signs), signs)
    return vectors.transpose(-1, -2).contiguous(), values


def permutation_bases(scores: torch.Tensor) -> torch.Tensor:
    """``[G, d]`` scores -> ``[G, d, d]`` permutation matrices whose rows pick dims by score, highest first."""
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    return torch.eye(scores.shape[-1], dtype=torch.float64)[order]


def descending(scores: torch.Tensor) -> torch.Tensor:
    return torch.argsort(scores, descending=True, stable=True)


@dataclass
class Bases:
    """The orthogonal bases of one block: rows are the new dims, most important first."""

    qk: torch.Tensor          # [H, hd, hd] applied to Q and K rows of each head
    v: torch.Tensor           # [H, hd, hd] applied to V rows and output-projection columns
    mlp: torch.Tensor         # [hidden] order of the MLP's hidden units
    qk_spectrum: torch.Tensor | None = None   # [H, hd] eigenvalues (wpac) in the new order
    v_spectrum: torch.Tensor | None = None


def wpac_bases(stats: BlockStatistics) -> Bases:
    """Per head: principal axes of ``C_q + C_k`` and of ``C_v``; MLP units by Taylor importance."""
    qk, qk_values = principal_axes(stats.q.covariance() + stats.k.covariance())
    v, v_values = principal_axes(stats.v.covariance())
    return Bases(qk, v, descending(stats.taylor_mlp), qk_values, v_values)


def taylor_bases(stats: BlockStatistics) -> Bases:
    """Per dim, no rotation: a Q/K pair by ``T_q + T_k``, a V dim by ``T_v``, an MLP unit by its own sum."""
    t = stats.taylor_qkv
    return Bases(permutation_bases(t[0] + t[1]), permutation_bases(t[2]), descending(stats.taylor_mlp))


def magnitude_bases(attn: nn.Module, mlp: nn.Module) -> Bases:
    """L1 norms of the weights each dim owns (its rows in ``qkv`` and, for V, its column of ``proj``)."""
    heads, head_dim = attn.num_heads, attn.head_dim
    w = attn.qkv.weight.detach().to(torch.float64).abs().sum(1).reshape(3, heads, head_dim)
    out = attn.proj.weight.detach().to(torch.float64).abs().sum(0).reshape(heads, head_dim)
    hidden = (mlp.fc1.weight.detach().to(torch.float64).abs().sum(1)
              + mlp.fc2.weight.detach().to(torch.float64).abs().sum(0))
    return Bases(permutation_bases(w[0] + w[1]), permutation_bases(w[2] + out), descending(hidden))


def random_bases(heads: int, head_dim: int, hidden: int, seed: int, block: int) -> Bases:
    """Seeded permutations, the same for a block whatever other blocks the step touches."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + block)

    def perms() -> torch.Tensor:
        return torch.stack([torch.randperm(head_dim, generator=generator) for _ in range(heads)])

    qk, v = perms(), perms()
    eye = torch.eye(head_dim, dtype=torch.float64)
    return Bases(eye[qk], eye[v], torch.randperm(hidden, generator=generator))


@torch.no_grad()
def rotate_attention(attn: nn.Module, bases: Bases) -> dict[str, torch.Tensor]:
    """The attention's weights with the bases folded in (float64 products, the parameters' dtype back).

    Returns ``qkv_weight [3, H, hd, C]``, ``qkv_bias [3, H, hd]`` (absent without bias),
    ``proj_weight [C, H, hd]`` and ``proj_bias``; ``attn`` itself is not changed.
    """
    heads, head_dim = attn.num_heads, attn.head_dim
    dtype = attn.qkv.weight.dtype
    w = attn.qkv.weight.detach().to(torch.float64).reshape(3, heads, head_dim, -1)
    rotations = torch.stack([bases.qk, bases.qk, bases.v])           # [3, H, hd, hd]
    out = {"qkv_weight": (rotations @ w).to(dtype)}
    if attn.qkv.bias is not None:
        b = attn.qkv.bias.detach().to(torch.float64).reshape(3, heads, head_dim, 1)
        out["qkv_bias"] = (rotations @ b).squeeze(-1).to(dtype)
    proj = attn.proj.weight.detach().to(torch.float64).reshape(-1, heads, head_dim)
    out["proj_weight"] = torch.einsum("chj,hij->chi", proj, bases.v).to(dtype)
    if attn.proj.bias is not None:
        out["proj_bias"] = attn.proj.bias.detach().clone()
    return out
