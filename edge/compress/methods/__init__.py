"""The built-in compression methods, one module each; importing this package registers them.

A new method is one module here (its steps, modules and :class:`~edge.compress.method.Method`,
ending with ``register_method(...)``) plus one import line below, and its tests.
"""

from edge.compress.methods import attnrm, block_approximation, dwconv, wpac

__all__ = ["attnrm", "block_approximation", "dwconv", "wpac"]
