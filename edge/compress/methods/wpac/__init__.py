"""Width compression (SKD: WPAC, PIAD): ``wpac`` plan steps and nested sub-networks.

``module``: the step, aligned widths and :class:`NarrowAttention`; ``statistics``: WPAC's
Taylor-weighted covariances and rotations; ``build``: ordering, truncation, placement and restore;
``importance``, ``droppable``, ``supernet``, ``piad``: the super-network's unit order and PIAD
training; ``extract``: a sub-network cut from a super-network without data; ``method``: the
registered :class:`~edge.compress.method.Method`.
"""
