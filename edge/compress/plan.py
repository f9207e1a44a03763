"""Compression plans: steps ``KEYWORD[:...][:key=value...]`` separated by commas.

Each step's keyword names a registered method (:mod:`edge.compress.registry`), which parses the
rest of the step; the methods' grammars are in their folders (``edge/compress/methods/``), their
options in one dataclass each (:mod:`edge.compress.options`), and both in ``edge compress --help``.
Steps are kept in one canonical order: by method (the registry's application order), then by the
method's own key. The same text always parses to the same plan,
and ``str(plan)`` is its canonical form.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from edge.compress.method import PlanCheck, Step
from edge.compress.options import describe_options
from edge.compress.registry import keywords, method_for_keyword, method_of, methods
from edge.errors import EdgeError


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    @classmethod
    def canonical(cls, steps) -> Plan:
        """The plan of ``steps`` in canonical order: by method, then by the method's key (stable)."""
        rank = {m.name: i for i, m in enumerate(methods())}

        def key(step):
            method = method_of(step)
            return (rank[method.name], *method.sort_key(step))

        return cls(tuple(sorted(steps, key=key)))

    def steps_of(self, method) -> tuple[Step, ...]:
        """The steps of one method (a :class:`~edge.compress.method.Method` or its name)."""
        name = method if isinstance(method, str) else method.name
        return tuple(s for s in self.steps if method_of(s).name == name)

    @property
    def is_resolved(self) -> bool:
        return all(s.is_resolved for s in self.steps)

    def __str__(self) -> str:
        return ",".join(str(s) for s in self.steps)

    def validate(self, num_blocks: int) -> Plan:
        """Check every step against a model of ``num_blocks`` blocks and against each other, method by method."""
        check = PlanCheck(num_blocks)
        for method in methods():
            method.validate(self.steps_of(method), check)
        return self


def _parse_step(text: str) -> Step:
    keyword, _, rest = text.partition(":")
    keyword = keyword.strip().lower()
    method = method_for_keyword(keyword)
    if method is None:
        known = keywords()
        close = difflib.get_close_matches(keyword, known, n=3)
        raise EdgeError(f"unknown method {keyword!r} in plan step {text!r}", expected=f"one of {', '.join(known)}",
                        found=f"closest: {', '.join(close)}" if close else None)
    return method.parse(keyword, rest, text)


def parse_plan(text: str) -> Plan:
    """Parse ``linear:2-3,affine:9-11:ridge=1e-4`` or ``auto-linear:3,dwconv:auto=2`` into a :class:`Plan`."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise EdgeError("the plan is empty", expected="steps such as linear:2-3 or auto-linear:3")
    return Plan.canonical(_parse_step(p) for p in parts)


def plan_grammar() -> str:
    """The plan grammar of every registered method, with its options (from its options dataclass), for ``--help``."""
    return "steps separated by commas. " + " ".join(_method_grammar(m) for m in methods())


def _method_grammar(method) -> str:
    return f"{method.grammar} {describe_options(method.options)}" if method.options else method.grammar
