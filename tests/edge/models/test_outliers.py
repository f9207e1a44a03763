"""The outlier test model's parts (issue 30.1): the planted massive activations, the exact LayerNorm spread,
the fine-tune's stream, and the bundled `fmnist-deit-tiny-outliers` once its weights are shipped."""

import pytest
import torch

from edge.analysis.outliers import outlier_statistics
from edge.data import ArrayPreprocess, InputSpec, load_dataset
from edge.models import BUNDLED, create_model, data_config, model_card
from edge.models.layernorm_spread import spread_layernorm_channels
from edge.models.massive import MassiveSite, plant_massive_activations
from edge.train.outliers import NAME, OutlierConfig, StudentStream, planted_error, planted_site, subset

IMAGES = 300   # fmnist-mini test images the statistics are read on here


@pytest.fixture(scope="module")
def x():
    model = create_model("fmnist-deit-tiny")
    preprocess = ArrayPreprocess(InputSpec.from_data_config(data_config(model)))
    return preprocess(subset(load_dataset("fmnist-mini", "test"), IMAGES, 0).images)


@pytest.fixture(scope="module")
def gate_x():
    data = load_dataset("fmnist-mini", "train")
    model = create_model("fmnist-deit-tiny")
    return ArrayPreprocess(InputSpec.from_data_config(data_config(model)))(subset(data, 500, 1).images)


def stats(model, x):
    return outlier_statistics(model, [x[i:i + 100] for i in range(0, len(x), 100)])


def test_reference_model_has_no_outliers(x):
    summary = stats(create_model("fmnist-deit-tiny"), x)["summary"]
    assert summary["massive_blocks"] == []
    assert summary["max_channel_ratio"] < 20
    assert summary["spread_layernorms"] == []


def test_layernorm_spread_is_exact_and_spreads_every_layernorm(x):
    model = create_model("fmnist-deit-tiny")
    with torch.no_grad():
        before = model(x)
    scales = spread_layernorm_channels(model, 6, 8.0, 32.0, seed=0)
    with torch.no_grad():
        after = model(x)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)   # float32 rounding only
    assert len(scales) == 25 and all(len(s) == 6 for s in scales.values())
    summary = stats(model, x)["summary"]
    assert len(summary["spread_layernorms"]) == 25        # >= 20x (max / min range) in every LayerNorm
    assert summary["median_range_spread_p99_p1"] >= 15    # and robustly (99th / 1st percentile)
    assert summary["massive_blocks"] == []                # a reparameterisation grows no residual outlier


def test_planted_massive_activations_ride_the_residual_stream(x, gate_x):
    model = create_model("fmnist-deit-tiny")
    site = planted_site(OutlierConfig(), 192)
    record = plant_massive_activations(model, site, gate_x)
    assert record["gated_tokens_saturated"] > 0.95 and record["other_tokens_above_half"] < 0.01
    result = stats(model, x)
    blocks = result["blocks"]
    assert result["summary"]["massive_blocks"] == list(range(site.block, 12))
    for b in blocks[site.block:]:
        assert {c["channel"] for c in b["top_channels"][:2]} == set(site.channels)
        assert b["max_abs"] == pytest.approx(site.magnitude, rel=0.1)
        assert {t["token"] for t in b["top_tokens"][:2]} == {1 + p for p in site.patches}
        assert b["token_norm_ratio"] > 20
    assert all(b["channel_ratio"] < 20 for b in blocks[:site.block])


def test_student_stream_reads_the_planted_values_and_passes_gradients(x, gate_x):
    model = create_model("fmnist-deit-tiny")
    site = MassiveSite(block=2, patches=(0, 6), channels=(44, 118), signs=(1, -1), magnitude=4000.0)
    plant_massive_activations(model, site, gate_x)
    logits, stream = StudentStream(model, site)(x[:8])
    with torch.no_grad():
        torch.testing.assert_close(logits, model(x[:8]))
    assert stream.shape == (8, 10, 2, 2)
    error = planted_error(stream, site)
    # about 1 % of the gated tokens are off (a corner with content in it): one of these 16 is, error ~1/16
    assert 0 <= float(error.detach()) < 0.15
    error.backward()
    assert model.blocks[2].mlp.fc2.weight.grad is not None


WEIGHTS = BUNDLED[NAME].weights if NAME in BUNDLED else None
shipped = pytest.mark.skipif(WEIGHTS is None or not WEIGHTS.is_file(),
                             reason=f"{NAME} is not shipped yet: make it with scripts/gpu_outliers.sh "
                                    f"(or scripts/make_outlier_model.py) and copy its weights and card to "
                                    "edge/models/weights/")


@shipped
def test_bundled_outlier_model_loads_has_its_card_and_its_outliers(x):
    model = create_model(NAME)
    card = model_card(NAME)
    assert card["model"] == NAME and card["eval"]["samples"] == 10000 and card["eval"]["accuracy"] >= 0.88
    assert card["outlier_statistics"]["summary"]["meets_targets"]
    summary = stats(model, x)["summary"]
    # the targets of issue 30, on 300 fmnist-mini test images: >= 100x in at least half the blocks,
    # >= 20x range spread in at least half the LayerNorms
    assert 2 * len(summary["massive_blocks"]) >= summary["blocks"]
    assert 2 * len(summary["spread_layernorms"]) >= summary["layernorms"]
    assert summary["meets_targets"]


@pytest.mark.skipif(WEIGHTS is not None and WEIGHTS.is_file(), reason=f"{NAME} is shipped")
def test_unshipped_outlier_model_says_how_to_make_it():
    from edge.errors import EdgeError

    with pytest.raises(EdgeError, match="scripts/make_outlier_model.py"):
        create_model(NAME)
    assert model_card(NAME) is None


def test_a_gate_that_does_not_separate_is_refused():
    from edge.errors import EdgeError
    from edge.models.massive import gate_threshold

    on = torch.tensor([True, False, False])
    scores = torch.tensor([[3.0, 0.0, 1.0], [2.0, 0.5, 1.0]])
    mid, half_gap = gate_threshold(scores, on, coverage=0.99)
    assert 1.0 < mid < 2.0 and half_gap > 0
    with pytest.raises(EdgeError, match="does not separate"):
        gate_threshold(torch.tensor([[0.2, 0.0, 1.0], [2.0, 0.5, 1.0]]), on, coverage=0.99)
