"""Graph cleaning passes, one per module; each module's ``PASS`` is a :class:`~edge.graph.graph_pass.GraphPass`.

:data:`PASSES` registers them in the order every round runs them: that order is part of what
decides the cleaned graph's bytes, so a new pass is appended where it belongs, here.
"""

from edge.graph.passes import (
    cancel_transposes,
    fold_channel_scales,
    fold_constants,
    fold_linear_chains,
    fold_scalar_scales,
    fuse_layer_norm,
    linear_to_gemm,
    merge_reshapes,
    remove_noops,
)
from edge.graph.registry import PassRegistry

PASSES = PassRegistry()
# linear-to-gemm writes Reshapes that merge-reshapes, next, folds into their neighbours;
# fuse-layer-norm reads eps, axes and gamma as constants: it runs after fold-constants.
for _module in (fold_constants, remove_noops, fuse_layer_norm, cancel_transposes, linear_to_gemm, merge_reshapes,
                fold_linear_chains, fold_scalar_scales, fold_channel_scales):
    PASSES.register(_module.PASS)

DEFAULT_PASSES = PASSES.select()

__all__ = ["DEFAULT_PASSES", "PASSES"]
