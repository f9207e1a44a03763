"""Pipeline recipes: a YAML file naming the model, the data and the variants to build and measure.

A recipe is read once, checked completely (unknown keys, types, ranges, plan syntax, model names,
files) and turned into frozen dataclasses; every error names the recipe file and the key. A
section's keys, types, defaults and ranges are those of a library config (``export:`` holds fields
of ``edge.export.ExportConfig``, see :data:`SECTIONS`), so the CLI, the recipe and the library share
one definition. The built-in default (``default.yaml`` beside this module) documents every key; the
other ``*.yaml`` beside it are shipped recipes a run may name (``--recipe spans``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edge.config import (MAX_BATCH, MAX_SAMPLES, MAX_SEED, MAX_THREADS, Bounds, bounds, checked_value,
                         option)
from edge.errors import EdgeError, InternalError

DEFAULT_RECIPE = Path(__file__).with_name("default.yaml")
BUILTIN = "<built-in default recipe>"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
NAMED_DATA = ("fmnist", "fmnist-mini")


@dataclass(frozen=True)
class AnalysisKeys:
    """The analysis section's key that only the pipeline has (the rest are ``AnalysisConfig`` fields)."""

    enabled: bool = True


@dataclass(frozen=True)
class EvaluateKeys:
    """The evaluate section's key that only the pipeline has (the rest are ``EvaluateConfig`` fields)."""

    samples: int | None = option(None, minimum=1)  # the headline graphs: None: the whole test split; N: a subset
    # every other graph (method variants, FP16, INT8): a fixed, seeded, class-balanced subset of the test split
    # (labelled "subset (N)" with its 95 % interval); None: the whole split (edge pipeline --full-split)
    subset: int | None = option(2000, minimum=1)


@dataclass(frozen=True)
class ProfileKeys:
    """The profile section's key that only the pipeline has (the rest are ``SideBySideConfig`` fields)."""

    # new processes the session sets are split between (edge.profile.fresh.time_fresh_settings), at most
    # `sessions`; None: one per session set. Each process's own state moves its timings a little, several
    # average it out
    processes: int | None = option(None, minimum=1)


@dataclass(frozen=True)
class PlanKeys:
    """The plan section's key that only the pipeline has (the rest: ``SearchConfig`` and ``TargetConfig`` fields)."""

    name: str = "planned"  # the variant the plan's choice becomes


@dataclass(frozen=True)
class PrecisionKeys:
    """Which variants get which precisions (the int8 options are ``Int8Config`` fields)."""

    variants: tuple[str, ...] = ("planned", "original")
    precisions: tuple[str, ...] = ("fp16", "int8")
    # the accuracy gate's test images (edge.precision.gate) for the dynamic-batch graph (one ONNX Runtime call: its
    # figures are the report's) and for the static-batch graph, which runs one image per call: on this CPU an
    # INT8 graph with a float16 rest takes ~15 ms a call at batch 1, so 500 images cost seconds per graph
    gate_images: int = option(500, minimum=1, maximum=MAX_SAMPLES)
    static_gate_images: int = option(100, minimum=1, maximum=MAX_SAMPLES)
    # FP16/INT8 accuracy: on this many (balanced) of evaluate.subset's images, beside float32 on the same ones;
    # None: all of evaluate.subset's. On a CPU ONNX Runtime runs these graphs slower than float32 (INT8 up to 5x)
    test_images: int | None = option(None, minimum=1)


@dataclass(frozen=True)
class EstimateKeys:
    """The Orin Nano estimate of every variant (edge.latency.orin): its power mode, precision and batch."""

    power_mode: str = "MAXN_SUPER"
    precision: str = "fp16"  # of the float32 variants; fp16 and int8 variants are estimated at their own
    batch: int = option(1, minimum=1, maximum=MAX_BATCH)


@dataclass(frozen=True)
class BundleKeys:
    """Which variants go into ``OUT/bundle`` (the rest: ``BundleConfig`` fields)."""

    variants: tuple[str, ...] = ("planned", "original")


@dataclass(frozen=True)
class Section:
    """A recipe section: fields of a library config (names, types, defaults, ranges), set from a recipe.

    ``config`` is the library config as ``module:Class``, imported when a recipe is read (the library
    modules load torch; importing this module must not). ``keys`` are the section's keys in the order
    ``default.yaml`` lists them: fields of ``config``, or of ``own`` (keys only the pipeline has); the
    pipeline sets the config's other fields itself. ``defaults`` holds the recipe's default where it
    differs from the library's; ``default.yaml`` states every such value.
    """

    config: str
    keys: tuple[str, ...]
    own: type | None = None
    defaults: Mapping[str, object] = field(default_factory=dict)
    also: tuple[str, ...] = ()  # further library configs whose fields the section holds (``module:Class``)

    def library_configs(self) -> list[type]:
        found: list[type] = []
        for spec in (self.config, *self.also):
            module, name = spec.split(":")
            found.append(getattr(importlib.import_module(module), name))
        return found


SECTIONS = {
    "calibration": Section("edge.compress:CompressConfig", ("samples", "holdout")),
    "analysis": Section("edge.analysis.analyze:AnalysisConfig", ("enabled", "samples"), own=AnalysisKeys),
    "export": Section("edge.export:ExportConfig", ("batch", "opset")),
    # the recipe's own defaults: bigger evaluation batches than `edge eval`, more timed runs than `edge profile`
    "evaluate": Section("edge.check.accuracy:EvaluateConfig", ("batch_size", "samples", "subset"), own=EvaluateKeys,
                        # 64: measured fastest for ONNX Runtime on the reference model here (2 threads: 37.5 s
                        # per 10,000 images against 44 s at 500; the activations of a batch stay in cache)
                        defaults={"batch_size": 64}),
    "profile": Section("edge.profile.sidebyside:SideBySideConfig",
                       ("warmup", "rounds", "sessions", "processes", "iterations", "turn_ms", "aa_tolerance",
                        "spinning"), own=ProfileKeys),
    # optional sections (None unless the recipe has them): the planner, precision, the Orin estimate, the bundle
    "plan": Section("edge.planner.search:SearchConfig",
                    ("name", "budget", "backend", "table", "precision", "power_mode", "batch", "samples", "holdout",
                     "shortlist", "refresh", "min_step"), own=PlanKeys, also=("edge.planner.job:TargetConfig",),
                    defaults={"budget": 0.5, "backend": "estimate", "precision": "fp16", "power_mode": "MAXN_SUPER",
                              "batch": 1, "samples": 128, "holdout": 128, "min_step": 0.02}),
    "precision": Section("edge.precision.int8:Int8Config",
                         ("variants", "precisions", "samples", "gate_images", "static_gate_images",
                          "test_images"),
                         own=PrecisionKeys, defaults={"samples": 200}),
    "estimate": Section("edge.pipeline.recipe:EstimateKeys", ("power_mode", "precision", "batch")),
    "bundle": Section("edge.bundle:BundleConfig", ("variants", "precisions", "samples", "gate_images"),
                      own=BundleKeys, defaults={"precisions": ("fp32", "fp16", "int8"), "samples": 200}),
}
OPTIONAL = ("plan", "precision", "estimate", "bundle")  # sections that run only when the recipe has them


@functools.cache
def section_type(key: str) -> type:
    """The frozen dataclass of recipe section ``key``: its keys as fields of the library config (or ``own``)."""
    section = SECTIONS[key]
    found = {}  # name -> (field, type) of the library configs, then of the pipeline's own keys
    for cls in (*section.library_configs(), *([section.own] if section.own is not None else [])):
        hints = typing.get_type_hints(cls)
        found |= {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}
    missing = [name for name in section.keys if name not in found]
    if missing:
        raise InternalError(f"recipe section {key}: {section.config} has no field {missing[0]!r}")
    spec = []
    for name in section.keys:
        library, hint = found[name]
        default = section.defaults.get(name, library.default)
        spec.append((name, hint, field(default=default, metadata=library.metadata)))
    return dataclasses.make_dataclass(f"Recipe{key.title()}", spec, frozen=True)


def _section(key: str):
    return field(default_factory=lambda: section_type(key)())


@dataclass(frozen=True)
class Variant:
    name: str
    plan: str | None = None  # canonical plan text; None: the model as it is (or, searched, the plan found)
    searched: bool = False   # the plan section's choice (its plan is known once the search ran)


@dataclass(frozen=True)
class Recipe:
    """A checked recipe. Each section holds the recipe's keys of a library config (see :data:`SECTIONS`)."""

    variants: tuple[Variant, ...]
    model: str = "fmnist-deit-tiny"
    weights: str | None = None
    img_size: int | tuple[int, int] | None = None  # N or (H, W): edge.models.ImgSize; a recipe may write 224x320
    data: str | None = None             # None: a bundled model's data set (fallback: its check set); else needed
    fallback_data: str | None = None    # used when ``data`` cannot be read (None: the error stops the run)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    threads: int = option(2, minimum=1, maximum=MAX_THREADS)
    calibration: typing.Any = _section("calibration")  # samples, holdout of CompressConfig
    analysis: typing.Any = _section("analysis")        # enabled; samples of AnalysisConfig
    export: typing.Any = _section("export")            # batch, opset of ExportConfig
    evaluate: typing.Any = _section("evaluate")        # batch_size of EvaluateConfig; samples
    profile: typing.Any = _section("profile")          # warmup, rounds, sessions, ... of SideBySideConfig
    plan: typing.Any = None       # SearchConfig and TargetConfig keys, name; None: no plan search
    precision: typing.Any = None  # variants, precisions; samples of Int8Config; None: float32 only
    estimate: typing.Any = None   # power_mode, precision, batch of the Orin Nano estimate; None: none
    bundle: typing.Any = None     # variants; precisions, samples, gate_images of BundleConfig; None: no bundle
    source: str = BUILTIN  # where the recipe was read from (not a recipe key)

    def as_dict(self) -> dict:
        record = dataclasses.asdict(self)
        record["variants"] = [dataclasses.asdict(v) for v in self.variants]
        return record

    @property
    def planned(self) -> str | None:
        """The name of the variant the plan section makes, or None."""
        return self.plan.name if self.plan is not None else None

    def run_variants(self) -> tuple[Variant, ...]:
        """Every variant of a run, in the report's order: the reference, the planned one, the rest."""
        found = list(self.variants)
        if self.planned is not None:
            found.insert(1 if found[0].plan is None else 0, Variant(self.planned, None, searched=True))
        return tuple(found)


def _where(source: str, key: str) -> str:
    return f"recipe {source}, key {key}"


def _check_value(value, hint, source: str, key: str, limits: Bounds | None = None):
    return checked_value(value, hint, _where(source, key), key.rsplit(".", 1)[-1], limits, error=EdgeError)


def _check_keys(mapping: dict, allowed, source: str, where: str) -> None:
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            raise EdgeError(f"recipe {source}: unknown key {where}{key!r}",
                            expected=f"one of {', '.join(allowed)}",
                            found=f"did you mean {close[0]!r}?" if close else None,
                            fix="remove or rename the key (`edge pipeline --print-recipe` lists every key)")


def _checked_fields(cls, mapping: dict, source: str, prefix: str) -> dict:
    """``mapping``'s values checked against the fields of dataclass ``cls``: names, types, ranges."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    _check_keys(mapping, list(fields), source, prefix)
    return {k: _check_value(v, hints[k], source, prefix + k, bounds(fields[k])) for k, v in mapping.items()}


def _build(key: str, mapping, source: str):
    cls = section_type(key)
    if mapping is None:
        return cls()
    if not isinstance(mapping, dict):
        raise EdgeError(f"{_where(source, key)} is not a mapping", expected="key: value lines under it",
                        found=repr(mapping))
    return cls(**_checked_fields(cls, mapping, source, f"{key}."))


def _variant(index: int, entry, source: str) -> Variant:
    key = f"variants[{index}]"
    if isinstance(entry, str):
        entry = {"plan": entry}
    if not isinstance(entry, dict):
        raise EdgeError(f"{_where(source, key)} is not a variant", expected="a mapping with name and plan",
                        found=repr(entry))
    _check_keys(entry, ("name", "plan"), source, f"{key}.")
    plan_text = entry.get("plan")
    plan = None
    if plan_text is not None:
        from edge.compress.plan import parse_plan

        plan_text = _check_value(plan_text, str, source, f"{key}.plan")
        try:
            plan = str(parse_plan(plan_text))
        except EdgeError as e:
            raise e.at(_where(source, f"{key}.plan"),
                       default_fix="see `edge compress --help` for the plan grammar") from e
    name = entry.get("name")
    if name is None:
        name = "original" if plan is None else re.sub(r"[^A-Za-z0-9._-]+", "-", plan).strip("-.")
    name = _check_value(name, str, source, f"{key}.name")
    if not NAME_PATTERN.match(name):
        raise EdgeError(f"{_where(source, f'{key}.name')} is not a usable folder name", found=repr(name),
                        expected="letters, digits, '.', '_' and '-' (it names the variant's output folder)")
    return Variant(name, plan)


def _resolve_path(value: str | None, base: Path | None) -> str | None:
    if value is None or value in NAMED_DATA or base is None or Path(value).expanduser().is_absolute():
        return value
    return str(base / Path(value).expanduser())


def _img_size(value, source: str) -> int | tuple[int, int]:
    from edge.models.img_size import parse_img_size  # the models package imports torch: only when asked

    try:
        return parse_img_size(value)
    except EdgeError as e:
        raise EdgeError(f"{_where(source, 'img_size')}: {e.what}", expected=e.expected, found=e.found,
                        fix=e.fix) from None


def parse_recipe(document, source: str = BUILTIN, base: Path | None = None) -> Recipe:
    """Check a loaded YAML document and build the :class:`Recipe` (relative paths against ``base``)."""
    if not isinstance(document, dict):
        raise EdgeError(f"recipe {source} is not a mapping of keys", expected="model:, data:, variants: ...",
                        found=type(document).__name__, fix="start from `edge pipeline --print-recipe`")
    hints = typing.get_type_hints(Recipe)
    fields = {f.name: f for f in dataclasses.fields(Recipe) if f.name != "source"}
    _check_keys(document, list(fields), source, "")
    if not document.get("variants"):
        raise EdgeError(f"recipe {source} lists no variants", expected="variants: [{name: original}, ...]",
                        fix="add a `variants:` list (`edge pipeline --print-recipe` shows one)")
    entries = document["variants"]
    if not isinstance(entries, list):
        raise EdgeError(f"{_where(source, 'variants')} is not a list", expected="- name: ...\\n  plan: ...")
    variants = tuple(_variant(i, entry, source) for i, entry in enumerate(entries))
    seen: dict[str, int] = {}
    for i, variant in enumerate(variants):
        if variant.name in seen:
            raise EdgeError(f"recipe {source}: variants[{seen[variant.name]}] and variants[{i}] are both named "
                            f"{variant.name!r}", fix="give every variant its own name")
        seen[variant.name] = i
    values: dict[str, typing.Any] = {}
    for key, value in document.items():
        if key == "variants":
            continue
        if key == "img_size":
            values[key] = None if value is None else _img_size(value, source)
            continue
        if key in OPTIONAL and value is None:
            values[key] = None
            continue
        values[key] = _build(key, value, source) if key in SECTIONS else \
            _check_value(value, hints[key], source, key, bounds(fields[key]))
    for key in ("weights", "data", "fallback_data"):
        if key in values:
            values[key] = _resolve_path(values[key], base)
    if values.get("plan") is not None and values["plan"].table is not None:
        values["plan"] = dataclasses.replace(values["plan"], table=_resolve_path(values["plan"].table, base))
    recipe = Recipe(variants=variants, source=source, **values)
    check_model_name(recipe)
    check_weights(recipe)
    check_stages(recipe)
    return recipe


def _one_of(value: str, allowed, source: str, key: str) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), list(allowed), n=1)
        raise EdgeError(f"{_where(source, key)}: {value!r} is not one of its choices",
                        expected=f"one of {', '.join(allowed)}", found=f"did you mean {close[0]!r}?" if close else None)


def check_stages(recipe: Recipe) -> None:
    """The optional sections against each other and the variants: names, backends, modes, precisions."""
    from edge.latency import orin

    source = recipe.source
    names = [v.name for v in recipe.variants]
    plan = recipe.plan
    if plan is not None:
        if not NAME_PATTERN.match(plan.name):
            raise EdgeError(f"{_where(source, 'plan.name')} is not a usable folder name", found=repr(plan.name),
                            expected="letters, digits, '.', '_' and '-' (it names the planned variant's folder)")
        if plan.name in names:
            raise EdgeError(f"recipe {source}: plan.name and variants[{names.index(plan.name)}] are both named "
                            f"{plan.name!r}", fix="give the planned variant its own name (plan.name)")
        _one_of(plan.backend, ("estimate", "onnxruntime", "tensorrt"), source, "plan.backend")
        if plan.backend == "estimate":
            _one_of(plan.power_mode, tuple(orin.MODES), source, "plan.power_mode")
            _one_of(plan.precision, orin.PRECISIONS, source, "plan.precision")
        elif plan.backend == "tensorrt" and plan.table is None:
            raise EdgeError(f"{_where(source, 'plan.backend')}: tensorrt without a table",
                            expected="plan.table: a latency table measured on the device (edge deploy "
                                     "--latency-table)", fix="set plan.table, or plan.backend: estimate")
        if plan.table is not None and not Path(plan.table).expanduser().is_file():
            raise EdgeError(f"{_where(source, 'plan.table')}: {plan.table} does not exist",
                            expected="a latency table file", fix="fix the path (relative to the recipe's folder)")
    every = [v.name for v in recipe.run_variants()]
    for key, allowed in (("precision", ("fp16", "int8")), ("bundle", ("fp32", "fp16", "int8"))):
        section = getattr(recipe, key)
        if section is None:
            continue
        for i, name in enumerate(section.variants):
            _one_of(name, every, source, f"{key}.variants[{i}]")
        for i, precision in enumerate(section.precisions):
            _one_of(precision, allowed, source, f"{key}.precisions[{i}]")
    if recipe.profile.processes is not None and recipe.profile.processes > recipe.profile.sessions:
        raise EdgeError(f"{_where(source, 'profile.processes')}: {recipe.profile.processes} processes for "
                        f"{recipe.profile.sessions} session sets", expected="at most profile.sessions (each process "
                        "runs one or more whole session sets)", fix="lower profile.processes or raise profile.sessions")
    if recipe.estimate is not None:
        _one_of(recipe.estimate.power_mode, tuple(orin.MODES), source, "estimate.power_mode")
        _one_of(recipe.estimate.precision, orin.PRECISIONS, source, "estimate.precision")


def check_model_name(recipe: Recipe) -> None:
    from edge.models import parse_model_spec

    try:
        parse_model_spec(recipe.model)
    except EdgeError as e:
        raise e.at(_where(recipe.source, "model")) from e


def check_weights(recipe: Recipe) -> None:
    if recipe.weights is not None and not Path(recipe.weights).expanduser().is_file():
        raise EdgeError(f"{_where(recipe.source, 'weights')}: {recipe.weights} does not exist",
                        expected="a .safetensors file or a weights-only torch state dict",
                        fix="fix the path (relative paths are read from the recipe's folder)")


def _yaml_load(text: str):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (YAML would keep the last silently)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            keys.add(key)
        return loader.construct_mapping(node, deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def named_recipes() -> dict[str, Path]:
    """The recipes shipped beside the built-in one, by name (``spans``: the three-span recipe)."""
    return {p.stem: p for p in sorted(DEFAULT_RECIPE.parent.glob("*.yaml"))}


def named_recipe(name: str) -> Path:
    """The shipped recipe ``name`` (``default``: the built-in one)."""
    found = named_recipes()
    if name not in found:
        raise EdgeError(f"recipe {name!r} is neither a file nor a shipped recipe",
                        expected=f"a YAML recipe file, or one of {', '.join(found)}",
                        fix="check the path, or start from `edge pipeline --print-recipe > recipe.yaml`")
    return found[name]


def load_recipe(path: str | Path | None = None) -> Recipe:
    """Read and check a recipe file; ``None`` reads the built-in default; a name without a file of that
    name, a shipped recipe (:func:`named_recipes`)."""
    import yaml

    if path is None or str(path) == "default":
        return parse_recipe(_yaml_load(DEFAULT_RECIPE.read_text()), BUILTIN, None)
    if not Path(path).expanduser().exists() and str(path) in named_recipes():
        named = named_recipe(str(path))
        return parse_recipe(_yaml_load(named.read_text()), f"<shipped recipe {named.stem}>", None)
    path = Path(path).expanduser()
    if not path.is_file():
        raise EdgeError(f"recipe {path} does not exist", expected="a YAML recipe file, or a shipped recipe ("
                        f"{', '.join(named_recipes())})",
                        fix="check the path, or start from `edge pipeline --print-recipe > recipe.yaml`")
    try:
        document = _yaml_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise EdgeError(f"recipe {path} is not valid YAML{where}", found=str(getattr(e, "problem", e)),
                        fix="fix the YAML (indentation, a missing ':', a key given twice)") from e
    except (OSError, UnicodeDecodeError) as e:
        raise EdgeError(f"recipe {path} cannot be read", found=str(e)) from e
    return parse_recipe(document, str(path), path.parent)


def default_recipe_text(name: str = "default") -> str:
    """The text of the built-in recipe, or of the shipped recipe ``name``."""
    return named_recipe(name).read_text()


def with_overrides(recipe: Recipe, *, data: str | None = None, threads: int | None = None,
                   full_split: bool = False) -> Recipe:
    """The recipe with command-line overrides: ``--data`` (no fallback then), ``--threads`` and ``--full-split``
    (every graph's accuracy on the whole test split: ``evaluate.subset`` and ``precision.test_images`` null)."""
    changes: dict = {}
    if full_split:
        changes["evaluate"] = dataclasses.replace(recipe.evaluate, subset=None)
        if recipe.precision is not None:
            changes["precision"] = dataclasses.replace(recipe.precision, test_images=None)
    if data is not None:
        changes.update(data=data, fallback_data=None)
    if threads is not None:
        if threads < 1:
            raise EdgeError(f"--threads {threads}", expected="at least 1")
        changes["threads"] = threads
    return dataclasses.replace(recipe, **changes)
