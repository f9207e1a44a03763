import json

import pytest
import torch
from safetensors.torch import load_file

from edge.errors import EdgeError
from edge.train import TrainConfig, learning_rate, train
from tests.conftest import needs_fmnist

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"


def _config(**overrides) -> TrainConfig:
    base = dict(model=TINY, data="fmnist-mini", epochs=2, batch_size=64, train_samples=256, warmup_steps=2,
                checkpoint_every=2, threads=1, save_dtype="float32", amp="off")
    return TrainConfig(**{**base, **overrides})


def _weights(out):
    return load_file(str(out / "model.safetensors"))


def test_same_seed_same_weights_and_card(tmp_path):
    a = train(_config(), tmp_path / "a")
    b = train(_config(), tmp_path / "b")
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["eval"] == b["eval"] and a["steps"] == 8 and a["eval"]["samples"] == 2000
    card = json.loads((tmp_path / "a" / "card.json").read_text())
    for key in ("command", "seed", "epochs", "train_data", "eval", "wall_time_s", "hardware", "recipe"):
        assert key in card
    assert len(card["history"]) == 2 and card["history"][-1]["epoch"] == 2


def test_other_seed_other_weights(tmp_path):
    train(_config(), tmp_path / "a")
    train(_config(seed=1), tmp_path / "b")
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert not torch.equal(wa["pos_embed"], wb["pos_embed"])


def test_interrupted_run_resumes_to_identical_weights(tmp_path):
    train(_config(), tmp_path / "straight")
    partial = train(_config(max_steps=3), tmp_path / "resumed")  # stops mid-epoch, checkpoint at step 3
    assert partial["steps"] == 3
    resumed = train(_config(), tmp_path / "resumed")
    assert resumed["steps"] == 8
    ws, wr = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert all(torch.equal(ws[k], wr[k]) for k in ws)


def test_the_checkpoint_stays_only_while_resumable_work_remains(tmp_path):
    train(_config(max_steps=3), tmp_path / "run")  # stopped early: the checkpoint is kept to continue
    assert (tmp_path / "run" / "checkpoint.pt").is_file()
    assert train(_config(), tmp_path / "run")["steps"] == 8
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["card.json", "model.safetensors"]


def test_resume_with_a_different_recipe_is_refused(tmp_path):
    train(_config(max_steps=2), tmp_path / "run")
    with pytest.raises(EdgeError, match="different recipe .*lr"):
        train(_config(lr=5e-4), tmp_path / "run")


def test_learning_rate_schedule():
    config = TrainConfig(lr=1e-3, min_lr=1e-5, warmup_steps=10)
    assert learning_rate(0, 100, config) == pytest.approx(1e-4)
    assert learning_rate(9, 100, config) == pytest.approx(1e-3)
    assert learning_rate(100, 100, config) == pytest.approx(1e-5, rel=1e-9)  # cosine ends at step == total
    assert 1e-5 < learning_rate(99, 100, config) < 1.1e-5
    values = [learning_rate(s, 100, config) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.slow  # CI time: 60 training steps on full Fashion-MNIST plus a full-split evaluation; nightly: -m slow
@needs_fmnist
def test_short_run_of_the_documented_recipe_reproduces_the_recorded_figure(tmp_path):
    """CI's check of `edge train`: the first steps of the shipped recipe, same seed, same accuracy (0.5 pt)."""
    from edge.models import model_card

    card = model_card("fmnist-deit-tiny")
    short = card["reproduce"]["short_run"]
    result = train(TrainConfig(**{**short["recipe"], "max_steps": short["max_steps"]}), tmp_path / "short")
    assert result["steps"] == short["max_steps"]
    assert abs(result["eval"]["accuracy"] - short["accuracy"]) <= 0.005


@pytest.mark.slow
@needs_fmnist
def test_full_recipe_reproduces_the_shipped_accuracy(tmp_path):
    """The documented full recipe, every stage in order (each stage starts from the previous one's weights)."""
    from edge.models import model_card

    card = model_card("fmnist-deit-tiny")
    previous = None
    for stage in card["stages"]:
        recipe = dict(stage["recipe"])
        if previous is not None:
            recipe["init_weights"] = str(previous / "model.safetensors")
        previous = tmp_path / f"stage{stage['stage']}"
        result = train(TrainConfig(**recipe), previous)
        assert abs(result["eval"]["accuracy"] - stage["accuracy"]) <= 0.005, f"stage {stage['stage']}"
