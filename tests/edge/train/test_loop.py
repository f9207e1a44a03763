"""The one training loop (edge/train/loop.py): the order of a task's hooks, checkpoints, divergence, and that
`edge train` runs through it (the fine-tune's tests patch the same loop: tests/edge/compress/test_finetune.py)."""

from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edge.train.loop as loop_module
from edge.data.preprocess import InputSpec
from edge.errors import EdgeError
from edge.train import TrainConfig, train
from edge.train.batches import training_set
from edge.train.checkpoint import Progress, recipe_of
from edge.train.loop import Loop, Runtime, run
from edge.train.schedule import Schedule, adamw

SPEC = InputSpec.from_data_config({"input_size": (1, 28, 28), "mean": (0.5,), "std": (0.5,)})


@dataclass
class Recording:
    """A task that trains with cross-entropy and records what the loop asks of it."""

    model: nn.Module
    scale: float = 1.0                    # inf: a diverging loss
    steps: list = field(default_factory=list)
    epochs: list = field(default_factory=list)

    def before_step(self, step, total):
        self.steps.append((step, total))
        return {"m": step / total}

    def loss(self, forward, x, y):
        loss = F.cross_entropy(forward(x), y) * self.scale
        return loss, {"double": (2 * loss).detach()}

    def after_epoch(self, progress, epoch, loss, last):
        self.epochs.append((epoch, progress.step, last, self.model.training))
        progress.history.append({"epoch": epoch + 1, "loss": loss})
        return {"acc": "n/a"}

    def checkpoint(self):
        return {"task": {"steps": len(self.steps)}}


def _loop(tmp_path, model, **overrides):
    config = TrainConfig(**{**dict(batch_size=16, train_samples=48, epochs=2, warmup_steps=1, threads=1,
                                   checkpoint_every=100, amp="off", device="cpu"), **overrides})
    data = training_set("fmnist-mini", config.train_samples, config.seed)
    return Loop(model=model, forward=model, optimizer=adamw(model, config), data=data,
                spec=SPEC, config=config,
                schedule=Schedule.of(len(data), config.batch_size, config.epochs, max_steps=config.max_steps),
                runtime=Runtime.start(config), checkpoint=tmp_path / "checkpoint.pt", recipe=recipe_of(config),
                desc="test", activity="testing")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))


def test_hooks_run_in_order_and_the_checkpoint_holds_the_tasks_state(tmp_path):
    model = _model()
    task = Recording(model)
    progress = run(_loop(tmp_path, model), task, Progress())
    assert progress.step == 6 and task.steps == [(s, 6) for s in range(6)]  # 48 images in batches of 16, 2 epochs
    assert task.epochs == [(0, 3, False, False), (1, 6, True, False)]  # after each epoch, the model in eval mode
    assert model.training   # back in train mode after the evaluation
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["step"] == 6 and state["task"] == {"steps": 6} and state["recipe"]["batch_size"] == 16
    assert [h["epoch"] for h in progress.history] == [1, 2]


def test_a_stopped_run_continues_to_the_same_weights(tmp_path):
    straight = _model()
    run(_loop(tmp_path / "a", straight), Recording(straight), Progress())
    resumed = _model()
    stopped = _loop(tmp_path / "b", resumed, max_steps=4)
    progress = run(stopped, Recording(resumed), Progress())
    assert progress.step == 4 and stopped.schedule.total == 6
    again = _model()
    loop = _loop(tmp_path / "b", again)
    progress = loop_module.resumed(loop, torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True))
    task = Recording(again)
    run(loop, task, progress)
    assert task.steps == [(4, 6), (5, 6)]
    assert all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), again.state_dict().values()))


def test_a_diverging_loss_stops_the_run_with_the_step_and_the_fix(tmp_path):
    model = _model()
    with pytest.raises(EdgeError, match="(?s)testing diverged at step 0: loss is inf.*fix: lower --lr"):
        run(_loop(tmp_path, model), Recording(model, scale=float("inf")), Progress())


def test_edge_train_runs_through_the_one_loop(tmp_path, monkeypatch):
    steps = []
    one_step = loop_module.train_step

    def counted(loop, task, forward, step, batch):
        steps.append((loop.desc, type(task).__name__, step))
        return one_step(loop, task, forward, step, batch)

    monkeypatch.setattr(loop_module, "train_step", counted)
    tiny = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=1,embed_dim=16," \
           "num_heads=1"
    card = train(TrainConfig(model=tiny, data="fmnist-mini", epochs=1, batch_size=32, train_samples=64, threads=1,
                             amp="off", save_dtype="float32", eval_every_epoch=False), tmp_path / "run")
    assert card["steps"] == 2 and steps == [("train", "CrossEntropy", 0), ("train", "CrossEntropy", 1)]
