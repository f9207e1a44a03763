"""What a compression method is: one interface, implemented once per method in ``edge/compress/methods/``.

A method owns plan keywords (``linear``, ``dwconv``, ...), the step objects it parses them into,
the statistics it measures, the modules it puts at timm's seams (``blocks[i]``,
``blocks[i].attn``, ``blocks[i].mlp``), a JSON record of each applied step and the restore from
that record; its step options are one dataclass (``Method.options``, see
:mod:`edge.compress.options`). The compressor, the artifact, the plan grammar, the CLI help, the
fine-tuner, the latency planner and the CLI's sub-network cut (``derives``/``derive``, see
:mod:`edge.compress.derive`) know methods only through this interface and
:mod:`edge.compress.registry`.

The compressor applies a plan in four phases, each in the registry's order (``Method.order``):

1. ``prepare``: changes to the whole model before anything is measured (e.g. ``prefix=drop``);
2. ``build``: resolve automatic steps and fit the replacement modules, all on the model as it is
   before any replacement; each method sees the blocks that methods before it replace
   (``BuildContext.removed``) and the plan is re-validated after each;
3. ``place``: put every built module at its seam;
4. ``record``: one ``{method, step, options, record}`` entry per step for the artifact.

A module a method introduces counts its own FLOPs: ``flops(tokens) -> int`` for one image of
``tokens`` tokens (see :func:`edge.compress.cost.analytic_flops`); a module standing in
``model.blocks`` for several original blocks names them in ``replaced`` (see
:func:`edge.models.info.original_block_indices`).

A method whose compressed model trains through a temporary structure (dilution learning fades
the removed attention out over the fine-tune) returns a :class:`TrainingPhase` from
:meth:`Method.training_phase`; the fine-tuner drives it and keeps only what ``finish`` leaves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from edge.compress.moves import SearchSpace
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.models.info import ModelInfo


class Step(Protocol):
    """One parsed plan step. ``str(step)`` is its canonical text; equal text means an equal step."""

    options: dict

    @property
    def is_resolved(self) -> bool:
        """False while the step still has an automatic choice to make (``auto=K``)."""
        ...


@dataclass
class PlanCheck:
    """What the steps validated so far claim of a model with ``num_blocks`` blocks (original indices)."""

    num_blocks: int
    removed: dict[int, Step] = field(default_factory=dict)    # whole blocks replaced, and by which step
    attention: dict[int, Step] = field(default_factory=dict)  # blocks whose attention a step replaces


class BuildCache:
    """Built steps and measured statistics kept across many plans of one model and calibration set.

    The latency planner (``edge plan``) compresses one model by hundreds of candidate plans. Every
    method builds its steps on the model *before any replacement* (phase 2 above), so a step built
    once is the same step in any plan that holds it, and a method's statistics of the unmodified
    model serve every plan: :meth:`built` keeps each separable step's :class:`Built` (keyed by the
    method, the step's text and what ``prepare`` did), :meth:`memo` a method's statistics. A cache
    belongs to one source model, calibration set, seed and batch size; :func:`edge.compress.compress`
    refuses it with any other (``key``).
    """

    def __init__(self) -> None:
        self.key: str | None = None
        self._built: dict[tuple, Built] = {}
        self._memo: dict[tuple, Any] = {}
        self.hits = self.builds = 0

    def bind(self, key: str) -> None:
        """Tie the cache to the source and calibration ``key`` of its first use; refuse another."""
        if self.key is None:
            self.key = key
        elif self.key != key:
            raise ValueError(f"a BuildCache made for {self.key} used for {key}: one cache per model and calibration")

    def built(self, key: tuple, make: Callable[[], Built]) -> Built:
        """A copy of the :class:`Built` kept under ``key``, made by ``make()`` the first time."""
        if key not in self._built:
            self._built[key] = make()
            self.builds += 1
        else:
            self.hits += 1
        return copy.deepcopy(self._built[key])

    def memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        """The value kept under ``key`` (shared, not copied: treat it as read-only), made once."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


@dataclass
class BuildContext:
    """What a method's ``build`` sees: the unmodified model, its data and the blocks others remove."""

    model: nn.Module
    info: ModelInfo
    spec: InputSpec
    calibration: object           # edge.data Dataset of seeded, class-balanced samples
    samples: int
    seed: int
    holdout: float
    batch_size: int
    removed: set[int] = field(default_factory=set)            # blocks replaced by methods built earlier
    prepared: dict[str, dict] = field(default_factory=dict)   # method name -> what its prepare did
    cache: BuildCache | None = None                           # kept across plans of this model (edge plan)
    device: torch.device | None = None   # where the passes over the images run (edge.runtime.computing_on)

    def memo(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()`` (a method's statistics of the unmodified model): once for every plan that shares the
        cache (``edge plan``), else each time."""
        return make() if self.cache is None else self.cache.memo((name, prepared_key(self.prepared)), make)


@dataclass
class Built:
    """What ``build`` returns: the resolved steps, the modules to place, statistics for the manifest."""

    steps: tuple
    modules: object = None                                    # the method's own structure, read by place()
    fit: dict = field(default_factory=dict)                   # merged into the manifest's ``fit``
    planner: list[dict] = field(default_factory=list)         # candidate table of an automatic choice
    removed: set[int] = field(default_factory=set)            # whole blocks these steps replace
    manifest: dict = field(default_factory=dict)              # top-level manifest entries (wpac's ``supernet``)


class TrainingPhase(Protocol):
    """A structure a method puts into the student for the length of a fine-tune (e.g. dilution learning).

    The fine-tuner calls, in this order: ``start()`` once, after the held-out accuracy before
    training is measured and before the optimizer is made (the phase's parameters train; its
    ``module_types`` count as replaced modules for ``train=replaced``); ``step(step, total)``
    before every training step (``step`` 0-based; sets per-step values, returns what to log, e.g.
    ``{"M": 0.73}``); ``finish()`` once at the end, only when ``final`` is True, to leave the
    model's final structure, which is what is saved. ``state_dict``/``load_state_dict`` travel in
    the fine-tune checkpoint (after the student's weights are loaded); ``record()`` goes into the
    manifest's ``finetune`` record; ``manifest(m)`` returns the manifest the result is saved with
    (``m`` itself, or with what the trained structure offers: PIAD's sub-network order).
    """

    name: str
    module_types: tuple[type[nn.Module], ...]

    def start(self) -> None: ...

    def step(self, step: int, total: int) -> dict[str, float]: ...

    @property
    def final(self) -> bool:
        """Whether the student already computes exactly what ``finish()`` leaves."""
        ...

    def finish(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def record(self) -> dict: ...

    def manifest(self, manifest: dict) -> dict: ...


class Method:
    """Base of every compression method; a subclass sets the class attributes and overrides the phases."""

    name: ClassVar[str]                              # registry key, recorded in artifacts
    keywords: ClassVar[tuple[str, ...]]              # plan keywords it parses (``linear``, ``dwconv``)
    step_types: ClassVar[tuple[type, ...]]           # classes of the steps it parses
    module_types: ClassVar[tuple[type[nn.Module], ...]] = ()  # modules it puts at timm's seams
    order: ClassVar[int]                             # place in the application order (lower first)
    grammar: ClassVar[str]                           # one paragraph of plan grammar for --help (options apart)
    options: ClassVar[type | None] = None            # dataclass of its step options (edge.compress.options)
    calibration_samples: ClassVar[int] = 500         # default calibration size of plans using it (the largest wins)
    derivations: ClassVar[str] = ""                  # plans that cut a model out of its artifact (derives)

    def parse(self, keyword: str, rest: str, text: str) -> Step:
        """``text`` is the whole step, ``keyword`` its lower-cased method word, ``rest`` what follows ``:``."""
        raise NotImplementedError

    def sort_key(self, step: Step) -> tuple:
        """The canonical order of this method's steps within a plan (stable for equal keys)."""
        return ()

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        """Check ``steps`` against the model's block count and what earlier methods claim; claim in ``check``."""

    def prepare(self, model: nn.Module, steps: tuple, plan) -> dict:
        """Change the whole model before anything is measured; return a JSON record of what was done."""
        return {}

    def build(self, steps: tuple, context: BuildContext) -> Built:
        raise NotImplementedError

    def place(self, model: nn.Module, built: Built) -> None:
        raise NotImplementedError

    def record(self, model: nn.Module, step: Step, prepared: dict) -> dict:
        """JSON record of what ``step`` put into ``model``, enough for :meth:`restore` without data."""
        raise NotImplementedError

    def restore_prepare(self, model: nn.Module, records: list[dict]) -> None:
        """Redo ``prepare`` on a freshly created source model, from this method's step records."""

    def restore(self, model: nn.Module, records: list[dict]) -> None:
        """Put modules of the recorded shapes at their seams (their weights are loaded afterwards)."""
        raise NotImplementedError

    def upgrade_v1(self, manifest: dict) -> list[dict]:
        """Step entries (``{method, step, options, record}``) from a format-1 manifest's own keys."""
        return []

    def separable(self, step: Step) -> bool:
        """Whether ``step`` builds the same alone as beside this method's other steps (then a
        :class:`BuildCache` keeps it by itself and :meth:`merge` joins the pieces)."""
        return step.is_resolved

    def merge(self, built: list[Built]) -> Built:
        """One :class:`Built` of several steps built one by one (modules and fit records are dicts)."""
        merged = Built(())
        for part in built:
            merged.steps += tuple(part.steps)
            merged.modules = {**(merged.modules or {}), **(part.modules or {})}
            merged.fit = _merge_dicts(merged.fit, part.fit)
            merged.planner += part.planner
            merged.removed |= part.removed
            merged.manifest.update(part.manifest)
        return merged

    def search_space(self, info: ModelInfo) -> SearchSpace | None:
        """How ``edge plan`` walks this method on a model of ``info`` (None: the planner leaves it out)."""
        return None

    def training_phase(self, student: nn.Module, teacher: nn.Module, config,
                       steps: tuple[dict, ...] = ()) -> TrainingPhase | None:
        """The phase this method's modules in ``student`` train through when ``config`` asks for one, else None.

        ``config`` is the fine-tune's resolved recipe (``steps`` is the schedule length); ``steps``
        here are the artifact's step entries of this method (``{method, step, options, record}``).
        A method refuses a recipe it cannot follow with an EdgeError. Nothing in ``student``
        changes before the phase's ``start()``.
        """
        return None

    def derives(self, step: Step) -> bool:
        """Whether ``step``, as a plan's only step, cuts a model out of a compressed artifact without data
        (``edge compress ARTIFACT --plan STEP``: WPAC's sub-network of a super-network), see
        :mod:`edge.compress.derive`."""
        return False

    def check_derivation(self, step: Step, request: str, manifest: dict, where: str, predict) -> None:
        """Refuse, before the weights load, a derivation ``request`` that the artifact at ``where`` (its
        ``manifest``) cannot give; ``predict`` is the caller's latency predictor (``model -> ms``) or None."""

    def derive(self, model: nn.Module, manifest: dict, step: Step, where: str, *, predict=None,
               predictor: dict | None = None) -> dict:
        """Cut ``model``, loaded from the artifact at ``where``, in place as ``step`` asks; return the manifest
        entries that change (``steps`` first, then the method's own: ``supernet``, ``extracted``)."""
        raise NotImplementedError(f"method {self.name!r} derives nothing from an artifact")

    def is_applied(self, model: nn.Module) -> bool:
        return any(isinstance(m, self.module_types) for m in model.modules()) if self.module_types else False


def prepared_key(prepared: dict[str, dict]) -> str:
    """What the methods' ``prepare`` did to the model, as a cache key (a method that did nothing returns {})."""
    return json.dumps({name: record for name, record in prepared.items() if record}, sort_keys=True, default=str)


def _merge_dicts(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge_dicts(out[key], value) if both else value
    return out


def parse_count(text: str, step_text: str, what: str, expected: str) -> int:
    """A positive count ``K`` of a plan step (``auto-linear:K``, ``dwconv:auto=K``), or a clear error."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count <= 0:
        raise EdgeError(f"plan step {step_text!r} needs a positive {what} count", expected=expected)
    return count


def check_block_index(step, block: int, n: int) -> None:
    """Refuse a plan step that names block ``block`` of a model with ``n`` blocks when there is none."""
    if not 0 <= block < n:
        raise EdgeError(f"plan step {step}: block {block} is out of range for a model with {n} blocks",
                        expected=f"block indices 0..{n - 1}", fix="`edge models MODEL` lists the model's blocks")
