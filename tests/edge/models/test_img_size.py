"""Input sizes: ``N`` or ``HxW`` wherever a size is taken (issue 13, finding 16)."""

import pytest

from edge.errors import EdgeError
from edge.models import create_model, data_config, model_info, parse_img_size

TINY = "timm:vit_tiny_patch16_224,patch_size=7,in_chans=1,num_classes=10,depth=1,embed_dim=32,num_heads=2"


@pytest.mark.parametrize("value,expected", [("224", 224), ("224x320", (224, 320)), (" 224X320 ", (224, 320)),
                                            ("28x28", 28), (28, 28), ((28, 42), (28, 42)), ([28, 42], (28, 42)),
                                            ([28], 28)])
def test_sizes_parse_to_one_form(value, expected):
    """A square size is one integer, a non-square one (rows, columns); JSON lists read like tuples."""
    assert parse_img_size(value) == expected


@pytest.mark.parametrize("value,found", [("224x", "'' is not an integer"), ("0", "0 is not positive"),
                                         ("-3", "-3 is not positive"), ("224x320x3", "3 numbers"),
                                         ("x320", "'' is not an integer"), ("big", "'big' is not an integer"),
                                         ((224, 0), "0 is not positive"), (True, "True"), (2.5, "2.5")])
def test_bad_sizes_say_what_is_expected_and_the_fix(value, found):
    with pytest.raises(EdgeError) as e:
        parse_img_size(value)
    message = str(e.value)
    assert f"input size {value!r}" in message and found in message
    assert "expected: N (N x N pixels) or HxW" in message and "fix:" in message and "224x320" in message


def test_non_square_size_from_the_argument_and_from_a_model_option():
    for model in (create_model(TINY, img_size="28x42"), create_model(TINY + ",img_size=28x42")):
        assert model_info(model).grid == (4, 6) and data_config(model)["input_size"] == (1, 28, 42)
    with pytest.raises(EdgeError, match="input size 0"):
        create_model(TINY, img_size=0)
    with pytest.raises(EdgeError, match="input size '28x'"):
        create_model(TINY + ",img_size=28x")
