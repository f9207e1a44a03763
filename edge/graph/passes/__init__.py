"""Graph cleaning passes, one per module; each module's ``PASS`` is a :class:`~edge.graph.graph_pass.GraphPass`.

:data:`PASSES` registers them in the order every round runs them: that order is part of what
decides the cleaned graph's bytes, so a new pass is appended where it belongs, here.

:data:`PLUGIN_PASSES` registers the passes that write TensorRT plugin ops (``plugins/``): off by
default, since the graph they write needs the plugin library wherever TensorRT builds it; ``edge
clean --plugins`` runs them in each round before :data:`PLUGIN_PASSES_BEFORE` (:func:`select_passes`).
"""

from collections.abc import Iterable

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
    token_depthwise_conv,
)
from edge.errors import EdgeError
from edge.graph.graph_pass import GraphPass
from edge.graph.registry import PassRegistry

PASSES = PassRegistry()
# linear-to-gemm writes Reshapes that merge-reshapes, next, folds into their neighbours;
# fuse-layer-norm reads eps, axes and gamma as constants: it runs after fold-constants.
for _module in (fold_constants, remove_noops, fuse_layer_norm, cancel_transposes, linear_to_gemm, merge_reshapes,
                fold_linear_chains, fold_scalar_scales, fold_channel_scales):
    PASSES.register(_module.PASS)

DEFAULT_PASSES = PASSES.select()

PLUGIN_PASSES = PassRegistry()
PLUGIN_PASSES.register(token_depthwise_conv.PASS)
# linear-to-gemm turns a projection next to a Reshape into Reshape -> Gemm and merge-reshapes folds the
# second Reshape into the mixer's own: the mixer's tokens would then exist only as 2-D rows. Plugin passes
# run before it (after the folding passes that make shapes and Slice bounds constant).
PLUGIN_PASSES_BEFORE = "linear-to-gemm"


def select_passes(skip: Iterable[str] = (), plugins: bool = False) -> tuple[GraphPass, ...]:
    """The default passes, with ``plugins`` those writing plugin ops among them (before
    :data:`PLUGIN_PASSES_BEFORE`), less those named in ``skip``."""
    skip = list(skip)
    for name in skip:
        if name not in PASSES and name not in PLUGIN_PASSES:
            names = PASSES.names() + PLUGIN_PASSES.names()
            raise EdgeError(f"unknown pass {name!r}", expected=f"one of {', '.join(sorted(names))}")
    chosen = PASSES.select(n for n in skip if n in PASSES)
    if not plugins:
        return chosen
    at = PASSES.names().index(PLUGIN_PASSES_BEFORE)
    before = [p for p in chosen if PASSES.names().index(p.name) < at]
    after = [p for p in chosen if PASSES.names().index(p.name) >= at]
    return (*before, *PLUGIN_PASSES.select(n for n in skip if n in PLUGIN_PASSES), *after)


__all__ = ["DEFAULT_PASSES", "PASSES", "PLUGIN_PASSES", "select_passes"]
