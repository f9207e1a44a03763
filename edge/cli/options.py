"""The kinds of value an option takes, checked when the command line is parsed (before any work starts).

Each kind is an argparse ``type``: a callable that turns the text into the value or raises
``argparse.ArgumentTypeError`` with what was expected and the fix; argparse then prints the verb's
usage and ``argument --OPTION: MESSAGE`` and exits 2, with nothing loaded or written. Numbers take
their type, default and range from a field of the library's typed config (:func:`add_field`), so the
CLI states no range of its own. The kinds are classes so that tests can walk a parser and generate
wrong values for every option from its kind (``tests/edge/cli/test_options.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from pathlib import Path

from edge.config import Bounds, bounds
from edge.errors import EdgeError, InternalError, article

#: Suffixes that make a model argument a path (it must then exist): graphs, engines, weights.
PATH_SUFFIXES = (".onnx", ".engine", ".plan", ".safetensors", ".pt", ".pth", ".bin")

#: Data set names every data option accepts besides a folder (edge.data.NAMED; not imported: that loads torch).
DATA_NAMES = ("fmnist", "fmnist-mini")


def _fail(message: str) -> typing.NoReturn:
    raise argparse.ArgumentTypeError(message)


class Kind:
    """An option's kind of value; ``__call__`` parses and checks one value."""

    name = "value"  # what argparse calls it in its own messages

    def __call__(self, text: str):  # pragma: no cover - every kind overrides it
        raise NotImplementedError


class Number(Kind):
    """An int or a float in a range (``Bounds``); nan and infinities are refused."""

    def __init__(self, kind: type, limits: Bounds, what: str = "value") -> None:
        self.kind, self.limits, self.what = kind, limits, what
        self.source: tuple[type, str] | None = None  # the library config field it comes from, if any
        self.default = None  # named in the fix of a refused value
        self.name = "integer" if kind is int else "number"

    def fix(self) -> str:
        return (f"pass e.g. {self.what} {self.default} (the default)" if self.default is not None
                else "pass a value in that range")

    def expected(self) -> str:
        return f"{article(self.name)} {self.name}, {self.limits.describe(self.what)}"

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            _fail(f"{text!r} is not {article(self.name)} {self.name} (expected: {self.expected()}; fix: {self.fix()})")
        if isinstance(value, float) and not math.isfinite(value):
            _fail(f"{text!r} is not a finite number (expected: {self.expected()}; fix: {self.fix()})")
        if not self.limits.admits(value):
            _fail(f"{text} is out of range (expected: {self.expected()}; fix: {self.fix()})")
        return value


class Share(Number):
    """A share of a whole written ``0.5x`` or ``0.5`` (``edge plan --budget``: of the original's latency)."""

    def __call__(self, text: str):
        return super().__call__(text[:-1] if text.lower().endswith("x") else text)


class Text(Kind):
    """Free text that must not be empty (a device name, an op type, a plan)."""

    name = "text"

    def __init__(self, parse=None, keep_text: bool = False) -> None:
        self.parse = parse  # a library parser raising EdgeError, or None
        self.keep_text = keep_text  # the value is the text (parse only checks it), not what parse returns

    def __call__(self, text: str):
        if not text.strip():
            _fail(f"{text!r} is empty (expected: a non-empty value)")
        if self.parse is None:
            return text
        try:
            value = self.parse(text)
        except EdgeError as e:
            _fail(f"{text!r}: {' '.join(str(e).split())}")
        return text if self.keep_text else value


class ChoiceList(Kind):
    """Comma-separated names, each one of ``choices``; at least one."""

    name = "list"

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = tuple(choices)

    def __call__(self, text: str) -> tuple[str, ...]:
        items = tuple(p.strip() for p in text.split(",") if p.strip())
        unknown = [p for p in items if p not in self.choices]
        if not items or unknown:
            _fail(f"{text!r} is not a list of {', '.join(self.choices)} "
                  f"(fix: pass some of them comma-separated, e.g. {','.join(self.choices[:2])})")
        return items


class Device(Kind):
    """A torch device name: auto, cpu, cuda or cuda:N."""

    name = "device"

    def __init__(self, choices: tuple[str, ...] = ("auto", "cpu", "cuda"), hint: str = "") -> None:
        self.choices, self.hint = choices, hint

    def __call__(self, text: str) -> str:
        base, _, index = text.partition(":")
        if base not in self.choices or (index and (base != "cuda" or not index.isdigit())):
            _fail(f"{text!r} is not a device (expected: {', '.join(self.choices)}"
                  + (" or cuda:N" if "cuda" in self.choices else "") + ")" + (f"; {self.hint}" if self.hint else ""))
        return text


# ---------------------------------------------------------------------------------------------- paths

class PathKind(Kind):
    """A path on this machine; the subclasses say what must be there (or be creatable)."""

    name = "path"

    def __init__(self, what: str = "", fix: str = "check the path") -> None:
        self.what = what  # what the path is, for the message ("recipe"); "" for a plain path
        self.fix = fix

    def __call__(self, text: str) -> str:
        label = f"{self.what} {text}" if self.what else text
        if not text.strip():
            _fail(f"{self.what + ' ' if self.what else ''}{text!r} is empty (expected: {self.expected})")
        path = Path(text).expanduser()
        problem = self.problem(path)
        if problem:
            _fail(f"{label} {problem}")
        return str(path) if text.startswith("~") else text

    expected = "a path"

    def problem(self, path: Path) -> str | None:  # pragma: no cover - every kind overrides it
        raise NotImplementedError


def _what_is(path: Path) -> str:
    if path.is_dir():
        return "a folder"
    if path.is_file():
        return "a file"
    return "neither a file nor a folder"


def _missing_or_wrong(path: Path, expected: str, fix: str) -> str:
    found = "does not exist" if not path.exists() else f"is {_what_is(path)}"
    return f"{found} (expected: {expected}; fix: {fix})"


class ExistingFile(PathKind):
    expected = "an existing file"

    def problem(self, path: Path) -> str | None:
        if path.is_file():
            return None if os.access(path, os.R_OK) else "is not readable (fix: check its permissions)"
        return _missing_or_wrong(path, self.expected, self.fix)


class ExistingFolder(PathKind):
    expected = "an existing folder"

    def problem(self, path: Path) -> str | None:
        if path.is_dir():
            return None
        return _missing_or_wrong(path, self.expected, self.fix)


class ExistingPath(PathKind):
    expected = "an existing file or folder"

    def problem(self, path: Path) -> str | None:
        if path.is_file() or path.is_dir():
            return None
        return _missing_or_wrong(path, self.expected, self.fix)


def _creatable(path: Path) -> str | None:
    """Why ``path`` cannot be created (its parents included), or None: the nearest existing ancestor must be
    a writable folder."""
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot write there: {parent} is a file, not a folder (fix: choose another path)"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write there: the folder {parent} is not writable (fix: choose another path)"
    return None


class OutputFile(PathKind):
    """A file to write: an existing file (replaced) or a creatable path; never an existing folder."""

    expected = "a file to write"

    def __init__(self, suffix: str | None = None, what: str = "") -> None:
        super().__init__(what)
        self.suffix = suffix

    def problem(self, path: Path) -> str | None:
        if path.is_dir():
            return (f"is a folder (expected: {self.expected}; fix: name a file in it, e.g. "
                    f"{path / ('out' + (self.suffix or ''))})")
        if path.exists():
            return None if path.is_file() and os.access(path, os.W_OK) else "exists and cannot be replaced"
        return _creatable(path)


class OutputFolder(PathKind):
    """A folder to write into: an existing folder or a creatable path; never an existing file."""

    expected = "a folder to write"

    def problem(self, path: Path) -> str | None:
        if path.exists() and not path.is_dir():
            return f"is a file (expected: {self.expected}; fix: choose another path, e.g. {path.with_suffix('')}-out)"
        if path.is_dir():
            return None if os.access(path, os.W_OK | os.X_OK) else "is a folder that is not writable"
        return _creatable(path)


class Data(Kind):
    """A data set: one of the named ones or an existing image folder."""

    name = "data"
    expected = f"{', '.join(DATA_NAMES)}, or an existing image folder"

    def __call__(self, text: str) -> str:
        if text in DATA_NAMES:
            return text
        problem = ExistingFolder().problem(Path(text).expanduser()) if text.strip() else "is empty"
        if problem:
            _fail(f"{text!r} is not a data set: {text!r} {problem.split(' (')[0]} "
                  f"(expected: {self.expected}; fix: pass --data fmnist-mini, or a folder of class subfolders)")
        return str(Path(text).expanduser()) if text.startswith("~") else text


class Model(Kind):
    """A model: a name (fmnist-deit-tiny, timm:ARCH[,...]) or a path, which must then exist.

    A text is a path when it names an existing file or folder, contains a path separator or ends in a
    file suffix (.onnx, .engine, .safetensors, ...). Which names exist is decided when the model is loaded.
    """

    name = "model"

    def __call__(self, text: str) -> str:
        if not text.strip():
            _fail(f"{text!r} is empty (expected: a model name, an artifact folder or a model file)")
        if text.startswith("timm:"):
            return text
        path = Path(text).expanduser()
        if path.exists() or os.sep in text or text.lower().endswith(PATH_SUFFIXES):
            problem = ExistingPath().problem(path)
            if problem:
                _fail(f"{text} {problem.split(' (')[0]} (expected: a model name, an artifact folder or a model file; "
                      "fix: check the path, or `edge models` for the names)")
        return text


# ------------------------------------------------------------------------------------- config-backed

def config_field(config: type, name: str) -> dataclasses.Field:
    """The field ``name`` of dataclass ``config``; a bug in edge when there is none."""
    for f in dataclasses.fields(config):
        if f.name == name:
            return f
    raise InternalError(f"{config.__name__} has no field {name!r}")


def field_kind(config: type, name: str, what: str) -> Number:
    """The :class:`Number` kind of the numeric field ``name`` of dataclass ``config``."""
    f = config_field(config, name)
    hint = typing.get_type_hints(config)[name]
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    limits = bounds(f)
    if base not in (int, float) or limits is None:
        raise InternalError(f"{config.__name__}.{name} is not a numeric field with a declared range")
    number = Number(base, limits, what)
    number.source = (config, name)
    number.default = getattr(config, name, None)
    return number


def config_type(config: type, flag: str, name: str | None = None) -> Number:
    """The argparse ``type`` of option ``flag`` (field ``name``, default: from the flag) of ``config``."""
    return field_kind(config, name or flag.lstrip("-").replace("-", "_"), flag)


def add_field(parser: argparse.ArgumentParser, flag: str, config: type, name: str | None = None, *,
              help: str, default=dataclasses.MISSING, **kwargs) -> argparse.Action:
    """``flag`` taking the numeric field ``name`` (default: from the flag) of the library config ``config``:
    its type, range and default come from the field (the help formatter states range and default)."""
    name = name or flag.lstrip("-").replace("-", "_")
    kind = field_kind(config, name, flag)
    if default is dataclasses.MISSING:
        default = getattr(config, name, None)  # the dataclass's class attribute: the field's default
    return parser.add_argument(flag, type=kind, default=default, help=help, metavar="N", **kwargs)


def add_number(parser: argparse.ArgumentParser, flag: str, kind: type, *, help: str, default=None,
               metavar: str = "N", **limits) -> argparse.Action:
    """A numeric option no library config holds (e.g. ``verify --batch``): its range stated here."""
    number = Number(kind, Bounds(**limits), flag)
    number.default = default
    return parser.add_argument(flag, type=number, default=default, metavar=metavar, help=help)
