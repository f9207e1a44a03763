"""Ranges on the fields of typed configs, declared once on the library dataclass.

A library config (``ExportConfig``, ``ProfileConfig``, ...) is the one source of a step's settings:
its fields give the names, types and defaults, and :func:`option` adds the range a value must lie
in. The recipe validator (``edge.pipeline.recipe``) and the CLI's option types (``edge.cli.options``)
read all of it from the dataclass. Importing this module is cheap (no torch).

Code that may not import edge (the device side, ``jetson/``) declares the same range as plain field
metadata, ``field(default=20, metadata={"minimum": 0, "maximum": 10**6})``; :func:`bounds` reads both.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass

#: Common upper limits: a value beyond them is a typo, not a setting (and would fail deep inside a library).
MAX_SEED = 2**32 - 1          # numpy's legacy seeding takes 32 bits
MAX_THREADS = 1024
MAX_BATCH = 65536
MAX_SAMPLES = 10_000_000
MAX_STEPS = 100_000_000
MAX_EPOCHS = 100_000


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Bounds:
    """The values a numeric field admits: ``minimum <= value <= maximum``, ``above < value < below``."""

    minimum: float | None = None
    above: float | None = None
    below: float | None = None
    maximum: float | None = None

    def admits(self, value: float) -> bool:
        return (not (isinstance(value, float) and math.isnan(value))
                and (self.minimum is None or value >= self.minimum) and (self.above is None or value > self.above)
                and (self.below is None or value < self.below) and (self.maximum is None or value <= self.maximum))

    @property
    def lowest(self) -> float | None:
        """The lower limit (inclusive or not), ``None`` where there is none."""
        return self.minimum if self.minimum is not None else self.above

    @property
    def highest(self) -> float | None:
        """The upper limit (inclusive or not), ``None`` where there is none."""
        return self.maximum if self.maximum is not None else self.below

    def describe(self, name: str) -> str:
        """What is expected, e.g. ``>= 1``, ``0 < holdout < 1`` or ``1 <= batch <= 65536``."""
        low = (f"{_number(self.minimum)} <= " if self.minimum is not None
               else f"{_number(self.above)} < " if self.above is not None else "")
        high = (f" <= {_number(self.maximum)}" if self.maximum is not None
                else f" < {_number(self.below)}" if self.below is not None else "")
        if low and high:
            return f"{low}{name}{high}"
        if low:
            return (f">= {_number(self.minimum)}" if self.minimum is not None else f"> {_number(self.above)}")
        return high.strip()

    def metadata(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def option(default, *, minimum: float | None = None, maximum: float | None = None, above: float | None = None,
           below: float | None = None):
    """A dataclass field with a default and the range its values must lie in (``None``: unchecked)."""
    limits = Bounds(minimum, above, below, maximum)
    return dataclasses.field(default=default, metadata={"bounds": limits, **limits.metadata()})


def bounds(field: dataclasses.Field) -> Bounds | None:
    """The range of ``field``: from :func:`option`, or from plain ``minimum``/``maximum``/``above``/``below``
    metadata (device-side configs); ``None`` where none is declared."""
    if "bounds" in field.metadata:
        return field.metadata["bounds"]
    keys = {k: field.metadata[k] for k in ("minimum", "above", "below", "maximum") if k in field.metadata}
    return Bounds(**keys) if keys else None



def type_name(hint) -> str:
    """How a message names the type ``hint`` of a config field: "an integer", "a number or null", ..."""
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[base]
    return f"{name} or null" if type(None) in typing.get_args(hint) else name


def checked_value(value, hint, where: str, name: str, limits: Bounds | None = None, *, error: type[Exception]):
    """``value`` (from YAML or JSON) checked against a config field's type ``hint`` and range ``limits``, as the
    field takes it (a list as a tuple, an integer for a float field as a float); else ``error`` (the caller's
    EdgeError: this base module imports none) "``where`` has the wrong type" or "is out of range" (the range
    described for ``name``), with ``expected`` and ``found``. The recipe and ``edge.profile.fresh --settings``
    check their values with it."""
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if value is None and optional:
        return None
    if typing.get_origin(base) is tuple:   # tuple[str, ...]: a YAML list of strings
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
            raise error(f"{where} has the wrong type", expected="a non-empty list of strings",
                            found=f"{value!r} ({type(value).__name__})")
        return tuple(value)
    ok = (base is bool and isinstance(value, bool)) or \
         (base is int and isinstance(value, int) and not isinstance(value, bool)) or \
         (base is float and isinstance(value, (int, float)) and not isinstance(value, bool)) or \
         (base is str and isinstance(value, str) and value.strip() != "")
    if not ok:
        raise error(f"{where} has the wrong type", expected=type_name(hint),
                        found=f"{value!r} ({type(value).__name__})")
    if base in (int, float) and limits is not None and not limits.admits(value):
        raise error(f"{where} is out of range", expected=limits.describe(name), found=str(value))
    return float(value) if base is float else value
