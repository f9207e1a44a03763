"""The outlier model's recipe end to end on fmnist-mini, two steps of edge's loop: weights, card, resumability."""

import json

import pytest

from edge.models import create_model
from edge.train.outliers import NAME, OutlierConfig, make_outlier_model

SMOKE = dict(data="fmnist-mini", max_steps=2, batch_size=16, train_samples=64, eval_samples=100, gate_images=200,
             threads=1, device="cpu")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("outliers")
    return out, make_outlier_model(OutlierConfig(**SMOKE), out)


@pytest.mark.slow  # runs the outlier recipe (~19 s of fixture)
def test_recipe_writes_float16_weights_and_a_card_that_says_how(made):
    out, card = made
    assert card["model"] == NAME and card["made_from"] == "fmnist-deit-tiny"
    assert card["steps"] == 2 and card["seed"] == 0 and card["train_samples"] == 64
    assert card["eval"]["samples"] == 2000                 # the whole test split of the data named
    assert card["eval"]["accuracy"] >= 0.85                # planted, two steps: the reference's 0.896 nearly kept
    assert card["planted"]["block"] == 2 and len(card["planted"]["channels"]) == 2
    assert card["planted"]["gated_tokens_saturated"] > 0.9
    assert card["layernorm_spread"]["max_abs_logit_change"] < 1e-3   # an exact reparameterisation
    assert len(card["layernorm_spread"]["scales"]) == 25
    assert card["precision"] == {"train": "float32", "weights": "float16", "eval": "float32"}
    assert "torch" in card and card["hardware"]["cpu_count"] >= 1
    assert json.loads((out / "card.json").read_text()) == json.loads(json.dumps(card))
    model = create_model("fmnist-deit-tiny", weights=out / "model.safetensors")
    assert next(model.parameters()).dtype.is_floating_point


@pytest.mark.slow  # the recipe's fixture (~30 s); the same rule for edge train and edge finetune runs by default
def test_a_run_stopped_by_max_steps_keeps_its_checkpoint(made):  # (tests/edge/test_train.py, test_finetune.py)
    out, _ = made
    assert (out / "checkpoint.pt").is_file()              # max_steps is a stop, not the end of the schedule
