"""Compression plans: ``METHOD:S-E[:key=value...]`` steps separated by commas.

Block approximation (TOAST / RBA): ``linear:2-3`` replaces blocks S+1..E (here block 3) by
one map from the output of block S to the output of block E; ``S = -1`` starts from the
embedding output. Methods: identity, linear, affine (closed form), skip (blocks removed, the
papers' baseline), mlp and resmlp (trained translators, the papers' comparison baselines).
Options: ``ridge=FLOAT`` (relative ridge term), ``prefix=own`` (fit the class/register tokens
with their own map), ``steps=N`` and ``lr=FLOAT`` for the trained translators.

``auto-linear:K`` / ``auto-affine:K`` let the planner choose K blocks to replace.

Drop-in depthwise convolution (:mod:`edge.compress.dwconv`) replaces attention, not blocks:
``dwconv:blocks=2+5+7`` (every head of blocks 2, 5 and 7), ``dwconv:auto=K`` (the K blocks of
lowest Sigma_b; ``order=highest`` for the paper's ablation), ``dwconv:heads=auto=K`` (the K heads
of lowest Sigma_h anywhere, scattered) or ``dwconv:heads=2.0+5.3`` (block.head). Options:
``init=gaussian|mean|lsq``, ``k=ODD``, ``variant=unensembled|ensembled|full``,
``prefix=mean|pool|attend|drop``, ``order=lowest|highest``, ``ridge=FLOAT`` (for init=lsq).

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
DWCONV = "dwconv"
DWCONV_OPTION_TYPES = {"init": str, "k": int, "variant": str, "prefix": str, "order": str, "ridge": float}
DWCONV_CHOICES = {"init": ("gaussian", "mean", "lsq"), "variant": ("unensembled", "ensembled", "full"),
                  "prefix": ("mean", "pool", "attend", "drop"), "order": ("lowest", "highest")}
DWCONV_DEFAULTS = {"init": "lsq", "k": 3, "variant": "unensembled", "prefix": "pool", "order": "lowest",
                   "ridge": 1e-4}


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
class DWConvStep:
    """Replace attention heads by a depthwise convolution over V (original block indices).

    Exactly one of: ``blocks`` (every head of these blocks), ``heads`` ((block, head) pairs),
    ``auto`` > 0 (chosen by the Sigma criterion; ``scattered`` picks heads, else blocks).
    """

    blocks: tuple[int, ...] = ()
    heads: tuple[tuple[int, int], ...] = ()
    auto: int = 0
    scattered: bool = False
    options: dict = field(default_factory=dict, hash=False)

    def option(self, key: str):
        """The option's value, or its default (defaults are resolved here only)."""
        return self.options.get(key, DWCONV_DEFAULTS[key])

    @property
    def is_resolved(self) -> bool:
        return self.auto == 0

    @property
    def touched_blocks(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.blocks) | {b for b, _ in self.heads}))

    def __str__(self) -> str:
        if self.auto:
            where = f"heads=auto={self.auto}" if self.scattered else f"auto={self.auto}"
        elif self.heads:
            where = "heads=" + "+".join(f"{b}.{h}" for b, h in self.heads)
        else:
            where = "blocks=" + "+".join(map(str, self.blocks))
        return f"{DWCONV}:{where}{_format_options(self.options)}"


@dataclass(frozen=True)
class Plan:
    steps: tuple[SpanStep | AutoStep | DWConvStep, ...]

    @property
    def spans(self) -> tuple[SpanStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, SpanStep))

    @property
    def dwconv(self) -> tuple[DWConvStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, DWConvStep))

    @property
    def has_auto_spans(self) -> bool:
        return any(isinstance(s, AutoStep) for s in self.steps)

    @property
    def is_resolved(self) -> bool:
        return all(isinstance(s, SpanStep) or (isinstance(s, DWConvStep) and s.is_resolved) for s in self.steps)

    def __str__(self) -> str:
        return ",".join(str(s) for s in self.steps)

    def validate(self, num_blocks: int) -> Plan:
        """Check every index against the model and that no two spans replace the same block."""
        owner: dict[int, SpanStep] = {}
        for step in self.spans:
            if not -1 <= step.start < num_blocks or not 0 <= step.end < num_blocks:
                raise EdgeError(f"plan step {step} is out of range for a model with {num_blocks} blocks",
                                expected=f"-1 <= S < E <= {num_blocks - 1} (S = -1: from the embedding output)",
                                fix="`edge models MODEL` lists the model's blocks")
            for block in step.blocks:
                if block in owner:
                    raise EdgeError(f"plan steps {owner[block]} and {step} overlap (both replace block {block})",
                                    expected="non-overlapping spans, e.g. linear:2-4,linear:4-6",
                                    fix="merge them into one span or separate them")
                owner[block] = step
        self._validate_dwconv(num_blocks, set(owner))
        autos = [s for s in self.steps if isinstance(s, AutoStep)]
        if len(autos) > 1:
            raise EdgeError(f"plan has {len(autos)} auto steps ({', '.join(map(str, autos))})",
                            expected="at most one auto-METHOD:K step (beside any fixed spans)",
                            fix="merge them into one auto step, e.g. auto-linear:3")
        budget = num_blocks - len(owner)
        for step in self.steps:
            if isinstance(step, AutoStep) and step.count > budget:
                raise EdgeError(f"plan step {step} asks for {step.count} blocks, {budget} are left to replace",
                                expected=f"K <= {budget}", fix=f"ask for at most {budget} blocks")
        return self

    def _validate_dwconv(self, num_blocks: int, span_blocks: set[int]) -> None:
        steps = self.dwconv
        if len([s for s in steps if not s.is_resolved]) > 1:
            raise EdgeError(f"plan has {len(steps)} automatic dwconv steps",
                            expected="at most one dwconv:auto=K or dwconv:heads=auto=K step",
                            fix="merge them into one step or list the blocks (dwconv:blocks=2+5+7)")
        seen: dict[int, DWConvStep] = {}
        for step in steps:
            for block in step.touched_blocks:
                if not 0 <= block < num_blocks:
                    raise EdgeError(f"plan step {step}: block {block} is out of range for a model with "
                                    f"{num_blocks} blocks", expected=f"block indices 0..{num_blocks - 1}",
                                    fix="`edge models MODEL` lists the model's blocks")
                if block in span_blocks:
                    raise EdgeError(f"plan step {step} replaces the attention of block {block}, which a span "
                                    "removes", fix="leave that block out of one of the two steps")
                if block in seen and seen[block] is not step:
                    raise EdgeError(f"plan steps {seen[block]} and {step} both replace attention in block {block}",
                                    fix="list each block in one dwconv step")
                seen[block] = step
        free = num_blocks - len(span_blocks) - len(seen)
        for step in steps:
            if step.auto and not step.scattered and step.auto > free:
                raise EdgeError(f"plan step {step} asks for {step.auto} blocks, {free} are left",
                                expected=f"K <= {free}", fix=f"ask for at most {free} blocks")


def _parse_options(parts: list[str], step_text: str, types: dict | None = None) -> dict:
    types = types or OPTION_TYPES
    options = {}
    for part in parts:
        if "=" not in part:
            raise EdgeError(f"option {part!r} in plan step {step_text!r} is not key=value",
                            expected=f"options {', '.join(types)} as :key=value")
        key, value = part.split("=", 1)
        if key not in types:
            raise EdgeError(f"unknown option {key!r} in plan step {step_text!r}",
                            expected=f"one of {', '.join(types)}")
        try:
            options[key] = types[key](value)
        except ValueError as e:
            raise EdgeError(f"option {key}={value} in plan step {step_text!r} is not a {types[key].__name__}")\
                from e
    if types is DWCONV_OPTION_TYPES:
        return _check_dwconv_options(options, step_text)
    if options.get("prefix", "shared") not in PREFIX_MODES:
        raise EdgeError(f"prefix={options['prefix']} in plan step {step_text!r}",
                        expected="prefix=shared or prefix=own")
    if options.get("ridge", 0.0) < 0:
        raise EdgeError(f"ridge={options['ridge']} in plan step {step_text!r} is negative", expected="ridge >= 0")
    return options


def _check_dwconv_options(options: dict, step_text: str) -> dict:
    for key, choices in DWCONV_CHOICES.items():
        if key in options and options[key] not in choices:
            raise EdgeError(f"{key}={options[key]} in plan step {step_text!r}",
                            expected=" or ".join(f"{key}={c}" for c in choices))
    k = options.get("k", DWCONV_DEFAULTS["k"])
    if k < 1 or k % 2 == 0:
        raise EdgeError(f"k={k} in plan step {step_text!r}: the kernel size must be odd",
                        expected="an odd kernel size such as 3 or 5", fix="use k=3 (the paper's choice)")
    if options.get("ridge", 0.0) < 0:
        raise EdgeError(f"ridge={options['ridge']} in plan step {step_text!r} is negative", expected="ridge >= 0")
    return options


def _parse_count(text: str, step_text: str, what: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count <= 0:
        raise EdgeError(f"plan step {step_text!r} needs a positive {what} count",
                        expected="dwconv:auto=K or dwconv:heads=auto=K, e.g. dwconv:auto=6")
    return count


def _parse_dwconv(where: str, option_parts: list[str], text: str) -> DWConvStep:
    options = _parse_options(option_parts, text, DWCONV_OPTION_TYPES)
    usage = "dwconv:blocks=2+5+7, dwconv:auto=K, dwconv:heads=auto=K or dwconv:heads=2.0+5.3 (block.head)"
    key, _, value = where.partition("=")
    try:
        if key == "auto":
            return DWConvStep(auto=_parse_count(value, text, "block"), options=options)
        if key == "heads" and value.startswith("auto="):
            return DWConvStep(auto=_parse_count(value.removeprefix("auto="), text, "head"), scattered=True,
                              options=options)
        if key == "heads" and value:
            pairs = tuple(sorted({(int(b), int(h)) for b, h in (item.split(".") for item in value.split("+"))}))
            return DWConvStep(heads=pairs, options=options)
        if key == "blocks" and value:
            return DWConvStep(blocks=tuple(sorted({int(b) for b in value.split("+")})), options=options)
    except ValueError as e:
        raise EdgeError(f"plan step {text!r} does not say which attention to replace", expected=usage) from e
    raise EdgeError(f"plan step {text!r} does not say which attention to replace", expected=usage)


def _parse_step(text: str) -> SpanStep | AutoStep | DWConvStep:
    method, _, rest = text.partition(":")
    method = method.strip().lower()
    if method == DWCONV:
        where, *option_parts = rest.split(":") if rest else [""]
        return _parse_dwconv(where, option_parts, text)
    if method not in SPAN_METHODS + AUTO_METHODS:
        close = difflib.get_close_matches(method, SPAN_METHODS + AUTO_METHODS + (DWCONV,), n=3)
        raise EdgeError(f"unknown method {method!r} in plan step {text!r}",
                        expected=f"one of {', '.join(SPAN_METHODS + AUTO_METHODS + (DWCONV,))}",
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
    dwconv = sorted((s for s in steps if isinstance(s, DWConvStep)), key=lambda s: (not s.is_resolved, str(s)))
    return Plan((*spans, *autos, *dwconv))
