"""EdgeError.at locates an error (a recipe key, a file) and keeps the rest of it."""

import pytest

from edge.errors import EdgeError


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
