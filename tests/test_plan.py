import pytest

from edge.compress.plan import AutoStep, SpanStep, parse_plan
from edge.errors import EdgeError


def test_parse_and_canonical_form():
    plan = parse_plan(" affine:9-11:ridge=0.0001 , linear:2-3 ")
    assert [str(s) for s in plan.steps] == ["linear:2-3", "affine:9-11:ridge=0.0001"]
    assert plan.spans[1].blocks == (10, 11) and plan.spans[1].ridge == 1e-4
    assert str(parse_plan(str(plan))) == str(plan)
    assert parse_plan("linear:-1-0").spans[0] == SpanStep("linear", -1, 0)
    auto = parse_plan("auto-linear:3,skip:0-1")
    assert isinstance(auto.steps[-1], AutoStep) and auto.steps[-1].count == 3 and not auto.is_resolved


def test_adjacent_spans_are_not_overlapping():
    plan = parse_plan("linear:8-9,linear:9-10").validate(12)
    assert [s.blocks for s in plan.spans] == [(9,), (10,)]


@pytest.mark.parametrize("text,message", [
    ("linear:2-5,affine:4-6", "overlap"),
    ("linear:3-3", "S >= E"),
    ("linear:5-2", "S >= E"),
    ("linear:2-12", "out of range"),
    ("linear:-2-3", "out of range"),
    ("lineer:2-3", "unknown method 'lineer'"),
    ("linear:2", "has no span"),
    ("linear:a-b", "has no span"),
    ("linear:2-3:ridge=x", "is not a float"),
    ("linear:2-3:gamma=1", "unknown option 'gamma'"),
    ("linear:2-3:prefix=mine", "prefix=shared or prefix=own"),
    ("linear:2-3:ridge=-1", "negative"),
    ("auto-linear:0", "positive block count"),
    ("auto-linear:2,auto-affine:2", "auto steps"),
    ("linear:0-10,auto-linear:3", "2 are left"),
    ("", "empty"),
])
def test_bad_plans_are_explained(text, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(text).validate(12)


def test_unknown_method_suggests_close_name():
    with pytest.raises(EdgeError) as e:
        parse_plan("afine:2-3")
    assert "affine" in str(e.value)
