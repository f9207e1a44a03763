"""One source for configuration: the library configs give the recipe's keys, types, defaults and ranges,
and the CLI's defaults."""

import dataclasses
import typing
from dataclasses import dataclass

import pytest

from edge.cli import build_parser
from edge.config import Bounds, bounds, option
from edge.errors import EdgeError, InternalError
from edge.pipeline import load_recipe
from edge.pipeline.recipe import SECTIONS, Section, parse_recipe, section_type

ONE_VARIANT = {"variants": [{"name": "original"}]}

# Where the pipeline's default differs from the library's (and so from the CLI's): the recipe's own
# default, stated in default.yaml. Anything else differing is a second source of a default.
RECIPE_OWN_DEFAULTS = {
    ("evaluate", "batch_size"): (64, 256),
    # the main job fits 5 minutes on 2 cores: a smaller search and calibration; the Orin Nano as the target
    ("plan", "budget"): (0.5, None), ("plan", "backend"): ("estimate", None), ("plan", "precision"): ("fp16", None),
    ("plan", "power_mode"): ("MAXN_SUPER", None), ("plan", "batch"): (1, None), ("plan", "samples"): (128, 512),
    ("plan", "holdout"): (128, 512), ("plan", "min_step"): (0.02, 0.0), ("precision", "samples"): (200, 500), ("bundle", "samples"): (200, 500),
    ("bundle", "precisions"): (("fp32", "fp16", "int8"), ("fp32", "fp16")),
}


def _library_field(section: Section, name: str) -> tuple[dataclasses.Field, object]:
    for config in section.library_configs():
        fields = {f.name: f for f in dataclasses.fields(config)}
        if name in fields:
            return fields[name], typing.get_type_hints(config)[name]
    raise KeyError(name)


@pytest.mark.parametrize("key", sorted(SECTIONS))
def test_recipe_sections_are_fields_of_the_library_configs(key):
    section = SECTIONS[key]
    own = {f.name for f in dataclasses.fields(section.own)} if section.own else set()
    made = section_type(key)
    assert [f.name for f in dataclasses.fields(made)] == list(section.keys)
    hints = typing.get_type_hints(made)
    for derived in dataclasses.fields(made):
        if derived.name in own:
            continue
        library, hint = _library_field(section, derived.name)
        assert hints[derived.name] == hint and bounds(derived) == bounds(library), derived.name
        expected = RECIPE_OWN_DEFAULTS.get((key, derived.name), (library.default, library.default))
        assert (derived.default, library.default) == expected, f"{key}.{derived.name}"


def test_the_recipes_own_defaults_are_the_declared_ones_and_default_yaml_states_them():
    declared = {(key, name): (value, _library_field(SECTIONS[key], name)[0].default)
                for key, section in SECTIONS.items() for name, value in section.defaults.items()}
    assert declared == RECIPE_OWN_DEFAULTS
    # default.yaml ("the values below are the defaults") says what a recipe without the key gets
    from edge.pipeline.recipe import OPTIONAL

    # an optional section given empty gets the values default.yaml states for it
    implicit = parse_recipe({**ONE_VARIANT, **{key: {} for key in OPTIONAL},
                             "precision": {"variants": ["original"]}, "bundle": {"variants": ["original"]}}).as_dict()
    stated = load_recipe(None).as_dict()
    for record in (implicit, stated):
        del record["variants"], record["source"], record["precision"]["variants"], record["bundle"]["variants"]
    assert implicit == stated
    assert parse_recipe(ONE_VARIANT).plan is None   # left out: not run
    assert stated["profile"]["iterations"] is None and stated["evaluate"]["batch_size"] == 64


def test_every_numeric_recipe_key_has_a_range():
    ranged, unranged = set(), set()
    for key in SECTIONS:
        hints = typing.get_type_hints(section_type(key))
        for f in dataclasses.fields(section_type(key)):
            if hints[f.name] in (int, float, int | None, float | None):
                (ranged if bounds(f) is not None else unranged).add(f"{key}.{f.name}")
    assert unranged == set()
    assert ranged == {"calibration.samples", "calibration.holdout", "analysis.samples", "export.batch", "export.opset",
                      "evaluate.batch_size", "evaluate.samples", "evaluate.subset", "profile.warmup",
                      "profile.iterations",
                      "profile.rounds", "profile.sessions", "profile.processes", "profile.turn_ms",
                      "profile.aa_tolerance",
                      "plan.budget", "plan.batch", "plan.samples", "plan.holdout", "plan.shortlist", "plan.refresh",
                      "plan.min_step",
                      "precision.samples", "precision.gate_images", "precision.static_gate_images", "precision.test_images",
                      "estimate.batch",
                      "bundle.samples", "bundle.gate_images"}


REFUSED = {
    "iterations below 1": ({"profile": {"iterations": 0}}, "key profile.iterations is out of range", ">= 1"),
    "warmup below 0": ({"profile": {"warmup": -1}}, "key profile.warmup is out of range", ">= 0"),
    "holdout not in (0, 1)": ({"calibration": {"holdout": 1}}, "key calibration.holdout is out of range",
                              "0 < holdout < 1"),
    "opset too old": ({"export": {"opset": 16}}, "key export.opset is out of range", "17 <= opset <= 20"),
    "evaluation subset of 0": ({"evaluate": {"samples": 0}}, "key evaluate.samples is out of range", ">= 1"),
    "threads below 1": ({"threads": 0}, "key threads is out of range", "1 <= threads <= 1024"),
    "wrong type": ({"export": {"batch": 1.5}}, "key export.batch has the wrong type", "an integer"),
    "library field the pipeline sets": ({"export": {"dynamic_batch": True}}, "unknown key export.'dynamic_batch'",
                                        "one of batch, opset"),
    "misspelt key": ({"profile": {"iters": 5}}, "unknown key profile.'iters'", "did you mean 'iterations'"),
    "no processes": ({"profile": {"processes": 0}}, "key profile.processes is out of range", ">= 1"),
    "more processes than session sets": ({"profile": {"sessions": 2, "processes": 3}},
                                         "key profile.processes: 3 processes for 2 session sets",
                                         "at most profile.sessions", "lower profile.processes or raise"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_recipe_values_are_checked_against_the_library_fields(case):
    document, *needles = REFUSED[case]
    with pytest.raises(EdgeError) as error:
        parse_recipe({**ONE_VARIANT, **document}, "r.yaml")
    assert "recipe r.yaml" in str(error.value)
    for needle in needles:
        assert needle in str(error.value)


@dataclass
class ToyConfig:
    plan: str  # set by the pipeline, not a recipe key
    rate: float = option(0.5, above=0.0, below=1.0)
    steps: int = option(3, minimum=2)
    name: str = "toy"


def test_a_section_follows_its_library_config(monkeypatch):
    """Types, defaults and ranges are read from the config: change the config and the recipe follows."""
    monkeypatch.setitem(SECTIONS, "toy", Section(f"{__name__}:ToyConfig", ("steps", "rate"), defaults={"rate": 0.25}))
    section_type.cache_clear()
    try:
        made = section_type("toy")
        assert made() == made(steps=3, rate=0.25)
        assert bounds(dataclasses.fields(made)[0]) == Bounds(minimum=2)
        from edge.pipeline.recipe import _build

        assert _build("toy", {"steps": 7}, "r.yaml") == made(steps=7, rate=0.25)
        with pytest.raises(EdgeError, match="key toy.steps is out of range"):
            _build("toy", {"steps": 1}, "r.yaml")
        with pytest.raises(EdgeError, match=r"expected: 0 < rate < 1"):
            _build("toy", {"rate": 1.0}, "r.yaml")
        with pytest.raises(EdgeError, match=r"unknown key toy.'name'"):
            _build("toy", {"name": "x"}, "r.yaml")
    finally:
        section_type.cache_clear()


def test_a_section_naming_a_missing_field_fails_loudly(monkeypatch):
    monkeypatch.setitem(SECTIONS, "toy", Section(f"{__name__}:ToyConfig", ("steps", "warp")))
    section_type.cache_clear()
    try:
        with pytest.raises(InternalError, match="has no field 'warp'"):
            section_type("toy")
    finally:
        section_type.cache_clear()


def _defaults(*argv: str) -> dict:
    return vars(build_parser().parse_args(list(argv)))


@pytest.fixture
def model_files(tmp_path, monkeypatch):
    """m.onnx in the working directory: the CLI checks at parse time that a model file exists."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx").write_bytes(b"")


def test_cli_defaults_are_the_library_defaults(model_files):
    from edge.analysis.analyze import AnalysisConfig
    from edge.check.accuracy import EvaluateConfig
    from edge.check.compare import Tolerance
    from edge.compress import CompressConfig
    from edge.export import ExportConfig
    from edge.precision.int8 import Int8Config
    from edge.profile import ProfileConfig
    from edge.trt.builder import BuildConfig

    profile = _defaults("profile", "m.onnx")
    assert (profile["warmup"], profile["iterations"]) == (ProfileConfig().warmup, ProfileConfig().iterations)
    export = _defaults("export", "m", "--out", "m.onnx")
    assert (export["batch"], export["opset"]) == (ExportConfig().batch, ExportConfig().opset)
    assert _defaults("eval", "m")["batch_size"] == EvaluateConfig().batch_size
    compress, library = _defaults("compress", "m", "--plan", "linear:1-2", "--out", "o"), CompressConfig("linear:1-2")
    assert {k: compress[k] for k in ("data", "samples", "seed", "holdout")} == \
        {k: getattr(library, k) for k in ("data", "samples", "seed", "holdout")}
    analyze, library = _defaults("analyze", "m", "--out", "o"), AnalysisConfig()
    assert {k: analyze[k] for k in ("data", "samples", "seed", "batch_size")} == \
        {k: getattr(library, k) for k in ("data", "samples", "seed", "batch_size")}
    quantize, library = _defaults("quantize", "m.onnx", "--precision", "int8", "--out", "q.onnx"), Int8Config()
    assert {k: quantize[k] for k in ("data", "samples", "seed", "method", "percentile")} == \
        {k: getattr(library, k) for k in ("data", "samples", "seed", "method", "percentile")}
    verify = _defaults("verify", "a", "b")
    assert (verify["max_abs"], verify["rel_l2"]) == (Tolerance().max_abs, Tolerance().rel_l2)
    build, library = _defaults("build", "m.onnx", "--out", "m.engine"), BuildConfig()
    assert (build["precision"], build["workspace"], build["opt_level"], build["samples"]) == \
        (library.precision, library.workspace_mib, library.optimization_level, library.calibration_samples)


def test_cli_reads_the_library_default_and_help_shows_it(monkeypatch, capsys, model_files):
    from edge.profile import ProfileConfig

    monkeypatch.setattr(ProfileConfig, "iterations", 123)  # the class attribute argparse reads
    assert _defaults("profile", "m.onnx")["iterations"] == 123
    with pytest.raises(SystemExit):
        build_parser().parse_args(["profile", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "timed iterations (at least) (1 <= N <= 100000000; default: 123)" in shown


def test_importing_the_recipe_module_loads_no_library_code():
    """The library configs are imported when a recipe is read, not when the CLI's --help reads STEPS."""
    import subprocess
    import sys

    code = "import sys, edge.pipeline.recipe; print(sorted({'torch', 'onnx', 'edge.export'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
