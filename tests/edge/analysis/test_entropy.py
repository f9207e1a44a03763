"""Entropy (Eq. 6), transfer entropy (Eq. 7) and NOSE (Algorithm 1) against direct float64 computations."""

import json

import numpy as np
import pytest
import torch

from edge.analysis.entropy import (
    ChannelMoments,
    attention_removed,
    collect_entropy,
    entropy_of,
    transfer_entropy,
)
from edge.analysis.nose import nose_search, nose_select
from edge.cli import main
from edge.data import InputSpec, calibration_set
from edge.data.preprocess import ArrayPreprocess
from edge.errors import EdgeError
from edge.models import create_model, data_config

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
# Float64 accumulation of float32 features: streamed and direct sums of log std agree to rounding of the
# float32 forward passes (identical tensors here), so the tolerance is that of float64 arithmetic.
TOL = 1e-9


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = create_model(TINY).eval()
    return model, InputSpec.from_data_config(data_config(model)), calibration_set("fmnist-mini", 24, 0)


def _direct_log_std(features: torch.Tensor) -> float:
    """Eq. 6 on everything in memory: numpy float64, population std over all rows."""
    x = features.detach().reshape(-1, features.shape[-1]).double().numpy()
    return float(np.log(x.std(axis=0, ddof=0)).sum())


def _all_features(model, images, spec, removed_positions=()):
    """Every sub-layer output and the pre-logits features of ``images``, in memory (one batch)."""
    x = torch.cat([batch for batch, _ in images.batches(len(images), ArrayPreprocess(spec))])
    outs: dict = {}
    handles = [block.ls1.register_forward_hook(lambda _m, _a, o, p=p: outs.__setitem__(("attention", p), o))
               for p, block in enumerate(model.blocks)]
    handles += [block.ls2.register_forward_hook(lambda _m, _a, o, p=p: outs.__setitem__(("mlp", p), o))
                for p, block in enumerate(model.blocks)]
    try:
        with torch.no_grad(), attention_removed(model, removed_positions):
            outs["target"] = model.forward_head(model.forward_features(x), pre_logits=True)
    finally:
        for handle in handles:
            handle.remove()
    return outs


def test_streamed_channel_moments_equal_direct_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 7, generator=g, dtype=torch.float64) * torch.arange(1, 8) + 100.0  # mean >> std
    moments = ChannelMoments.zeros(7)
    for start in range(0, 1000, 37):
        moments.update(x[start:start + 37])
    torch.testing.assert_close(moments.std(), x.std(0, correction=0), rtol=1e-12, atol=0)
    assert moments.entropy() == pytest.approx(_direct_log_std(x), abs=1e-10)
    assert entropy_of(torch.zeros(5, 3)) == float("-inf")


def test_sublayer_entropy_matches_direct_computation(setup):
    model, spec, images = setup
    stats = collect_entropy(model, images, spec, batch_size=5)   # 24 images: uneven batches
    direct = _all_features(model, images, spec)
    prefix = model.num_prefix_tokens
    for p in range(len(model.blocks)):
        for kind in ("attention", "mlp"):
            expected = _direct_log_std(direct[(kind, p)][:, prefix:])   # patch tokens only by default
            assert getattr(stats, kind)[p].entropy() == pytest.approx(expected, abs=TOL, rel=0)
    assert stats.target.entropy() == pytest.approx(_direct_log_std(direct["target"]), abs=TOL, rel=0)
    everything = collect_entropy(model, images, spec, tokens="all", batch_size=7)
    assert everything.mlp[2].entropy() == pytest.approx(_direct_log_std(direct[("mlp", 2)]), abs=TOL, rel=0)
    assert everything.mlp[2].count == 24 * (16 + 1) and stats.mlp[2].count == 24 * 16


def test_transfer_entropy_and_nose_trajectory_match_direct(setup):
    model, spec, images = setup
    base = _direct_log_std(_all_features(model, images, spec)["target"])
    removed = _direct_log_std(_all_features(model, images, spec, [1, 3])["target"])
    te = transfer_entropy(model, images, spec, [1, 3], batch_size=5)
    assert te["te"] == pytest.approx(base - removed, abs=TOL, rel=0)
    # NOSE's cached re-runs give the same numbers as full forward passes of each condition
    chosen, rows = nose_select(model, images, spec, 2, set(), 5)
    for row in rows:
        direct = base - _direct_log_std(_all_features(model, images, spec, row["removed"])["target"])
        assert row["te"] == pytest.approx(direct, abs=1e-6, rel=0)   # different batch splits: float32 rounding
    first = [r for r in rows if r["step"] == 0]
    assert chosen[0] == min(first, key=lambda r: (r["abs_te"], r["block"]))["block"]
    assert [r["block"] for r in rows if r["chosen"]] == chosen and len(rows) == 4 + 3


def test_zero_branch_is_the_mlp_only_block(setup):
    """'Attention made identity' is exactly MLPOnlyBlock(scale=1): x + ls2(mlp(norm2(x)))."""
    from edge.compress.methods.attnrm.module import MLPOnlyBlock

    model, _, _ = setup
    x = torch.randn(3, 17, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = MLPOnlyBlock.from_block(model.blocks[2], scale=1.0)(x)
        with attention_removed(model, [2]):
            got = model.blocks[2](x)
    assert torch.equal(got, expected)
    assert type(model.blocks[2].attn).__name__ == "Attention"   # put back


def _zeroed(blocks):
    """TINY with the attention output projection of ``blocks`` zeroed: removing them changes nothing."""
    torch.manual_seed(0)
    model = create_model(TINY).eval()
    with torch.no_grad():
        for b in blocks:
            model.blocks[b].attn.proj.weight.zero_()
            model.blocks[b].attn.proj.bias.zero_()
    return model


def test_nose_chooses_the_layers_that_do_nothing_first(setup):
    _, spec, images = setup
    model = _zeroed([1, 3])
    chosen, rows = nose_select(model, images, spec, 3, set(), 8)
    assert chosen[:2] == [1, 3]          # TE exactly 0 for both; the tie goes to the lower block
    step0 = {r["block"]: r["te"] for r in rows if r["step"] == 0}
    assert step0[1] == 0.0 and step0[3] == 0.0 and min(abs(step0[0]), abs(step0[2])) > 1e-3
    assert [r["te"] for r in rows if r["step"] == 1 and r["block"] == 3] == [0.0]
    assert chosen[2] in (0, 2)
    # the entropy of a zeroed attention is -inf (every channel constant): null in JSON terms
    stats = collect_entropy(model, images, spec, batch_size=8)
    assert stats.attention[1].entropy() == float("-inf") and stats.attention[1].zero_std_channels() == 32
    assert stats.rows()[1]["attention"] is None


def test_nose_is_deterministic_and_respects_excluded(setup):
    _, spec, images = setup
    model = _zeroed([1, 3])
    first = nose_select(model, images, spec, 2, {1}, 6)
    again = nose_select(model, images, spec, 2, {1}, 6)
    assert first == again
    chosen, rows = first
    assert 1 not in chosen and all(r["block"] != 1 for r in rows) and chosen[0] == 3
    assert all(type(b.attn).__name__ == "Attention" for b in model.blocks)   # every substitution undone


@pytest.mark.parametrize("count, excluded, message", [(3, {0, 1}, "exceeds the free attention layers"),
                                                      (4, set(), "removes every attention layer"),
                                                      (0, set(), "at least 1")])
def test_nose_refuses_impossible_counts(setup, count, excluded, message):
    model, spec, images = setup
    with pytest.raises(EdgeError, match=message):
        nose_select(model, images, spec, count, excluded, 8)


def test_nose_search_records_settings(setup):
    model, spec, images = setup
    result = nose_search(model, images, spec, 1, {0}, 12)
    record = result.as_dict()
    assert record["candidates"] == [1, 2, 3] and record["excluded"] == [0] and record["samples"] == 24
    assert "pre-logits" in record["target"] and len(record["trajectory"]) == 3
    json.dumps(record)


def test_analyze_entropy_and_nose_cli(tmp_path, capsys):
    out = tmp_path / "a"
    assert main(["analyze", TINY, "--data", "fmnist-mini", "--samples", "20", "--entropy", "--nose", "2",
                 "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    entropy = json.loads((out / "entropy.json").read_text())
    nose = json.loads((out / "nose.json").read_text())
    assert len(entropy["blocks"]) == 4 and entropy["tokens"] == "patch" and entropy["samples"] == 20
    assert all(isinstance(row["attention"], float) and isinstance(row["mlp"], float) for row in entropy["blocks"])
    assert isinstance(entropy["target"]["entropy"], float) and "cpu" in entropy["hardware"]
    assert len(nose["chosen"]) == 2 and len(nose["trajectory"]) == 4 + 3
    assert result["entropy"]["blocks"] == entropy["blocks"] and result["nose"]["chosen"] == nose["chosen"]
    for name in ("entropy.png", "nose.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_nose_bad_count_exits_2(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["analyze", TINY, "--data", "fmnist-mini", "--samples", "10", "--nose", "4",
                 "--out", str(out)]) == 2
    assert "removes every attention layer" in capsys.readouterr().err and not out.exists()
