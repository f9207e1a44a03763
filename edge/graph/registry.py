"""Graph passes by name, in the order the pass manager runs them in each round."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from edge.errors import EdgeError
from edge.graph.graph_pass import GraphPass


class PassRegistry:
    """Named graph passes in registration order; a name is registered once.

    The order matters: each round runs the passes in this order, and the fixed point (so the
    cleaned graph's bytes) may depend on it.
    """

    def __init__(self) -> None:
        self._passes: dict[str, GraphPass] = {}

    def register(self, graph_pass: GraphPass) -> GraphPass:
        """Add ``graph_pass`` after those registered so far; returns it."""
        if not isinstance(graph_pass, GraphPass):
            raise TypeError(f"{graph_pass!r} is not a graph pass: it needs name, summary, min_opset and "
                            "__call__(graph) -> PassResult")
        if graph_pass.name in self._passes:
            raise ValueError(f"a graph pass named {graph_pass.name!r} is already registered "
                             f"({self._passes[graph_pass.name]!r}); give the new pass another name")
        self._passes[graph_pass.name] = graph_pass
        return graph_pass

    def names(self) -> tuple[str, ...]:
        return tuple(self._passes)

    def select(self, skip: Iterable[str] = ()) -> tuple[GraphPass, ...]:
        """The registered passes in order, less those named in ``skip``."""
        skip = list(skip)
        for name in skip:
            self._check_known(name)
        return tuple(p for p in self._passes.values() if p.name not in skip)

    def __getitem__(self, name: str) -> GraphPass:
        self._check_known(name)
        return self._passes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._passes

    def __iter__(self) -> Iterator[GraphPass]:
        return iter(self._passes.values())

    def __len__(self) -> int:
        return len(self._passes)

    def _check_known(self, name: str) -> None:
        if name not in self._passes:
            raise EdgeError(f"unknown pass {name!r}", expected=f"one of {', '.join(sorted(self._passes))}")
