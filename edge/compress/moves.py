"""How the latency planner (``edge plan``) walks a compression method: states, moves and their steps.

A method that takes part in planning returns a :class:`SearchSpace` from
:meth:`edge.compress.method.Method.search_space`. The planner holds one state per method (a
hashable value only the method reads: the blocks it touches, the widths it keeps), asks each
method for the moves from its state, joins every method's steps into one plan text and measures
it; the methods' own ``validate`` refuses combinations that conflict (a width cut of a block a
span removes), so the planner needs to know nothing of any method.

A move is one small step further: one more block removed, one more attention replaced, one block's
MLP a level narrower. A move names the blocks it takes; the other methods *release* them (a block
removed loses its width cut), so a plan that narrowed every block can still remove one. Its
``label`` says so in words for the planner's record; its ``key`` stays the same while the move means
the same thing (the planner re-measures moves in the order of their last measured cost, so the key
is how it knows a move again from round to round).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Move:
    key: str            # stable identity of the move across rounds, e.g. "dwconv:5"
    label: str          # what it does, in words
    state: Hashable     # the method's state after the move
    blocks: tuple[int, ...] = ()   # the original blocks it takes (other methods release them: see release)


class SearchSpace(Protocol):
    method: str

    def initial(self) -> Hashable:
        """The state of a plan without this method."""
        ...

    def moves(self, state: Hashable) -> list[Move]:
        """Every move from ``state``, in a fixed order."""
        ...

    def steps(self, state: Hashable) -> str:
        """The plan text of ``state`` (comma-separated steps; empty for the initial state)."""
        ...

    def release(self, state: Hashable, blocks: tuple[int, ...]) -> Hashable:
        """``state`` without anything on ``blocks`` (another method's move takes them)."""
        ...


@dataclass(frozen=True)
class BlockSetSearch:
    """A method whose plan is a set of blocks: each move adds one (``template`` formats the blocks)."""

    method: str
    num_blocks: int
    template: str           # e.g. "dwconv:blocks={blocks}"
    what: str               # e.g. "attention -> depthwise conv"

    def initial(self) -> frozenset[int]:
        return frozenset()

    def moves(self, state: Hashable) -> list[Move]:
        chosen = _blocks(state)
        return [Move(f"{self.method}:{b}", f"block {b}: {self.what}", frozenset(chosen | {b}), (b,))
                for b in range(self.num_blocks) if b not in chosen]

    def release(self, state: Hashable, blocks: tuple[int, ...]) -> frozenset[int]:
        return _blocks(state) - set(blocks)

    def steps(self, state: Hashable) -> str:
        chosen = _blocks(state)
        return self.template.format(blocks="+".join(map(str, sorted(chosen)))) if chosen else ""


def _blocks(state: Hashable) -> frozenset[int]:
    assert isinstance(state, frozenset)
    return state
