"""Compression plans: ``METHOD:S-E[:key=value...]`` steps separated by commas.

Block approximation (TOAST / RBA): ``linear:2-3`` replaces blocks S+1..E (here block 3) by
one map from the output of block S to the output of block E; ``S = -1`` starts from the
embedding output. Methods: identity, linear, affine (closed form), skip (blocks removed, the
papers' baseline), mlp and resmlp (trained translators, the papers' comparison baselines).
Options: ``ridge=FLOAT`` (relative ridge term), ``prefix=own`` (fit the class/register tokens
with their own map), ``steps=N`` and ``lr=FLOAT`` for the trained translators.

``auto-linear:K`` / ``auto-affine:K`` let the planner choose K blocks to replace.

The same text always parses to the same plan, and ``str(plan)`` is its canonical form.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from edge.errors import EdgeError

CLOSED_FORM = ("identity", "linear", "affine")
TRAINED = ("mlp", "resmlp")
SPAN_METHODS = (*CLOSED_FORM, "skip", *TRAINED)
AUTO_METHODS = ("auto-linear", "auto-affine")
OPTION_TYPES = {"ridge": float, "prefix": str, "steps": int, "lr": float}
PREFIX_MODES = ("shared", "own")


def _format_options(options: dict) -> str:
    return "".join(f":{k}={v}" for k, v in sorted(options.items()))


@dataclass(frozen=True)
class SpanStep:
    """Replace blocks ``start+1 .. end`` by one map (block indices of the original model)."""

    method: str
    start: int
    end: int
    options: dict = field(default_factory=dict, compare=True, hash=False)

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(range(self.start + 1, self.end + 1))

    @property
    def ridge(self) -> float:
        return float(self.options.get("ridge", 0.0))

    @property
    def prefix(self) -> str:
        return str(self.options.get("prefix", "shared"))

    def __str__(self) -> str:
        return f"{self.method}:{self.start}-{self.end}{_format_options(self.options)}"


@dataclass(frozen=True)
class AutoStep:
    """Let the planner choose ``count`` blocks to replace with ``method`` maps."""

    method: str      # linear | affine
    count: int
    options: dict = field(default_factory=dict, hash=False)

    def __str__(self) -> str:
        return f"auto-{self.method}:{self.count}{_format_options(self.options)}"


@dataclass(frozen=True)
class Plan:
    steps: tuple[SpanStep | AutoStep, ...]

    @property
    def spans(self) -> tuple[SpanStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, SpanStep))

    @property
    def is_resolved(self) -> bool:
        return all(isinstance(s, SpanStep) for s in self.steps)

    def __str__(self) -> str:
        return ",".join(str(s) for s in self.steps)

    def validate(self, num_blocks: int) -> Plan:
        """Check every index against the model and that no two spans replace the same block."""
        owner: dict[int, SpanStep] = {}
        for step in self.spans:
            if not -1 <= step.start < num_blocks or not 0 <= step.end < num_blocks:
                raise EdgeError(f"plan step {step} is out of range for a model with {num_blocks} blocks",
                                expected=f"-1 <= S < E <= {num_blocks - 1} (S = -1: from the embedding output)")
            for block in step.blocks:
                if block in owner:
                    raise EdgeError(f"plan steps {owner[block]} and {step} overlap (both replace block {block})",
                                    expected="non-overlapping spans, e.g. linear:2-4,linear:4-6",
                                    fix="merge them into one span or separate them")
                owner[block] = step
        autos = [s for s in self.steps if isinstance(s, AutoStep)]
        if len(autos) > 1:
            raise EdgeError(f"plan has {len(autos)} auto steps ({', '.join(map(str, autos))})",
                            expected="at most one auto-METHOD:K step (beside any fixed spans)")
        budget = num_blocks - len(owner)
        for step in self.steps:
            if isinstance(step, AutoStep) and step.count > budget:
                raise EdgeError(f"plan step {step} asks for {step.count} blocks, {budget} are left to replace",
                                expected=f"K <= {budget}")
        return self


def _parse_options(parts: list[str], step_text: str) -> dict:
    options = {}
    for part in parts:
        if "=" not in part:
            raise EdgeError(f"option {part!r} in plan step {step_text!r} is not key=value",
                            expected=f"options {', '.join(OPTION_TYPES)} as :key=value")
        key, value = part.split("=", 1)
        if key not in OPTION_TYPES:
            raise EdgeError(f"unknown option {key!r} in plan step {step_text!r}",
                            expected=f"one of {', '.join(OPTION_TYPES)}")
        try:
            options[key] = OPTION_TYPES[key](value)
        except ValueError as e:
            raise EdgeError(f"option {key}={value} in plan step {step_text!r} is not a {OPTION_TYPES[key].__name__}")\
                from e
    if options.get("prefix", "shared") not in PREFIX_MODES:
        raise EdgeError(f"prefix={options['prefix']} in plan step {step_text!r}",
                        expected="prefix=shared or prefix=own")
    if options.get("ridge", 0.0) < 0:
        raise EdgeError(f"ridge={options['ridge']} in plan step {step_text!r} is negative", expected="ridge >= 0")
    return options


def _parse_step(text: str) -> SpanStep | AutoStep:
    method, _, rest = text.partition(":")
    method = method.strip().lower()
    if method not in SPAN_METHODS + AUTO_METHODS:
        close = difflib.get_close_matches(method, SPAN_METHODS + AUTO_METHODS, n=3)
        raise EdgeError(f"unknown method {method!r} in plan step {text!r}",
                        expected=f"one of {', '.join(SPAN_METHODS + AUTO_METHODS)}",
                        found=f"closest: {', '.join(close)}" if close else None)
    where, *option_parts = rest.split(":") if rest else [""]
    options = _parse_options(option_parts, text)
    if method in AUTO_METHODS:
        try:
            count = int(where)
        except ValueError:
            count = 0
        if count <= 0:
            raise EdgeError(f"plan step {text!r} needs a positive block count", expected=f"{method}:K, e.g. {method}:3")
        return AutoStep(method.removeprefix("auto-"), count, options)
    try:
        start_text, end_text = where.rsplit("-", 1) if not where.startswith("-") or where.count("-") > 1 else ("", "")
        start, end = int(start_text), int(end_text)
    except ValueError as e:
        raise EdgeError(f"plan step {text!r} has no span", expected=f"{method}:S-E, e.g. {method}:2-3 "
                        "(blocks S+1..E replaced; S = -1 starts from the embedding output)") from e
    if start >= end:
        raise EdgeError(f"plan step {text!r} has S >= E", expected="S < E: the span S-E replaces blocks S+1..E")
    return SpanStep(method, start, end, options)


def parse_plan(text: str) -> Plan:
    """Parse ``linear:2-3,affine:9-11:ridge=1e-4`` or ``auto-linear:3`` into a :class:`Plan`."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise EdgeError("the plan is empty", expected="steps such as linear:2-3 or auto-linear:3")
    steps = tuple(_parse_step(p) for p in parts)
    spans = sorted((s for s in steps if isinstance(s, SpanStep)), key=lambda s: s.start)
    autos = tuple(s for s in steps if isinstance(s, AutoStep))
    return Plan((*spans, *autos))
