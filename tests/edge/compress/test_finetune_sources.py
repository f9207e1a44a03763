"""`edge finetune` / `distil` on students that are not edge artifacts: a model spec with a weights file
(e.g. pruned by another tool), and a module of the user's own code through the Python entry point."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from edge.check.accuracy import evaluate
from edge.cli import main
from edge.compress.artifact import source_state_sha256
from edge.compress.finetune import FinetuneConfig, distil, finetune, load_distilled
from edge.compress.load import load_model
from edge.data import InputSpec, balanced_indices, load_dataset
from edge.errors import EdgeError
from edge.models import create_model, data_config
from edge.models.weights_io import save_safetensors

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"
NARROW = TINY + ",embed_dim=24"  # a uniformly narrower model: embed 24, 2 heads of 12, MLP 96
RECIPE = dict(train_samples=32, batch_size=16, epochs=1, eval_samples=50, threads=1, amp="off", lr=1e-3,
              warmup_steps=1, device="cpu")  # 2 steps


def _config(**overrides) -> FinetuneConfig:
    return FinetuneConfig(**{"data": "fmnist-mini", **RECIPE, **overrides})


@pytest.fixture(scope="module")
def narrow_weights(tmp_path_factory):
    """Weights of the narrow model (seeded): what a peer tool's pruned model saves as a state dict."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("pruned") / "pruned.safetensors"
    save_safetensors({k: v.float() for k, v in create_model(NARROW).state_dict().items()}, path)
    return path


class SmallCNN(nn.Module):
    """A user's own classifier: no timm, no patch embedding, no data config."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.classifier = nn.Linear(128, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def _held_out_accuracy(model, spec_source) -> float:
    test = load_dataset("fmnist-mini", "test")
    held_out = test.subset(balanced_indices(test.labels, 50, 0, test.num_classes))
    spec = InputSpec.from_data_config(data_config(spec_source))
    return evaluate(model, held_out, spec, show_progress=False)["accuracy"]


def test_a_timm_model_with_a_weights_file_distils_from_the_given_teacher(teacher_weights, narrow_weights, tmp_path):
    out = tmp_path / "ft"
    record = finetune(NARROW, out, _config(teacher=TINY, teacher_weights=str(teacher_weights)),
                      weights=narrow_weights)
    before, after = load_file(str(narrow_weights)), load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys() and not all(torch.equal(before[k], after[k]) for k in before)
    teacher = create_model(TINY, weights=teacher_weights)
    assert record["teacher"]["model"] == TINY and record["teacher"]["sha256"] == source_state_sha256(teacher)
    assert record["student"] == {"model": NARROW, "weights": str(narrow_weights),
                                 "sha256": source_state_sha256(create_model(NARROW, weights=narrow_weights))}
    assert record["steps"] == 2 and record["eval_before"]["samples"] == 50
    # the artifact rebuilds from the spec (no plan) and evaluates to the accuracy it recorded
    restored = load_model(str(out))
    assert restored.embed_dim == 24 and restored.blocks[0].mlp.fc1.out_features == 96
    assert _held_out_accuracy(restored, restored) == record["eval"]["accuracy"]
    manifest = json.loads((out / "edge-model.json").read_text())
    assert manifest["origin"] == {"kind": "model", "model": NARROW, "weights": str(narrow_weights)}
    assert manifest["teacher"]["model"] == TINY  # a later fine-tune of it distils from the same teacher
    assert not (out / "checkpoint.pt").exists()


def test_cli_finetune_of_a_named_model_with_weights(teacher_weights, narrow_weights, tmp_path, capsys):
    out = tmp_path / "ft"
    args = ["finetune", NARROW, "--weights", str(narrow_weights), "--teacher", TINY, "--teacher-weights",
            str(teacher_weights), "--data", "fmnist-mini", "--train-samples", "32", "--batch-size", "16",
            "--eval-samples", "50", "--threads", "1", "--amp", "off", "--out", str(out), "--json"]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["student"]["model"] == NARROW and record["teacher"]["model"] == TINY
    assert main(["eval", str(out), "--data", "fmnist-mini", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 2000


def test_a_named_model_distils_from_its_own_model_by_default(teacher_weights, tmp_path):
    """The default teacher of a spec is the spec's own model: refused where that has no weights (timm), and
    where it is the student itself (the loss would be 0)."""
    with pytest.raises(EdgeError, match=r"the teacher timm:vit_tiny.* has no weights") as e:
        finetune(TINY, tmp_path / "ft", _config(), weights=teacher_weights)
    assert "--teacher-weights" in str(e.value)
    with pytest.raises(EdgeError, match="are the same weights"):
        finetune(TINY, tmp_path / "ft", _config(teacher=TINY, teacher_weights=str(teacher_weights)),
                 weights=teacher_weights)
    with pytest.raises(EdgeError, match="the student timm:vit_tiny.* has no weights"):
        finetune(TINY, tmp_path / "ft", _config(teacher=TINY, teacher_weights=str(teacher_weights)))
    assert not (tmp_path / "ft").exists()


def test_weights_of_another_shape_say_what_they_hold_and_how_to_name_them(teacher_weights, narrow_weights, tmp_path):
    with pytest.raises(EdgeError, match="do not match the architecture") as e:
        finetune(TINY, tmp_path / "ft", _config(teacher=TINY, teacher_weights=str(teacher_weights)),
                 weights=narrow_weights)
    message = str(e.value)
    assert "embed width 24, depth 2, qkv width 72, MLP width 96" in message
    assert f"{TINY},embed_dim=24,depth=2,mlp_ratio=4" in message and "distil(" in message
    # per-block widths (MLP of block 1 pruned further): no option names them, the entry point is the way
    state = load_file(str(narrow_weights))
    state["blocks.1.mlp.fc1.weight"], state["blocks.1.mlp.fc1.bias"] = state["blocks.1.mlp.fc1.weight"][:64], \
        state["blocks.1.mlp.fc1.bias"][:64]
    state["blocks.1.mlp.fc2.weight"] = state["blocks.1.mlp.fc2.weight"][:, :64]
    uneven = tmp_path / "uneven.safetensors"
    save_safetensors(state, uneven)
    with pytest.raises(EdgeError, match="MLP width per block 96/64") as e:
        finetune(NARROW, tmp_path / "ft", _config(teacher=TINY, teacher_weights=str(teacher_weights)), weights=uneven)
    assert "no model option names these widths" in str(e.value) and "distil(" in str(e.value)
    with pytest.raises(EdgeError, match="does not exist"):
        finetune(NARROW, tmp_path / "ft", _config(teacher=TINY, teacher_weights=str(teacher_weights)),
                 weights=tmp_path / "missing.safetensors")
    assert not (tmp_path / "ft").exists()


def test_a_user_module_distils_through_the_entry_point(teacher_weights, tmp_path):
    student = SmallCNN()
    start = {k: v.clone() for k, v in student.state_dict().items()}
    out = tmp_path / "mine"
    record = distil(student, teacher=TINY, teacher_weights=teacher_weights, data="fmnist-mini", out=out, **RECIPE)
    assert all(torch.equal(start[k], v) for k, v in student.state_dict().items())  # the caller's module is not changed
    trained = load_file(str(out / "model.safetensors"))
    assert not all(torch.equal(start[k], trained[k]) for k in start)
    assert record["steps"] == 2 and record["teacher"]["model"] == TINY
    assert record["student"]["module"] == f"{__name__}.SmallCNN"
    recipe = {k: record["recipe"][k] for k in ("lr", "batch_size", "temperature", "alpha", "train", "data")}
    assert recipe == {"lr": 1e-3, "batch_size": 16, "temperature": 2.0, "alpha": 0.0, "train": "all",
                      "data": "fmnist-mini"}  # edge finetune's recipe: its defaults and the options given
    manifest = json.loads((out / "edge-model.json").read_text())
    assert manifest["origin"]["kind"] == "module" and manifest["origin"]["class"] == f"{__name__}.SmallCNN"
    assert manifest["info"] == {"params": sum(p.numel() for p in student.parameters())}
    # restored in Python the way the refusal says; it scores what the record says (teacher's preprocessing)
    restored = load_distilled(SmallCNN(), out)
    assert _held_out_accuracy(restored, create_model(TINY)) == record["eval"]["accuracy"]


def test_a_module_artifact_is_refused_by_eval_and_export_with_the_way_to_restore_it(teacher_weights, tmp_path, capsys):
    out = tmp_path / "mine"
    distil(SmallCNN(), teacher=TINY, teacher_weights=teacher_weights, data="fmnist-mini", out=out,
           **{**RECIPE, "max_steps": 1})
    for argv in (["eval", str(out), "--data", "fmnist-mini"], ["export", str(out), "--out", str(tmp_path / "m.onnx")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "built by Python code" in err and "load_distilled" in err and "Traceback" not in err
    assert not (tmp_path / "m.onnx").exists()


def test_bad_modules_and_arguments_are_explained(teacher_weights, tmp_path):
    teacher = dict(teacher=TINY, teacher_weights=teacher_weights, data="fmnist-mini", out=tmp_path / "x")
    with pytest.raises(EdgeError, match=r"not a classifier of fmnist-mini.*: its outputs are 5 values per image "
                                        r"but .* has 10 classes") as e:
        distil(SmallCNN(classes=5), **teacher, **RECIPE)
    assert "reset_classifier(10)" in str(e.value)
    rgb = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    with pytest.raises(EdgeError, match=r"cannot run on the inputs of .*\n  expected: .*\[N, 1, 28, 28\]"):
        distil(rgb, **teacher, **RECIPE)
    with pytest.raises(EdgeError, match="no recipe option 'learning_rate'"):
        distil(SmallCNN(), **teacher, learning_rate=1e-3)
    with pytest.raises(EdgeError, match="not a torch.nn.Module"):
        distil("fmnist-deit-tiny", **teacher)
    with pytest.raises(EdgeError, match="--feature-weight .* needs the pre-logit features"):
        distil(SmallCNN(), **teacher, **RECIPE, feature_weight=1.0)
    with pytest.raises(EdgeError, match="--train replaced .* has none"):
        distil(SmallCNN(), **teacher, **{**RECIPE, "train": "replaced"})
    assert not (tmp_path / "x").exists()
