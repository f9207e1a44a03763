"""Placeholder: entropy, transfer entropy and NOSE are written on another branch (issue 15).

Only the contract the attnrm method calls is here; the real module replaces this file.
"""

from __future__ import annotations

from torch import nn

from edge.data.preprocess import InputSpec


def nose_select(model: nn.Module, calibration, spec: InputSpec, count: int, excluded: set[int],
                batch_size: int) -> tuple[list[int], list[dict]]:
    """The ``count`` blocks NOSE removes (greedy order) and the trajectory rows for the manifest's planner."""
    raise NotImplementedError("NOSE selection (edge.analysis.entropy) is not merged into this branch yet")
