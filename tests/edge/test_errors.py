"""Bad input exits 2 with its message; a bug in edge exits 3 and asks for a report; EdgeError.at locates."""

import pytest

import edge.cli.models
from edge.cli import main
from edge.errors import PLEASE_REPORT, EdgeError, InternalError


def _failing_run(error):
    def run(args):
        raise error

    return run


def test_bad_input_exits_2_with_the_message_only(monkeypatch, capsys):
    error = EdgeError("model 'x' is unknown", expected="a bundled model", fix="run `edge models`")
    monkeypatch.setattr(edge.cli.models, "run", _failing_run(error))
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    assert err == f"edge models: error: {error}\n"
    assert "please report" not in err and "Traceback" not in err


def test_internal_error_exits_3_and_asks_for_a_report(monkeypatch, capsys):
    monkeypatch.setattr(edge.cli.models, "run", _failing_run(InternalError("the plan lost block 3")))
    assert main(["models"]) == 3
    err = capsys.readouterr().err
    assert err == f"edge models: internal error: the plan lost block 3\nedge models: {PLEASE_REPORT}\n"
    assert "please report" in err


def test_an_unexpected_exception_is_a_bug_with_its_traceback(monkeypatch, capsys):
    monkeypatch.setattr(edge.cli.models, "run", _failing_run(KeyError("blocks")))
    assert main(["models"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in run" in err
    assert err.endswith(f"edge models: internal error: KeyError: 'blocks'\nedge models: {PLEASE_REPORT}\n")


def test_interrupt_exits_130(monkeypatch, capsys):
    monkeypatch.setattr(edge.cli.models, "run", _failing_run(KeyboardInterrupt()))
    assert main(["models"]) == 130
    assert capsys.readouterr().err == "edge models: interrupted\n"


def test_internal_error_is_not_bad_input():
    assert not issubclass(InternalError, EdgeError) and InternalError.exit_code == 3 and EdgeError.exit_code == 2


@pytest.mark.parametrize("fix,default_fix,expect_fix", [("re-save it", None, "re-save it"),
                                                        ("re-save it", "see --help", "re-save it"),
                                                        (None, "see --help", "see --help"),
                                                        (None, None, None)])
def test_at_prepends_the_location_and_keeps_the_rest(fix, default_fix, expect_fix):
    cause = EdgeError("plan step 'linaer:1-2' is unknown", expected="linear, affine", found="linaer", fix=fix)
    located = cause.at("recipe r.yaml, key variants[0].plan", default_fix=default_fix)
    assert type(located) is EdgeError and located.__cause__ is cause
    assert located.what == "recipe r.yaml, key variants[0].plan: plan step 'linaer:1-2' is unknown"
    assert (located.expected, located.found, located.fix) == ("linear, affine", "linaer", expect_fix)
    assert str(located) == str(EdgeError(located.what, expected="linear, affine", found="linaer", fix=expect_fix))
    assert str(cause).startswith("plan step") and cause.fix == fix  # the original is left as it was


def test_a_located_error_raised_from_the_original_chains_it():
    with pytest.raises(EdgeError) as caught:
        try:
            raise EdgeError("7 blocks", expected="at most 4")
        except EdgeError as e:
            raise e.at("recipe r.yaml, key variants[1].plan") from e
    assert str(caught.value) == "recipe r.yaml, key variants[1].plan: 7 blocks\n  expected: at most 4"
    assert isinstance(caught.value.__cause__, EdgeError) and caught.value.__cause__.what == "7 blocks"


def test_broken_invariants_are_internal_errors(tmp_path):
    from types import SimpleNamespace

    from edge.analysis.fit import fit_map
    from edge.pipeline.cache import StepCache
    from edge.profile import CpuContention

    with pytest.raises(InternalError, match="before its `with` block ran"):
        CpuContention().result()
    with pytest.raises(InternalError, match="method 'mlp', which has no closed form"):
        fit_map(SimpleNamespace(dim=4), 0, 1, "mlp")
    with pytest.raises(InternalError, match="pipeline step export did not write its output"):
        StepCache().run(tmp_path, "export", {"x": 1}, lambda: {}, ("missing.onnx",))
