"""Options of a plan step (``:key=value``): one typed dataclass per method, parsed and described here only.

A method declares its options once, as a frozen dataclass whose fields give the option's name,
type, default and range (:func:`plan_option`, built on :func:`edge.config.option`); a field typed
``Literal[...]`` admits only those choices. Nothing else lists them: :func:`parse_options` reads a
step's ``key=value`` parts by the dataclass (unknown keys, values of the wrong type, out of range
or not among the choices are refused with an :class:`~edge.errors.EdgeError` that names the
option, the value, what is admitted and the fix), :func:`option_defaults` gives the defaults and
:func:`describe_options` the option list of ``edge compress --help``.

A step keeps the options its text names as a plain ``{key: value}`` dict (``format_options``
writes them back in sorted order), so a plan's text, and the artifacts that record it, stay the
same; a value is converted by the field's type (``ridge=1e-4`` is kept and written as ``0.0001``).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any, Literal

from edge.config import Bounds, bounds, option
from edge.errors import EdgeError, article

_TYPE_NAMES = {int: "INT", float: "FLOAT", str: "TEXT"}


def plan_option(default, *, key: str | None = None, metavar: str | None = None, **limits) -> Any:
    """A method option: its default and range (as :func:`edge.config.option`); ``key`` is its plan spelling
    where that is no Python name (``latency-ms``), ``metavar`` the placeholder ``--help`` shows (``FILE``).
    Typed ``Any`` like :func:`edge.config.option`: a field's declared type is its value's, not ``Field``'s."""
    metadata = dict(option(default, **limits).metadata)
    metadata.update({k: v for k, v in (("key", key), ("metavar", metavar)) if v is not None})
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class OptionSpec:
    """One option as the plan grammar sees it."""

    key: str                      # spelling in a plan step
    kind: type                    # int, float or str (the conversion of the text)
    default: object
    choices: tuple = ()           # the admitted values of a Literal field
    bounds: Bounds | None = None
    metavar: str | None = None

    def expected(self) -> str:
        """What the option admits, e.g. ``init=gaussian or init=mean``, ``0 < keep <= 1`` or ``a float``."""
        if self.choices:
            return " or ".join(f"{self.key}={c}" for c in self.choices)
        if self.bounds is not None:
            both = self.bounds.lowest is not None and self.bounds.highest is not None
            text = self.bounds.describe(self.key)       # names the option only between two limits
            return text if both else f"{self.key} {text}"
        return f"{article(self.kind.__name__)} {self.kind.__name__}"

    def fix(self) -> str:
        if self.default is not None:
            return f"use e.g. {self.key}={self.default}, or leave :{self.key}= out for the default"
        return f"give {self.key} a value with {self.expected()}"

    def help(self) -> str:
        """``init=gaussian|mean|lsq (lsq when absent)``, ``k=INT (k >= 1; 3 when absent)``."""
        if self.choices:
            value, notes = "|".join(map(str, self.choices)), []
        else:
            value = self.metavar or _TYPE_NAMES[self.kind]
            notes = [self.expected()] if self.bounds is not None else []
        if self.default is not None:
            notes.append(f"{self.default} when absent")
        return f"{self.key}={value}" + (f" ({'; '.join(notes)})" if notes else "")


def _kind(annotation) -> tuple[type, tuple]:
    """The conversion type and the choices of a field annotation (``float | None``, ``Literal["a", "b"]``)."""
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args:
        return _kind(args[0])
    if annotation not in _TYPE_NAMES:
        raise TypeError(f"a plan option is an int, float, str or Literal, not {annotation!r}")
    return annotation, ()


@functools.cache
def option_specs(options_class: type) -> dict[str, OptionSpec]:
    """The options of ``options_class`` (a dataclass of :func:`plan_option` fields) by their plan key."""
    hints = typing.get_type_hints(options_class)
    specs = {}
    for f in dataclasses.fields(options_class):
        kind, choices = _kind(hints[f.name])
        key = f.metadata.get("key", f.name)
        limits = bounds(f)
        specs[key] = OptionSpec(key, kind, f.default, choices, None if limits == Bounds() else limits,
                                f.metadata.get("metavar"))
    return specs


def option_defaults(options_class: type) -> dict[str, object]:
    """``{key: default}`` of every option (``None``: no default, the option is absent unless given)."""
    return {key: spec.default for key, spec in option_specs(options_class).items()}


def _value(spec: OptionSpec, text: str, step_text: str):
    try:
        value = spec.kind(text)
    except ValueError as e:
        raise EdgeError(f"option {spec.key}={text} in plan step {step_text!r} is not {article(spec.kind.__name__)} "
                        f"{spec.kind.__name__}", expected=spec.expected(), fix=spec.fix()) from e
    if spec.choices and value not in spec.choices:
        raise EdgeError(f"option {spec.key}={text} in plan step {step_text!r} is not one of its choices",
                        expected=spec.expected(), fix=spec.fix())
    if spec.bounds is not None and not spec.bounds.admits(value):
        raise EdgeError(f"option {spec.key}={text} in plan step {step_text!r} is out of range",
                        expected=spec.expected(), fix=spec.fix())
    return value


def parse_options(parts: list[str], step_text: str, options_class: type) -> dict:
    """The ``key=value`` parts of a step, each converted and checked by its field of ``options_class``."""
    specs = option_specs(options_class)
    options = {}
    for part in parts:
        if "=" not in part:
            raise EdgeError(f"option {part!r} in plan step {step_text!r} is not key=value",
                            expected=f"options {', '.join(specs)} as :key=value")
        key, value = part.split("=", 1)
        if key not in specs:
            raise EdgeError(f"unknown option {key!r} in plan step {step_text!r}", expected=f"one of {', '.join(specs)}")
        options[key] = _value(specs[key], value, step_text)
    return options


def describe_options(options_class: type) -> str:
    """The options of ``options_class`` for ``--help``: ``Options: init=gaussian|mean|lsq (lsq when absent), ...``."""
    return "Options: " + ", ".join(spec.help() for spec in option_specs(options_class).values()) + "."


def format_options(options: dict) -> str:
    """A step's options as plan text, sorted by key: ``:init=lsq:k=3``."""
    return "".join(f":{k}={v}" for k, v in sorted(options.items()))
