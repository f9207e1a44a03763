"""``load_model`` says what a path is when it is not a compressed model (issue 19, point 6)."""

import pytest

from edge.compress.load import load_model
from edge.errors import EdgeError


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: (p / "notes.txt").write_text("hi") and p / "notes.txt", "is a file, not a PyTorch model"),
    (lambda p: (p / "g.onnx").write_bytes(b"x") and p / "g.onnx", "is a graph file, not a PyTorch model"),
    (lambda p: (p / "runs").mkdir() or p / "runs", "is a folder but not a compressed model"),
    (lambda p: p / "missing" / "art", "does not exist"),
])
def test_a_path_that_is_no_model_is_named_for_what_it_is(tmp_path, make, says):
    path = make(tmp_path)
    with pytest.raises(EdgeError) as error:
        load_model(str(path))
    message = str(error.value)
    assert says in message and str(path) in message and "unknown model" not in message
    assert "edge compress" in message


def test_an_unknown_name_is_still_an_unknown_model():
    with pytest.raises(EdgeError, match="(?s)unknown model .fmnist-deit-tinyy.*closest names: fmnist-deit-tiny"):
        load_model("fmnist-deit-tinyy")
