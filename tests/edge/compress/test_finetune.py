import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from edge.check.accuracy import evaluate
from edge.cli import main
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.finetune import FinetuneConfig, finetune, select_trainable
from edge.compress.load import load_model
from edge.data import ArrayPreprocess, InputSpec, balanced_indices, load_dataset
from edge.errors import EdgeError
from edge.models import create_model, data_config
from edge.models.weights_io import save_safetensors
from edge.train import training_batch, training_set
from edge.train.distillation import distillation_loss, logits_and_features

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"
PLAN = "dwconv:blocks=0+1:init=gaussian"




@pytest.fixture(scope="module")
def artifact(teacher_weights, tmp_path_factory):
    """The teacher compressed by a dwconv plan; its manifest names the teacher's weights file."""
    source = {"model": TINY, "weights": str(teacher_weights), "img_size": None}
    model, manifest = compress(create_model(TINY, weights=teacher_weights), source,
                               CompressConfig(plan=PLAN, data="fmnist-mini", samples=24))
    return save_artifact(model, tmp_path_factory.mktemp("compressed") / "dw2", manifest)


def _config(**overrides) -> FinetuneConfig:
    base = dict(data="fmnist-mini", train_samples=48, batch_size=16, epochs=2, eval_samples=100, threads=1,
                amp="off", lr=1e-3, warmup_steps=2, checkpoint_every=2, device="cpu")
    return FinetuneConfig(**{**base, **overrides})


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def _train_batch(n=16):
    data = training_set("fmnist-mini", 48, 0)
    _, images, labels = training_batch(data, 0, n, 0, augment=False)
    spec = InputSpec.from_data_config(data_config(create_model(TINY)))
    return ArrayPreprocess(spec)(images), labels


def test_distillation_loss_is_exactly_zero_for_identical_models_and_matches_its_formula(teacher_weights):
    teacher = create_model(TINY, weights=teacher_weights)
    x, y = _train_batch()
    with torch.no_grad():
        logits, features = logits_and_features(teacher, x, features=True)
        again, features_again = logits_and_features(teacher, x, features=True)
        torch.testing.assert_close(logits, teacher(x), rtol=0, atol=1e-6)  # the head path equals forward()
    loss, parts = distillation_loss(again, logits, y, temperature=2.0, student_features=features_again,
                                    teacher_features=features, feature_weight=1.0)
    assert loss.item() == 0.0 and parts["kl"].item() == 0.0 and parts["feature_mse"].item() == 0.0

    student = torch.randn(8, 10, dtype=torch.float64)
    target = torch.randn(8, 10, dtype=torch.float64)
    labels = torch.arange(8) % 10
    t = 3.0
    p_t = (target / t).softmax(-1)
    kl = (p_t * ((target / t).log_softmax(-1) - (student / t).log_softmax(-1))).sum(-1).mean() * t * t
    ce = F.cross_entropy(student, labels)
    mse = ((student[:, :4] - target[:, :4]) ** 2).mean()
    loss, parts = distillation_loss(student.float(), target.float(), labels, temperature=t, alpha=0.25,
                                    student_features=student[:, :4].float(), teacher_features=target[:, :4].float(),
                                    feature_weight=0.5)
    assert parts["kl"].item() == pytest.approx(kl.item(), rel=1e-5)
    assert parts["ce"].item() == pytest.approx(ce.item(), rel=1e-5)
    assert loss.item() == pytest.approx((0.75 * kl + 0.25 * ce + 0.5 * mse).item(), rel=1e-5)


def test_a_few_steps_reduce_the_kl_on_the_training_batch(teacher_weights, artifact, tmp_path):
    x, y = _train_batch()
    teacher = create_model(TINY, weights=teacher_weights)

    def kl(model):
        with torch.no_grad():
            return distillation_loss(model(x), teacher(x), temperature=2.0)[1]["kl"].item()

    before = kl(load_artifact(artifact)[0])
    # one batch of 16 training images, no augmentation: the steps see exactly this batch
    config = _config(train_samples=16, epochs=12, augment=False, eval_every_epoch=False)
    record = finetune(artifact, tmp_path / "ft", config)
    after = kl(load_artifact(tmp_path / "ft")[0])
    assert record["steps"] == 12 and before > 0
    assert after < 0.3 * before  # measured: 0.0060 -> 0.0007


def test_same_seed_gives_bit_identical_weights_and_another_seed_does_not(artifact, tmp_path):
    a = finetune(artifact, tmp_path / "a", _config())
    b = finetune(artifact, tmp_path / "b", _config())
    c = finetune(artifact, tmp_path / "c", _config(seed=1))
    wa, wb, wc = _weights(tmp_path / "a"), _weights(tmp_path / "b"), _weights(tmp_path / "c")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["eval"] == b["eval"] and a["steps"] == 6
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert c["recipe"]["seed"] == 1


def test_interrupted_run_resumes_to_identical_weights(artifact, tmp_path):
    finetune(artifact, tmp_path / "straight", _config())
    partial = finetune(artifact, tmp_path / "resumed", _config(max_steps=3))  # stops mid-way, checkpoint at step 3
    assert partial["steps"] == 3
    resumed = finetune(artifact, tmp_path / "resumed", _config())
    assert resumed["steps"] == 6
    ws, wr = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert all(torch.equal(ws[k], wr[k]) for k in ws)
    # the held-out accuracy before fine-tuning was measured once, at step 0 of the first run
    assert resumed["history"][0]["step"] == 0 and resumed["eval_before"] == partial["eval_before"]


def test_the_checkpoint_stays_only_while_resumable_work_remains(artifact, tmp_path, monkeypatch):
    import edge.train.loop as module  # the one training loop sets each step's learning rate

    out = tmp_path / "ft"
    finetune(artifact, out, _config(max_steps=3))  # stopped by --max-steps: artifact of step 3 and its checkpoint
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "edge-model.json", "model.safetensors"]
    schedule = module.learning_rate

    def interrupted(step, total, config):  # Ctrl-C during step 5 (0-based 4), after the checkpoint of step 4
        if step == 4:
            raise KeyboardInterrupt
        return schedule(step, total, config)

    monkeypatch.setattr(module, "learning_rate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune(artifact, out, _config())
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 4
    assert load_artifact(out)[1]["finetune"][-1]["steps"] == 3  # the stopped run's artifact is untouched
    monkeypatch.setattr(module, "learning_rate", schedule)
    assert finetune(artifact, out, _config())["steps"] == 6  # continued from step 4 to the end
    assert sorted(p.name for p in out.iterdir()) == ["edge-model.json", "model.safetensors"]


def test_finetuned_artifact_restores_to_identical_outputs_and_records_the_recipe(teacher_weights, artifact, tmp_path):
    # stopped at step 5 of 6: the artifact of step 5 is written and the checkpoint of step 5 kept beside it
    record = finetune(artifact, tmp_path / "ft", _config(max_steps=5))
    restored, manifest = load_artifact(tmp_path / "ft")
    checkpoint = torch.load(tmp_path / "ft" / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == record["steps"] == 5
    trained, _ = load_artifact(artifact)
    trained.load_state_dict(checkpoint["model"])
    trained.eval()
    x, _ = _train_batch()
    with torch.no_grad():
        assert torch.equal(restored(x), trained(x))
        assert not torch.equal(restored(x), load_artifact(artifact)[0](x))  # it did change
    stage = manifest["finetune"][-1]
    assert manifest["plan"] == load_artifact(artifact)[1]["plan"]
    assert manifest["steps"] == load_artifact(artifact)[1]["steps"] and manifest["steps"][0]["method"] == "dwconv"
    assert stage["teacher"]["model"] == TINY and stage["teacher"]["weights"] == str(teacher_weights)
    assert stage["recipe"]["temperature"] == 2.0 and stage["recipe"]["train"] == "all"
    assert stage["eval"] == record["eval"] and len(stage["history"]) == 2  # before, end of epoch 1
    # the recorded held-out accuracy is that of the restored artifact (loaded as any model is)
    test = load_dataset("fmnist-mini", "test")
    held_out = test.subset(balanced_indices(test.labels, 100, 0, test.num_classes))
    spec = InputSpec.from_data_config(data_config(restored))
    result = evaluate(load_model(str(tmp_path / "ft")), held_out, spec, show_progress=False)
    assert result["accuracy"] == stage["eval"]["accuracy"] and stage["eval"]["samples"] == 100


def test_train_replaced_changes_only_the_replaced_modules(artifact, tmp_path):
    model, _ = load_artifact(artifact)
    count = select_trainable(model, "replaced")
    assert count == sum(p.numel() for b in model.blocks for p in b.attn.parameters())
    finetune(artifact, tmp_path / "ft", _config(train="replaced"))
    before, after = _weights(artifact), _weights(tmp_path / "ft")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("blocks.") and ".attn." in k for k in changed)
    assert any(".attn.conv." in k for k in changed)


@pytest.mark.parametrize("overrides, message", [
    ({"train": "heads"}, "--train heads"),
    ({"temperature": 0.0}, "--temperature 0.0"),
    ({"alpha": 1.5}, "--alpha 1.5"),
    ({"feature_weight": -1.0}, "--feature-weight -1.0"),
    ({"epochs": 0}, "--epochs 0"),
])
def test_bad_option_values_are_refused_and_nothing_is_written(artifact, tmp_path, overrides, message):
    with pytest.raises(EdgeError, match=message):
        finetune(artifact, tmp_path / "ft", _config(**overrides))
    assert not (tmp_path / "ft").exists()


def test_bad_inputs_are_explained(artifact, tmp_path):
    with pytest.raises(EdgeError, match="is a folder but not a compressed model"):
        finetune(tmp_path, tmp_path / "ft", _config())
    with pytest.raises(EdgeError, match="is the artifact being fine-tuned"):
        finetune(artifact, artifact, _config())
    with pytest.raises(EdgeError, match="has no weights"):
        finetune(artifact, tmp_path / "ft", _config(teacher=TINY))
    finetune(artifact, tmp_path / "run", _config(max_steps=2))
    with pytest.raises(EdgeError, match="different recipe .*lr"):
        finetune(artifact, tmp_path / "run", _config(lr=5e-4))
    with pytest.raises(EdgeError, match="different recipe .*teacher_sha256"):
        other = tmp_path / "other.safetensors"
        torch.manual_seed(1)
        save_safetensors({k: v.float() for k, v in create_model(TINY).state_dict().items()}, other, metadata={})
        finetune(artifact, tmp_path / "run", _config(teacher_weights=str(other)))
    assert not (tmp_path / "ft").exists()


def test_cli_finetune_json_and_exit_codes(artifact, tmp_path, capsys):
    out = tmp_path / "ft"
    args = ["finetune", str(artifact), "--data", "fmnist-mini", "--train-samples", "32", "--batch-size", "16",
            "--eval-samples", "50", "--threads", "1", "--amp", "off", "--warmup-steps", "1", "--out", str(out)]
    assert main([*args, "--max-steps", "1", "--json"]) == 0  # step 1 of 2: the checkpoint stays to continue
    record = json.loads(capsys.readouterr().out)
    assert record["steps"] == 1 and record["recipe"]["batch_size"] == 16 and record["out"] == str(out)
    assert (out / "checkpoint.pt").is_file()
    assert main([*args[:-2], "--lr", "1e-2", "--out", str(out)]) == 2
    assert "different recipe" in capsys.readouterr().err
    assert main([*args, "--json"]) == 0  # continued to the end: a finished run keeps no checkpoint
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["edge-model.json", "model.safetensors"]
    assert main(["finetune", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2


def test_cli_compress_then_finetune_in_one_command(teacher_weights, tmp_path, capsys):
    out = tmp_path / "dw2-ft"
    code = main(["compress", TINY, "--weights", str(teacher_weights), "--plan", PLAN, "--data", "fmnist-mini",
                 "--samples", "24", "--threads", "1", "--finetune-epochs", "1", "--out", str(out), "--json"])
    assert code == 0
    manifest = json.loads(capsys.readouterr().out)
    stage = manifest["finetune"][-1]
    assert stage["steps"] == 8 and stage["train_samples"] == 1000  # one epoch of fmnist-mini's train split
    assert stage["student"]["plan"] == PLAN and "not kept" in stage["student"]["artifact"]
    assert load_artifact(out)[1]["finetune"] == manifest["finetune"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dw2-ft"]  # the training-free artifact is gone
    assert sorted(p.name for p in out.iterdir()) == ["edge-model.json", "model.safetensors"]  # no checkpoint
