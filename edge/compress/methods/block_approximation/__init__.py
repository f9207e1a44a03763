"""Block approximation (TOAST / RBA): spans of blocks become one closed-form or trained map.

``module``: the span module, the translators and the steps; ``fit``: closed-form and trained
fits; ``planner``: ``auto-linear:K`` / ``auto-affine:K`` by held-out fidelity; ``method``: the
registered :class:`~edge.compress.method.Method`.
"""
