"""Ranges on the fields of typed configs, declared once on the library dataclass.

A library config (``ExportConfig``, ``ProfileConfig``, ...) is the one source of a step's settings:
its fields give the names, types and defaults, and :func:`option` adds the range a value must lie
in. The recipe validator (``edge.pipeline.recipe``) reads all of it from the dataclass; the CLI
reads the defaults for its ``--help``. Importing this module is cheap (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """The values a numeric field admits: ``value >= minimum``, ``above < value < below``."""

    minimum: float | None = None
    above: float | None = None
    below: float | None = None

    def admits(self, value: float) -> bool:
        return ((self.minimum is None or value >= self.minimum) and (self.above is None or value > self.above)
                and (self.below is None or value < self.below))

    def describe(self, name: str) -> str:
        """What is expected, e.g. ``>= 1`` or ``0 < holdout < 1``."""
        if self.above is not None and self.below is not None:
            return f"{self.above:g} < {name} < {self.below:g}"
        parts = [f">= {self.minimum}"] if self.minimum is not None else []
        parts += [f"> {self.above:g}"] if self.above is not None else []
        parts += [f"< {self.below:g}"] if self.below is not None else []
        return " and ".join(parts)


def option(default, *, minimum: float | None = None, above: float | None = None, below: float | None = None):
    """A dataclass field with a default and the range its values must lie in (``None``: unchecked)."""
    return dataclasses.field(default=default, metadata={"bounds": Bounds(minimum, above, below)})


def bounds(field: dataclasses.Field) -> Bounds | None:
    return field.metadata.get("bounds")
