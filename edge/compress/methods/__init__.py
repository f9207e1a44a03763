"""The built-in compression methods, one folder each; importing this package registers them.

A method is one folder here holding everything of it: its steps and the modules it puts at
timm's seams, its statistics and fits, its training extras, and ``method.py``, which defines its
:class:`~edge.compress.method.Method` and ends with ``register_method(...)``. Importing this
package imports every folder's ``method`` module (:func:`discover`), so a new folder registers
itself; nothing else lists the methods.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil


def discover(package: str = __name__) -> tuple[str, ...]:
    """Import ``method`` of every folder (sub-package) of ``package``, which registers that method; the folders.

    The built-in methods are this package's folders; a project of its own may keep its methods in a
    package of the same shape and call ``discover("its_package")``.
    """
    folders = sorted(info.name for info in pkgutil.iter_modules(importlib.import_module(package).__path__)
                     if info.ispkg)
    for folder in folders:
        if importlib.util.find_spec(f"{package}.{folder}.method") is None:
            raise ImportError(f"method folder {package}.{folder} has no method.py; a method folder defines and "
                              "registers its Method there (register_method)")
        importlib.import_module(f"{package}.{folder}.method")
    return tuple(folders)


FOLDERS = discover()

__all__ = ["FOLDERS", "discover"]
