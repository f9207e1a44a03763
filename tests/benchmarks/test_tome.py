"""Token merging (benchmarks/tome.py), the peer of issue 20: exactness at r = 0, the merge, export."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from edge.compress.load import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from tome import apply_tome, merge_tokens, token_counts  # noqa: E402


@pytest.fixture
def images():
    return torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))


def test_r0_is_the_original_model(images):
    original = load_model("fmnist-deit-tiny").eval()
    tome = apply_tome(load_model("fmnist-deit-tiny").eval(), r=0)
    with torch.no_grad():
        assert torch.allclose(tome(images), original(images), atol=1e-5, rtol=0)


def test_identical_tokens_merge_into_their_size_weighted_mean():
    # A = tokens 0, 2; B = tokens 1, 3. Token 2 equals token 3 in the metric: it is the one merged.
    x = torch.tensor([[[9.0, 9.0], [1.0, 0.0], [4.0, 2.0], [0.0, 4.0]]])
    metric = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]]])
    size = torch.tensor([[[1.0], [1.0], [1.0], [3.0]]])
    out, new_size = merge_tokens(x, size, metric, r=1, protect_first=True)
    assert out.shape == (1, 3, 2)
    assert torch.equal(new_size[0, :, 0], torch.tensor([1.0, 1.0, 4.0]))
    assert torch.allclose(out[0, 0], x[0, 0])                       # the class token, first and untouched
    assert torch.allclose(out[0, 2], (x[0, 2] * 1 + x[0, 3] * 3) / 4)


def test_the_class_token_is_never_merged():
    x = torch.randn(2, 9, 8, generator=torch.Generator().manual_seed(1))
    metric = x.clone()
    metric[:, 0] = metric[:, 1]                                      # most similar pair involves the class token
    out, size = merge_tokens(x, torch.ones(2, 9, 1), metric, r=4, protect_first=True)
    assert out.shape == (2, 5, 8) and torch.allclose(out[:, 0], x[:, 0])
    assert torch.allclose(size.sum(1), torch.full((2, 1), 9.0))     # every patch still counted once


def test_token_counts_and_a_too_large_r():
    assert token_counts(50, 12, 2) == [50 - 2 * i for i in range(13)]
    with pytest.raises(ValueError, match="merges more tokens than block"):
        token_counts(50, 12, 5)


def test_tome_exports_with_static_shapes_and_matches_onnxruntime(images, tmp_path):
    model = apply_tome(load_model("fmnist-deit-tiny").eval(), r=3)
    path = tmp_path / "tome.onnx"
    torch.onnx.export(model, (images,), str(path), opset_version=17, input_names=["input"],
                      output_names=["logits"], dynamo=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": images.numpy()})[0]
    with torch.no_grad():
        want = model(images).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    ops = {n.op_type for n in __import__("onnx").load(str(path)).graph.node}
    assert not ops & {"ScatterElements", "ScatterND", "Loop", "If", "NonZero"}, sorted(ops)
