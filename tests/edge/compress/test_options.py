"""Method options: one typed dataclass per method, parsed in one place; method folders found automatically."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import pytest

from edge.cli import build_parser
from edge.compress.methods import FOLDERS, discover
from edge.compress.options import option_specs
from edge.compress.plan import parse_plan, plan_grammar
from edge.compress.registry import method_named, methods, registered, unregister_method
from edge.errors import EdgeError

from .toy_method import GainMethod


@pytest.mark.parametrize("plan,option,expected,fix", [
    ("affine:2-3:ridge=-1", "ridge=-1", "ridge >= 0", "ridge=0.0"),
    ("mlp:2-3:steps=0", "steps=0", "steps >= 1", "steps=300"),
    ("attnrm:auto=2:select=random:seed=-3", "seed=-3", "seed >= 0", "seed=0"),
    ("attnrm:blocks=1:init=zero", "init=zero", "init=identity or init=affine", "init=identity"),
    ("dwconv:blocks=1:k=0", "k=0", "k >= 1", "k=3"),
    ("dwconv:blocks=1:prefix=own", "prefix=own", "prefix=mean or prefix=pool or prefix=attend or prefix=drop",
     "prefix=pool"),
    ("wpac:keep=1.5", "keep=1.5", "0 < keep <= 1", "keep=1.0"),
    ("wpac:macs=0", "macs=0", "0 < macs <= 1", "give macs a value with 0 < macs <= 1"),
    ("wpac:latency-ms=-1:table=t.json", "latency-ms=-1", "0 < latency-ms <= 1000000000", "latency-ms a value"),
    ("wpac:keep=0.5:align=0", "align=0", "align >= 1", "align=16"),
])
def test_a_bad_option_value_names_the_option_the_range_and_the_fix(plan, option, expected, fix):
    with pytest.raises(EdgeError) as e:
        parse_plan(plan)
    assert f"option {option} in plan step {plan!r}" in e.value.what
    assert e.value.expected == expected
    assert fix in e.value.fix


def test_a_value_of_the_wrong_type_names_the_type_and_the_range():
    with pytest.raises(EdgeError) as e:
        parse_plan("dwconv:blocks=1:k=three")
    assert "option k=three" in e.value.what and "is not an int" in e.value.what
    assert e.value.expected == "k >= 1" and "k=3" in e.value.fix


def test_every_method_declares_its_options_and_the_help_shows_each_with_its_range():
    grammar = plan_grammar()
    for method in methods():
        assert dataclasses.is_dataclass(method.options), method.name
        for key, spec in option_specs(method.options).items():
            assert spec.help() in grammar, (method.name, key)
    assert "k=INT (k >= 1; 3 when absent)" in grammar
    assert "init=gaussian|mean|lsq (lsq when absent)" in grammar
    assert "keep=FLOAT (0 < keep <= 1; 1.0 when absent)" in grammar and "latency-ms=FLOAT" in grammar


def test_compress_help_prints_the_ranges(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compress", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "ridge=FLOAT (ridge >= 0; 0.0001 when absent)" in help_text
    assert "seed=INT (seed >= 0; 0 when absent)" in help_text


def test_a_toy_method_declares_its_options_the_same_way():
    with registered(GainMethod()):
        assert str(parse_plan("gain:blocks=1:value=0.5")) == "gain:blocks=1:value=0.5"
        with pytest.raises(EdgeError) as e:
            parse_plan("gain:blocks=1:value=11")
        assert e.value.expected == "-10 <= value <= 10" and "value=1.0" in e.value.fix
        assert "value=FLOAT (-10 <= value <= 10; 1.0 when absent)" in plan_grammar()


def test_every_built_in_method_is_one_folder_found_without_a_list():
    assert FOLDERS == ("attnrm", "block_approximation", "dwconv", "wpac")
    for method in methods():
        folder = type(method).__module__.removeprefix("edge.compress.methods.").removesuffix(".method")
        assert folder in FOLDERS and type(method).__module__ == f"edge.compress.methods.{folder}.method"
        assert method.options.__module__.startswith(f"edge.compress.methods.{folder}.")  # its options too


def test_a_new_method_folder_registers_itself(tmp_path, monkeypatch):
    package = tmp_path / "more_methods"
    (package / "gain").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "gain" / "__init__.py").write_text('"""A toy method as one folder."""\n')
    (package / "gain" / "method.py").write_text(textwrap.dedent("""
        from edge.compress.registry import register_method
        from tests.edge.compress.toy_method import GainMethod

        register_method(GainMethod())
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert discover("more_methods") == ("gain",)
        assert method_named("toy-gain").keywords == ("gain",)
        assert parse_plan("gain:blocks=1").steps_of("toy-gain")
    finally:
        unregister_method("toy-gain")
        for name in [n for n in sys.modules if n == "more_methods" or n.startswith("more_methods.")]:
            del sys.modules[name]


def test_a_method_folder_without_method_py_is_named(tmp_path, monkeypatch):
    (tmp_path / "half_methods" / "empty").mkdir(parents=True)
    (tmp_path / "half_methods" / "__init__.py").write_text("")
    (tmp_path / "half_methods" / "empty" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ImportError, match="method folder half_methods.empty has no method.py"):
            discover("half_methods")
    finally:
        for name in [n for n in sys.modules if n == "half_methods" or n.startswith("half_methods.")]:
            del sys.modules[name]
