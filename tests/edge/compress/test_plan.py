import pytest

from edge.compress.methods.block_approximation.module import AutoStep, SpanStep
from edge.compress.plan import parse_plan
from edge.errors import EdgeError


def test_parse_and_canonical_form():
    plan = parse_plan(" affine:9-11:ridge=0.0001 , linear:2-3 ")
    assert [str(s) for s in plan.steps] == ["linear:2-3", "affine:9-11:ridge=0.0001"]
    second = plan.steps_of("block-approximation")[1]
    assert second.blocks == (10, 11) and second.ridge == 1e-4
    assert str(parse_plan(str(plan))) == str(plan)
    assert parse_plan("linear:-1-0").steps[0] == SpanStep("linear", -1, 0)
    auto = parse_plan("auto-linear:3,skip:0-1")
    assert isinstance(auto.steps[-1], AutoStep) and auto.steps[-1].count == 3 and not auto.is_resolved


def test_adjacent_spans_are_not_overlapping():
    plan = parse_plan("linear:8-9,linear:9-10").validate(12)
    assert [s.blocks for s in plan.steps] == [(9,), (10,)]


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
    ("linear:2-3:ridge=-1", r"ridge=-1 .* out of range\n.*expected: ridge >= 0"),
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


def test_dwconv_steps_parse_to_canonical_form():
    from edge.compress.methods.dwconv.module import DWConvStep

    plan = parse_plan("dwconv:auto=6:init=lsq:k=3:variant=ensembled, linear:9-10")
    step = plan.steps_of("dwconv")[0]
    assert isinstance(step, DWConvStep) and step.auto == 6 and not step.scattered and not plan.is_resolved
    assert str(plan) == "linear:9-10,dwconv:auto=6:init=lsq:k=3:variant=ensembled"
    assert str(parse_plan(str(plan))) == str(plan)
    blocks = parse_plan("dwconv:blocks=7+2+5").steps_of("dwconv")[0]
    assert blocks.blocks == (2, 5, 7) and str(blocks) == "dwconv:blocks=2+5+7" and blocks.is_resolved
    assert blocks.option("k") == 3 and blocks.option("init") == "lsq" and blocks.option("prefix") == "pool"
    heads = parse_plan("dwconv:heads=auto=4:order=highest").steps_of("dwconv")[0]
    assert heads.scattered and heads.auto == 4 and heads.option("order") == "highest"
    assert str(heads) == "dwconv:heads=auto=4:order=highest"
    explicit = parse_plan("dwconv:heads=5.3+2.0").steps_of("dwconv")[0]
    assert explicit.heads == ((2, 0), (5, 3)) and explicit.touched_blocks == (2, 5)
    # block-approximation plans are unchanged
    assert parse_plan("linear:2-3").is_resolved and not parse_plan("linear:2-3").steps_of("dwconv")


@pytest.mark.parametrize("text,message", [
    ("dwconv:blocks=1:k=4", "must be odd"),
    ("dwconv:blocks=1:init=random", "init=gaussian or init=mean or init=lsq"),
    ("dwconv:blocks=1:variant=dense", "variant=unensembled"),
    ("dwconv:blocks=1:prefix=own", "prefix=mean or prefix=pool or prefix=attend or prefix=drop"),
    ("dwconv:blocks=1:order=middle", "order=lowest or order=highest"),
    ("dwconv:blocks=1:steps=3", "unknown option 'steps'"),
    ("dwconv:blocks=12", "out of range"),
    ("dwconv:blocks=-1", "out of range"),
    ("dwconv:blocks=x", "does not say which attention"),
    ("dwconv:2+5", "does not say which attention"),
    ("dwconv:auto=0", "positive block count"),
    ("dwconv:heads=auto=0", "positive head count"),
    ("dwconv:auto=2,dwconv:heads=auto=3", "automatic dwconv steps"),
    ("dwconv:blocks=2+3,dwconv:blocks=3", "both replace attention in block 3"),
    ("linear:1-3,dwconv:blocks=3", "which a span removes"),
    ("linear:0-10,dwconv:auto=3", "3 blocks, 2 are left"),
])
def test_bad_dwconv_steps_are_explained(text, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(text).validate(12)
