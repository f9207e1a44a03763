"""Analysis: streamed block statistics, similarity maps (CKA, cosine, Block Redundancy), fits."""

from edge.analysis.collect import BlockMoments, collect_block_moments
from edge.analysis.fit import FittedMap, fit_map, fit_residual
from edge.analysis.moments import PairMoments
from edge.analysis.similarity import block_redundancy, linear_cka_reference

__all__ = ["BlockMoments", "FittedMap", "PairMoments", "block_redundancy", "collect_block_moments", "fit_map",
           "fit_residual", "linear_cka_reference"]
