"""Dilution learning (edge/compress/methods/attnrm/dilution.py) and ``edge finetune --dilute``.

The attention-removal method is not needed: a small test method (``mlponly:blocks=0+1``) puts
``MLPOnlyBlock(scale=1)`` at the listed blocks, as a training-free attention removal does, and
returns :func:`dilution_phase` from ``training_phase``.
"""

import copy
import json
import math
from dataclasses import dataclass, field

import pytest
import torch
from safetensors.torch import load_file

from edge.cli import main
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.finetune import FinetuneConfig, finetune
from edge.compress.method import BuildContext, Built, Method, PlanCheck
from edge.compress.methods.attnrm.dilution import DilutedBlock, check_schedule, decay_steps, dilution_phase, mask_value
from edge.compress.methods.attnrm.module import MLPOnlyBlock
from edge.compress.registry import registered
from edge.errors import EdgeError
from edge.models import create_model

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"


@dataclass(frozen=True)
class MLPOnlyStep:
    blocks: tuple[int, ...]
    options: dict = field(default_factory=dict, hash=False)

    is_resolved = True

    def __str__(self) -> str:
        return "mlponly:blocks=" + "+".join(map(str, self.blocks))


class MLPOnlyMethod(Method):
    """Training-free attention removal of listed blocks; dilutes them when the fine-tune asks."""

    name = "test-mlponly"
    keywords = ("mlponly",)
    step_types = (MLPOnlyStep,)
    module_types = (MLPOnlyBlock,)
    order = 35
    grammar = "Test: mlponly:blocks=0+1 removes the attention of the listed blocks."

    def parse(self, keyword: str, rest: str, text: str) -> MLPOnlyStep:
        return MLPOnlyStep(tuple(sorted(int(b) for b in rest.removeprefix("blocks=").split("+"))))

    def validate(self, steps: tuple, check: PlanCheck) -> None:
        for step in steps:
            for block in step.blocks:
                check.attention[block] = step

    def build(self, steps: tuple, context: BuildContext) -> Built:
        return Built(steps, [b for s in steps for b in s.blocks])

    def place(self, model, built: Built) -> None:
        for block in built.modules:
            model.blocks[block] = MLPOnlyBlock.from_block(model.blocks[block], index=block)

    def record(self, model, step: MLPOnlyStep, prepared: dict) -> dict:
        return {"blocks": list(step.blocks)}

    def restore(self, model, records: list[dict]) -> None:
        for record in records:
            for block in record["blocks"]:
                model.blocks[block] = MLPOnlyBlock.from_block(model.blocks[block], index=block)

    def training_phase(self, student, teacher, config, steps=()):
        return dilution_phase(student, teacher, config) if config.dilute else None


@pytest.fixture(scope="module")
def method():
    with registered(MLPOnlyMethod()) as m:
        yield m




def _artifact(teacher_weights, folder, plan):
    source = {"model": TINY, "weights": str(teacher_weights), "img_size": None}
    model, manifest = compress(create_model(TINY, weights=teacher_weights), source,
                               CompressConfig(plan=plan, data="fmnist-mini", samples=24))
    return save_artifact(model, folder, manifest)


@pytest.fixture(scope="module")
def artifact(method, teacher_weights, tmp_path_factory):
    """Block 1's attention removed training-free (``x = x + MLP(LN(x))``)."""
    return _artifact(teacher_weights, tmp_path_factory.mktemp("rm") / "rm1", "mlponly:blocks=1")


def _config(**overrides) -> FinetuneConfig:
    # 48 images in batches of 16: 3 steps per epoch, 6 in 2 epochs
    base = dict(data="fmnist-mini", train_samples=48, batch_size=16, epochs=2, eval_samples=100, threads=1,
                amp="off", lr=1e-3, warmup_steps=2, checkpoint_every=2, device="cpu", dilute=True)
    return FinetuneConfig(**{**base, **overrides})


def _layerscale_vit():
    torch.manual_seed(0)
    model = create_model(TINY + ",init_values=0.5")
    for p in model.parameters():  # LayerScale gammas differ per channel, so ls1 is not a plain constant
        p.data.add_(0.1 * torch.randn_like(p))
    return model.eval()


# -- the block ------------------------------------------------------------------------------------------


def test_diluted_block_is_the_original_block_at_m1_and_the_mlp_only_block_at_m0_exactly():
    teacher = _layerscale_vit()
    student = copy.deepcopy(teacher)
    student.blocks[1] = MLPOnlyBlock.from_block(student.blocks[1], index=1)
    diluted = DilutedBlock.from_blocks(student.blocks[1], teacher.blocks[1]).eval()
    x = torch.randn(3, 17, 32)
    with torch.no_grad():
        assert torch.equal(diluted(x), teacher.blocks[1](x))            # M = 1: bit for bit the original block
        diluted.set_mask(0.0)
        two_x = MLPOnlyBlock(student.blocks[1].norm2, student.blocks[1].mlp, student.blocks[1].ls2, scale=2.0)
        assert torch.equal(diluted(x), two_x(x))                         # M = 0: x = 2x; x = x + MLP(LN(x))
        diluted.set_mask(0.25)                                           # Eq. 9 in between
        attn = teacher.blocks[1].ls1(teacher.blocks[1].attn(teacher.blocks[1].norm1(x)))
        h = 0.25 * attn + 1.75 * x
        expected = h + student.blocks[1].ls2(student.blocks[1].mlp(student.blocks[1].norm2(h)))
        torch.testing.assert_close(diluted(x), expected, rtol=1e-6, atol=1e-6)
        diluted.set_mask(0.0)
        final = diluted.to_mlp_only()
        assert torch.equal(final(x), two_x(x)) and float(final.scale) == 2.0 and final.index == 1
    assert not any(k.startswith(("norm1", "attn", "ls1")) for k in final.state_dict())
    assert final.mlp is student.blocks[1].mlp                            # the student's own MLP, not a copy
    assert diluted.attn is not teacher.blocks[1].attn and all(p.requires_grad for p in diluted.attn.parameters())


def test_phase_start_step_finish_leaves_mlp_only_blocks_of_scale_2():
    teacher = _layerscale_vit()
    student = copy.deepcopy(teacher)
    for i in (0, 1):
        student.blocks[i] = MLPOnlyBlock.from_block(student.blocks[i], index=i)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    phase = dilution_phase(student, teacher, FinetuneConfig(dilute=True, steps=4, dilution_fraction=0.5))
    assert torch.equal(student.state_dict()["blocks.0.scale"], before["blocks.0.scale"])  # nothing changed yet
    phase.start()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert phase.step(0, 4) == {"M": 1.0} and not phase.final
        assert torch.equal(student(x), teacher(x))                       # at M = 1 the student is the teacher
        assert phase.step(1, 4) == {"M": 0.0} and phase.final           # 4 steps x 0.5: M = 1, 0, 0, 0
        diluted = student(x)
        phase.finish()
        assert torch.equal(student(x), diluted)
    assert [type(b) for b in student.blocks] == [MLPOnlyBlock, MLPOnlyBlock]
    assert [float(b.scale) for b in student.blocks] == [2.0, 2.0]
    assert not any(".attn." in k or ".norm1." in k for k in student.state_dict())
    assert phase.record()["blocks"] == [0, 1]


# -- the schedule ---------------------------------------------------------------------------------------


def test_linear_and_cosine_schedules_reach_exactly_zero_and_stay_there():
    assert [mask_value(s, 10, 0.5, "linear") for s in range(10)] == [1.0, 0.75, 0.5, 0.25, 0, 0, 0, 0, 0, 0]
    cosine = [mask_value(s, 10, 0.5, "cosine") for s in range(10)]
    assert cosine[0] == 1.0 and cosine[4:] == [0.0] * 6
    assert cosine[2] == pytest.approx(0.5, abs=1e-12) and cosine[1] == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    for total in range(2, 40):
        for fraction in (0.1, 0.3, 0.5, 0.75, 0.9, 1.0):
            if decay_steps(total, fraction) < 2:
                continue
            values = [mask_value(s, total, fraction, "cosine") for s in range(total)]
            assert values[0] == 1.0 and values[-1] == 0.0                 # ends at exactly 0 ...
            assert all(a >= b for a, b in zip(values, values[1:]))        # ... monotonically
            first_zero = values.index(0.0)
            assert first_zero == decay_steps(total, fraction) - 1 <= total - 1
            assert first_zero <= math.ceil(fraction * total) - 1          # the decay takes the asked part
    # the few-steps edge: the whole schedule is the decay, and its last step trains at M = 0
    assert [mask_value(s, 2, 1.0) for s in range(2)] == [1.0, 0.0]
    assert [mask_value(s, 4, 1.0) for s in range(4)] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0], abs=1e-12)


@pytest.mark.parametrize("total, fraction, shape, message", [
    (10, 1.5, "linear", r"--dilution-fraction 1.5 (.|\n)*found: M = 0.357 at the last of the 10 steps"),
    (10, 0.0, "linear", "--dilution-fraction 0 is not a part"),
    (10, -0.5, "linear", "--dilution-fraction -0.5"),
    (3, 0.25, "linear", "leaves no step between M = 1 and M = 0"),
    (1, 1.0, "linear", "leaves no step between"),
    (10, 0.5, "exp", "--dilution-schedule exp"),
])
def test_schedules_that_do_not_end_at_zero_are_refused(total, fraction, shape, message):
    with pytest.raises(EdgeError, match=message):
        check_schedule(total, fraction, shape)
    with pytest.raises(EdgeError, match=message):
        mask_value(0, total, fraction, shape)


# -- edge finetune --dilute -------------------------------------------------------------------------------


def test_dilution_writes_only_the_m0_model_as_mlp_only_blocks_and_records_m(teacher_weights, artifact, tmp_path):
    # stopped at step 5 of 6 (M = 0 from step 4): the artifact is written and the checkpoint kept to compare with
    record = finetune(artifact, tmp_path / "d", _config(max_steps=5))
    model, manifest = load_artifact(tmp_path / "d")
    assert isinstance(model.blocks[1], MLPOnlyBlock) and float(model.blocks[1].scale) == 2.0
    assert not isinstance(model.blocks[0], MLPOnlyBlock)
    weights = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert not any(k == "blocks.1.m" or k.startswith(("blocks.1.attn.", "blocks.1.norm1.", "blocks.1.ls1."))
                   for k in weights)
    assert "blocks.1.mlp.fc1.weight" in weights and "blocks.0.attn.qkv.weight" in weights
    dilution = record["phases"]["dilution"]
    # 6 steps x 0.75: M = 1, 0.75, 0.5, 0.25, 0, 0 -> the decay is 5 steps, the last 2 train at M = 0
    assert dilution == {"schedule": "linear", "fraction": 0.75, "decay_steps": 5, "first_zero_step": 4,
                        "steps_at_zero": 2, "total_steps": 6, "blocks": [1], "M": 0.0}
    before, epoch1 = record["history"]
    assert "M" not in before                                              # the training-free artifact
    assert epoch1["step"] == 3 and epoch1["M"] == 0.5 and epoch1["final_structure"] is False
    assert record["artifact"] == str(tmp_path / "d") and manifest["finetune"][-1]["eval"] == record["eval"]
    # the held-out accuracy recorded is that of the M = 0 model as saved and restored
    checkpoint = torch.load(tmp_path / "d" / "checkpoint.pt", weights_only=True)
    assert float(checkpoint["model"]["blocks.1.m"]) == 0.0 and checkpoint["phases"] == {"dilution": {"M": 0.0}}
    diluted, _ = load_artifact(artifact)
    teacher = create_model(TINY, weights=teacher_weights)
    phase = dilution_phase(diluted, teacher, _config(steps=6))
    phase.start()
    diluted.load_state_dict(checkpoint["model"])
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), diluted.eval()(x))                  # restored artifact == trained model at M=0


def test_interrupted_dilution_resumes_to_identical_weights_and_writes_nothing_at_m_above_zero(artifact, tmp_path):
    straight = finetune(artifact, tmp_path / "straight", _config(dilution_schedule="cosine"))
    partial = finetune(artifact, tmp_path / "resumed", _config(dilution_schedule="cosine", max_steps=2))
    assert partial["artifact"] is None and partial["eval"] is None and partial["phases"]["dilution"]["M"] > 0
    assert sorted(p.name for p in (tmp_path / "resumed").iterdir()) == ["checkpoint.pt"]  # no M > 0 artifact
    resumed = finetune(artifact, tmp_path / "resumed", _config(dilution_schedule="cosine"))
    assert resumed["steps"] == straight["steps"] == 6
    ws = load_file(str(tmp_path / "straight" / "model.safetensors"))
    wr = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert ws.keys() == wr.keys()
    for k in ws:  # same ops in the same order on the same threads: tolerance 0 (bit-identical)
        torch.testing.assert_close(wr[k], ws[k], rtol=0, atol=0, msg=k)
    def timeless(history):
        return [{k: v for k, v in h.items() if k != "elapsed_s"} for h in history]

    assert timeless(resumed["history"]) == timeless(straight["history"])  # M and accuracy at each evaluation


def test_train_replaced_trains_only_the_diluted_blocks(artifact, tmp_path):
    finetune(artifact, tmp_path / "d", _config(train="replaced"))
    before = load_file(str(artifact / "model.safetensors"))
    after = load_file(str(tmp_path / "d" / "model.safetensors"))
    changed = {k for k in after if k in before and not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("blocks.1.") for k in changed)
    assert any(".mlp." in k for k in changed) and "blocks.1.scale" in changed  # 1 -> 2


def test_bad_dilution_inputs_are_refused_and_nothing_is_written(method, teacher_weights, artifact, tmp_path):
    with pytest.raises(EdgeError, match=r"--dilution-fraction 1.5 (.|\n)*in \(0, 1\]"):
        finetune(artifact, tmp_path / "ft", _config(dilution_fraction=1.5))
    with pytest.raises(EdgeError, match="--dilution-schedule step"):
        finetune(artifact, tmp_path / "ft", _config(dilution_schedule="step"))
    with pytest.raises(EdgeError, match="which is off(.|\n)*add --dilute"):
        finetune(artifact, tmp_path / "ft", _config(dilute=False, dilution_fraction=0.5))
    with pytest.raises(EdgeError, match="leaves no step between M = 1 and M = 0"):  # 6 steps x 0.1: a 1-step decay
        finetune(artifact, tmp_path / "ft", _config(dilution_fraction=0.1))
    assert not (tmp_path / "ft").exists()


def test_dilute_without_a_method_that_dilutes_is_refused(method, teacher_weights, tmp_path):
    """Only the artifact's own methods are asked for a phase: a dwconv artifact has nothing to dilute, although
    attnrm (registered) and the test method could dilute MLP-only blocks."""
    dense = _artifact(teacher_weights, tmp_path / "dense", "dwconv:blocks=0:init=gaussian")
    with pytest.raises(EdgeError, match="nothing in .* can be diluted"):
        finetune(dense, tmp_path / "ft", _config())
    assert not (tmp_path / "ft").exists()


def test_cli_finetune_dilute(artifact, tmp_path, capsys):
    out = tmp_path / "d"
    args = ["finetune", str(artifact), "--dilute", "--data", "fmnist-mini", "--train-samples", "48",
            "--batch-size", "16", "--epochs", "2", "--eval-samples", "50", "--threads", "1", "--amp", "off",
            "--warmup-steps", "1", "--out", str(out)]
    assert main([*args, "--max-steps", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["artifact"] is None and record["phases"]["dilution"]["M"] == 1.0
    assert record["stopped"] == "at step 1 of 6 with M = 1, before the final structure"
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out and load_artifact(out)[1]["finetune"][-1]["recipe"]["dilute"] is True
    assert main([*args[:-2], "--dilution-fraction", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--dilution-fraction: 2 is out of range" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_the_registered_attnrm_method_dilutes_its_blocks_through_the_fine_tuner(teacher_weights, tmp_path):
    """``edge compress --plan attnrm:blocks=1`` then ``edge finetune --dilute``: block 1 ends x = 2x; x + MLP(LN(x))."""
    removed = _artifact(teacher_weights, tmp_path / "rm", "attnrm:blocks=1")
    assert float(load_artifact(removed)[0].blocks[1].scale) == 1.0
    record = finetune(removed, tmp_path / "d", _config())
    model, manifest = load_artifact(tmp_path / "d")
    assert isinstance(model.blocks[1], MLPOnlyBlock) and float(model.blocks[1].scale) == 2.0
    assert manifest["plan"] == "attnrm:blocks=1" and record["phases"]["dilution"]["blocks"] == [1]
    assert not any(k.startswith("blocks.1.attn.") for k in load_file(str(tmp_path / "d" / "model.safetensors")))
