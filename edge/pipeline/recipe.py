"""Pipeline recipes: a YAML file naming the model, the data and the variants to build and measure.

A recipe is read once, checked completely (unknown keys, types, ranges, plan syntax, model names,
files) and turned into frozen dataclasses; every error names the recipe file and the key. The
built-in default (``default.yaml`` beside this module) documents every key.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from edge.errors import EdgeError

DEFAULT_RECIPE = Path(__file__).with_name("default.yaml")
BUILTIN = "<built-in default recipe>"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
NAMED_DATA = ("fmnist", "fmnist-mini")


@dataclass(frozen=True)
class CalibrationSettings:
    samples: int = 500
    holdout: float = 0.2


@dataclass(frozen=True)
class AnalysisSettings:
    enabled: bool = True
    samples: int = 500


@dataclass(frozen=True)
class ExportSettings:
    batch: int = 1
    opset: int = 17


@dataclass(frozen=True)
class EvaluateSettings:
    batch_size: int = 500
    samples: int | None = None


@dataclass(frozen=True)
class ProfileSettings:
    warmup: int = 20
    iterations: int = 300


@dataclass(frozen=True)
class Variant:
    name: str
    plan: str | None = None  # canonical plan text; None: the model as it is


@dataclass(frozen=True)
class Recipe:
    variants: tuple[Variant, ...]
    model: str = "fmnist-deit-tiny"
    weights: str | None = None
    img_size: int | None = None
    data: str = "fmnist"
    fallback_data: str | None = "fmnist-mini"
    seed: int = 0
    threads: int = 2
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    profile: ProfileSettings = field(default_factory=ProfileSettings)
    source: str = BUILTIN  # where the recipe was read from (not a recipe key)

    def as_dict(self) -> dict:
        record = dataclasses.asdict(self)
        record["variants"] = [dataclasses.asdict(v) for v in self.variants]
        return record


SECTIONS = {"calibration": CalibrationSettings, "analysis": AnalysisSettings, "export": ExportSettings,
            "evaluate": EvaluateSettings, "profile": ProfileSettings}
# Lower bounds of numeric keys (inclusive); holdout is checked on its own (0 < h < 1).
MINIMUM = {"samples": 1, "batch": 1, "batch_size": 1, "iterations": 1, "warmup": 0, "threads": 1, "seed": 0,
           "img_size": 1, "opset": 17}


def _where(source: str, key: str) -> str:
    return f"recipe {source}, key {key}"


def _type_name(hint) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[base]
    return f"{name} or null" if type(None) in typing.get_args(hint) else name


def _check_value(value, hint, source: str, key: str):
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if value is None and optional:
        return None
    ok = (base is bool and isinstance(value, bool)) or \
         (base is int and isinstance(value, int) and not isinstance(value, bool)) or \
         (base is float and isinstance(value, (int, float)) and not isinstance(value, bool)) or \
         (base is str and isinstance(value, str) and value.strip() != "")
    if not ok:
        raise EdgeError(f"{_where(source, key)} has the wrong type", expected=_type_name(hint),
                        found=f"{value!r} ({type(value).__name__})")
    leaf = key.rsplit(".", 1)[-1]
    if base in (int, float) and leaf in MINIMUM and value < MINIMUM[leaf]:
        raise EdgeError(f"{_where(source, key)} is out of range", expected=f">= {MINIMUM[leaf]}", found=str(value))
    if leaf == "holdout" and not 0.0 < value < 1.0:
        raise EdgeError(f"{_where(source, key)} is out of range", expected="0 < holdout < 1", found=str(value))
    return float(value) if base is float else value


def _check_keys(mapping: dict, allowed, source: str, where: str) -> None:
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            raise EdgeError(f"recipe {source}: unknown key {where}{key!r}",
                            expected=f"one of {', '.join(allowed)}",
                            found=f"did you mean {close[0]!r}?" if close else None,
                            fix="remove or rename the key (`edge pipeline --print-recipe` lists every key)")


def _build(cls, mapping, source: str, prefix: str):
    if mapping is None:
        return cls()
    if not isinstance(mapping, dict):
        raise EdgeError(f"{_where(source, prefix.rstrip('.'))} is not a mapping",
                        expected="key: value lines under it", found=repr(mapping))
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    _check_keys(mapping, names, source, prefix)
    return cls(**{k: _check_value(v, hints[k], source, prefix + k) for k, v in mapping.items()})


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


def parse_recipe(document, source: str = BUILTIN, base: Path | None = None) -> Recipe:
    """Check a loaded YAML document and build the :class:`Recipe` (relative paths against ``base``)."""
    if not isinstance(document, dict):
        raise EdgeError(f"recipe {source} is not a mapping of keys", expected="model:, data:, variants: ...",
                        found=type(document).__name__, fix="start from `edge pipeline --print-recipe`")
    hints = typing.get_type_hints(Recipe)
    allowed = [f.name for f in dataclasses.fields(Recipe) if f.name != "source"]
    _check_keys(document, allowed, source, "")
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
    values = {}
    for key, value in document.items():
        if key == "variants":
            continue
        values[key] = _build(SECTIONS[key], value, source, f"{key}.") if key in SECTIONS else \
            _check_value(value, hints[key], source, key)
    for key in ("weights", "data", "fallback_data"):
        if key in values:
            values[key] = _resolve_path(values[key], base)
    recipe = Recipe(variants=variants, source=source, **values)
    check_model_name(recipe)
    check_weights(recipe)
    return recipe


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


def load_recipe(path: str | Path | None = None) -> Recipe:
    """Read and check a recipe file; ``None`` reads the built-in default."""
    import yaml

    if path is None:
        return parse_recipe(_yaml_load(DEFAULT_RECIPE.read_text()), BUILTIN, None)
    path = Path(path).expanduser()
    if not path.is_file():
        raise EdgeError(f"recipe {path} does not exist", expected="a YAML recipe file",
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


def default_recipe_text() -> str:
    return DEFAULT_RECIPE.read_text()


def with_overrides(recipe: Recipe, *, data: str | None = None, threads: int | None = None) -> Recipe:
    """The recipe with command-line overrides: ``--data`` (no fallback then) and ``--threads``."""
    changes: dict = {}
    if data is not None:
        changes.update(data=data, fallback_data=None)
    if threads is not None:
        if threads < 1:
            raise EdgeError(f"--threads {threads}", expected="at least 1")
        changes["threads"] = threads
    return dataclasses.replace(recipe, **changes)
