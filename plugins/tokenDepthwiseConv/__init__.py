"""Token-layout depthwise convolution: edge's dwconv mixer on the ``[B, P + H*W, C]`` token tensor."""
