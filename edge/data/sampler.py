"""Seeded, class-balanced sampling: the calibration set of every compression method."""

from __future__ import annotations

import torch

from edge.errors import EdgeError


def balanced_indices(labels: torch.Tensor, n: int, seed: int = 0, num_classes: int | None = None) -> torch.Tensor:
    """Pick ``n`` indices with the classes as equal as possible, reproducibly.

    Each class gets ``n // C`` samples; the ``n % C`` left over go to classes chosen by the
    seed. Within a class the samples are drawn without replacement. The result is in a
    seeded random order, so any prefix of it is still roughly balanced.
    """
    labels = labels.to(torch.int64)
    num_classes = num_classes or int(labels.max()) + 1
    if n <= 0:
        raise EdgeError(f"calibration sample count {n} is not positive", expected="N >= 1")
    if n > len(labels):
        raise EdgeError(f"{n} calibration samples asked for, but the data set holds {len(labels)}",
                        expected=f"N <= {len(labels)}", fix="lower --samples or use a larger data set")
    generator = torch.Generator().manual_seed(seed)
    per_class = [n // num_classes] * num_classes
    for c in torch.randperm(num_classes, generator=generator)[: n % num_classes].tolist():
        per_class[c] += 1
    chosen = []
    for c, count in enumerate(per_class):
        members = torch.nonzero(labels == c).flatten()
        if count > len(members):
            raise EdgeError(f"class {c} has {len(members)} samples, {count} needed for a balanced set of {n}",
                            fix="lower --samples")
        chosen.append(members[torch.randperm(len(members), generator=generator)[:count]])
    picked = torch.cat(chosen)
    return picked[torch.randperm(len(picked), generator=generator)]
