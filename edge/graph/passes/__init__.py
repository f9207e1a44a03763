"""Graph cleaning passes, one per module. Each has ``name`` and ``run(graph) -> bool`` (changed?)."""

from edge.graph.passes import (
    cancel_transposes,
    fold_channel_scales,
    fold_constants,
    fold_linear_chains,
    fold_scalar_scales,
    linear_to_gemm,
    merge_reshapes,
    remove_noops,
)

# linear-to-gemm writes Reshapes that merge-reshapes, next, folds into their neighbours.
DEFAULT_PASSES = (fold_constants, remove_noops, cancel_transposes, linear_to_gemm, merge_reshapes,
                  fold_linear_chains, fold_scalar_scales, fold_channel_scales)

__all__ = ["DEFAULT_PASSES"]
