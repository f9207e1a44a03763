"""Attention removal (Lambda-ViT: NOSE selection, dilution learning): ``attnrm`` plan steps.

``module``: the MLP-only block and the affine attention map and the step; ``build``: block
selection, affine fits, placement and restore; ``dilution``: dilution learning (a training
phase); ``method``: the registered :class:`~edge.compress.method.Method`.
"""
