"""Drop-in depthwise convolution (Scribano et al.) in place of attention: ``dwconv`` plan steps.

``module``: :class:`DepthwiseAttention` and the step; ``kernels``: the initial kernels (Gaussian,
mean attention map, least squares); ``build``: Sigma selection, kernel fits, placement and
restore; ``method``: the registered :class:`~edge.compress.method.Method`.
"""
