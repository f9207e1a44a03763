"""The graph-pass contract, after onnx_ir.passes: a pass is called on a graph and returns
``PassResult(graph, modified)``.

A pass has a ``name`` (what ``edge clean --skip-pass`` takes), a one-line ``summary`` (what
``edge clean --help`` lists) and may declare the lowest default-domain opset it is written for
(``min_opset``; None: no more than the pass manager's own minimum). The manager checks that
requirement before any pass runs. ``modified`` must be true exactly when the graph changed: the
manager verifies the outputs after each modifying pass and runs rounds until none modifies.
A pass may add ``notes``: what it left alone and why (the manager reports each note once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import onnx_graphsurgeon as gs


@dataclass(frozen=True)
class PassResult:
    """What a pass gives back: the graph (the same object for an in-place pass), whether it changed, and notes."""

    graph: gs.Graph
    modified: bool
    notes: tuple[str, ...] = ()


@runtime_checkable
class GraphPass(Protocol):
    """A graph cleaning pass: ``name``, ``summary``, ``min_opset``, and a call on a graph that
    returns a :class:`PassResult`.

    The attributes are read-only properties here, so a frozen dataclass, class attributes or
    properties all satisfy them.
    """

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...

    @property
    def min_opset(self) -> int | None: ...

    def __call__(self, graph: gs.Graph) -> PassResult: ...


@dataclass(frozen=True)
class InPlacePass:
    """A pass written as a function that edits the graph in place and returns whether it changed it."""

    name: str
    summary: str
    rewrite: Callable[[gs.Graph], bool]
    min_opset: int | None = None

    def __call__(self, graph: gs.Graph) -> PassResult:
        return PassResult(graph, bool(self.rewrite(graph)))
