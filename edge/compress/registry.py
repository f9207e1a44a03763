"""The registry of compression methods (timm's ``register_model``, modelopt's ``register_mode``).

Built-in methods register themselves when :mod:`edge.compress.methods` is imported, which
``edge.compress`` does first; a new method is one folder there whose ``method.py`` calls
:func:`register_method` with an instance of its :class:`~edge.compress.method.Method`. Names, plan keywords and step
types must be unique: a second registration of any of them is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from edge.compress.method import Method

_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method``; refuses a name, keyword or step type that another method already has."""
    if method.name in _METHODS:
        raise ValueError(f"a compression method named {method.name!r} is already registered "
                         f"({type(_METHODS[method.name]).__name__})")
    for other in _METHODS.values():
        shared = set(method.keywords) & set(other.keywords)
        if shared:
            raise ValueError(f"method {method.name!r} claims plan keyword(s) {', '.join(sorted(shared))} "
                             f"of method {other.name!r}")
        if set(method.step_types) & set(other.step_types):
            raise ValueError(f"method {method.name!r} parses a step type of method {other.name!r}")
    _METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    _METHODS.pop(name)


@contextmanager
def registered(method: Method) -> Iterator[Method]:
    """Register ``method`` for the duration of a ``with`` block (tests, experiments)."""
    register_method(method)
    try:
        yield method
    finally:
        unregister_method(method.name)


def methods() -> tuple[Method, ...]:
    """Every registered method, in application order (``order``, then registration)."""
    return tuple(sorted(_METHODS.values(), key=lambda m: m.order))


def method_named(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise KeyError(f"no compression method {name!r}; registered: {', '.join(_METHODS)}") from None


def keywords() -> tuple[str, ...]:
    """Every plan keyword, in application order."""
    return tuple(k for m in methods() for k in m.keywords)


def method_for_keyword(keyword: str) -> Method | None:
    return next((m for m in _METHODS.values() if keyword in m.keywords), None)


def method_of(step) -> Method:
    for method in _METHODS.values():
        if isinstance(step, method.step_types):
            return method
    raise TypeError(f"no registered compression method parses {type(step).__name__} steps")


def module_types() -> tuple[type[nn.Module], ...]:
    """The modules every registered method puts at timm's seams (what ``--train replaced`` trains)."""
    return tuple(t for m in methods() for t in m.module_types)
