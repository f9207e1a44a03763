"""Graph cleaning passes, one per module. Each has ``name`` and ``run(graph) -> bool`` (changed?)."""

from edge.graph.passes import (
    cancel_transposes,
    fold_channel_scales,
    fold_constants,
    fold_linear_chains,
    fold_scalar_scales,
    merge_reshapes,
    remove_noops,
)

DEFAULT_PASSES = (fold_constants, remove_noops, cancel_transposes, merge_reshapes, fold_linear_chains,
                  fold_scalar_scales, fold_channel_scales)

__all__ = ["DEFAULT_PASSES"]
