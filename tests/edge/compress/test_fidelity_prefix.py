"""Scoring a candidate from its first changed block (edge.compress.fidelity): the very bits of the full forward."""

from __future__ import annotations

import copy

import pytest
import torch

from edge._compat import ensure_torchvision_importable

ensure_torchvision_importable()

from timm.models.vision_transformer import VisionTransformer  # noqa: E402

from edge.compress import CompressConfig  # noqa: E402
from edge.compress.compressor import apply_plan  # noqa: E402
from edge.compress.fidelity import Reference, candidate_outputs, fidelity, outputs, plain_vit, reference  # noqa: E402
from edge.compress.plan import parse_plan  # noqa: E402
from edge.data import calibration_set, holdout_set  # noqa: E402
from edge.data.preprocess import InputSpec  # noqa: E402
from edge.models import create_model  # noqa: E402
from edge.models.zoo import data_config  # noqa: E402

CALIBRATION = CompressConfig(plan="", data="fmnist-mini", samples=40)


@pytest.fixture(scope="module")
def deit():
    """fmnist-deit-tiny (12 blocks), 72 held-out images (two batches: 64 and 8), its reference."""
    model = create_model("fmnist-deit-tiny").eval()
    holdout = holdout_set("fmnist-mini", 72, 0, calibration=CALIBRATION.samples)
    inputs = holdout.inputs(InputSpec.from_data_config(data_config(model)))
    return model, reference(model, inputs), calibration_set("fmnist-mini", CALIBRATION.samples, 0)


def compressed(model, text: str, calibration):
    candidate = copy.deepcopy(model)
    with torch.no_grad():
        apply_plan(candidate, parse_plan(text).validate(len(model.blocks)), CALIBRATION, calibration)
    return candidate.eval()


def assert_full_path_bits(candidate, ref: Reference) -> tuple[int, dict]:
    """The candidate's outputs and scores from the cache are those of its full forward, bit for bit; (the k used,
    the scores)."""
    (logits, features), k = candidate_outputs(candidate, ref)
    full_logits, full_features = outputs(candidate, ref.inputs)
    assert torch.equal(logits, full_logits) and torch.equal(features, full_features)
    score = fidelity(candidate, ref)
    assert score == fidelity(candidate, Reference(ref.logits, ref.features, ref.inputs))
    return k, score


def test_the_reference_kept_every_block_input_and_its_outputs_are_the_full_forwards(deit):
    model, ref, _ = deit
    logits, features = outputs(model, ref.inputs)
    assert torch.equal(ref.logits, logits) and torch.equal(ref.features, features)
    assert [len(batch) for batch in ref.blocks.tokens] == [13, 13]          # block inputs 0..11 and the norm's
    assert [batch[0].shape for batch in ref.blocks.tokens] == [(64, 50, 192), (8, 50, 192)]
    assert assert_full_path_bits(model, ref) == (12, {"feature_rel_error": 0.0, "kl": 0.0, "agreement": 1.0})


@pytest.mark.parametrize("text, k", [
    ("linear:6-9", 7),                           # blocks 7..9 become one map after block 6
    ("dwconv:blocks=9", 9),
    ("attnrm:blocks=5:init=affine", 5),
    ("wpac:qk=1:v=1:mlp=0.25:blocks=2", 2),
    ("wpac:keep=0.75", 0),                       # every block narrowed: the full forward
    ("dwconv:blocks=0", 0),                      # block 0 changed: the full forward
    ("linear:6-9,dwconv:blocks=3", 3),           # the first change counts
])
def test_a_candidate_is_run_from_its_first_changed_block_with_the_full_forwards_scores(deit, text, k):
    model, ref, calibration = deit
    candidate = compressed(model, text, calibration)
    used, score = assert_full_path_bits(candidate, ref)
    assert used == k and score["kl"] > 0


def test_a_forward_hook_or_a_changed_embedding_ends_the_shared_prefix_and_the_cache_stays_as_it_was(deit):
    model, ref, _ = deit
    kept = [batch[4].clone() for batch in ref.blocks.tokens]
    hooked = copy.deepcopy(model)   # a hook that doubles block 4's input in place, the cached tensor were it given
    hooked.blocks[4].register_forward_pre_hook(lambda module, args: args[0].mul_(2.0))
    assert assert_full_path_bits(hooked, ref)[0] == 4
    assert all(torch.equal(batch[4], before) for batch, before in zip(ref.blocks.tokens, kept))
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.pos_embed[0, 1, 0] += 1e-3
    assert assert_full_path_bits(moved, ref)[0] == 0


class ScaledFeatures(VisionTransformer):
    """A ViT whose forward_features is not timm's: its blocks' inputs are not what the cache would hold."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward_features(x) * 0.5


def test_a_model_whose_forward_features_is_not_timms_vits_is_run_whole():
    torch.manual_seed(0)
    geometry = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, depth=2, embed_dim=32, num_heads=2)
    inputs = torch.randn(70, 1, 28, 28)
    scaled, plain = ScaledFeatures(**geometry).eval(), VisionTransformer(**geometry).eval()
    assert not plain_vit(scaled) and plain_vit(plain)
    ref = reference(scaled, inputs)
    assert ref.blocks is None
    candidate = copy.deepcopy(scaled)
    with torch.no_grad():
        candidate.blocks[1].mlp.fc2.weight.mul_(0.5)
    used, score = assert_full_path_bits(candidate, ref)
    assert used == 0 and score["kl"] > 0
    plain.load_state_dict(scaled.state_dict())   # the same weights, timm's forward: the prefix is used
    assert candidate_outputs(copy.deepcopy(plain), reference(plain, inputs))[1] == 2
    plain.set_grad_checkpointing(True)           # checkpointed blocks, or another batch: no cache
    assert reference(plain, inputs).blocks is None
    plain.set_grad_checkpointing(False)
    assert reference(plain, inputs, batch_size=32).blocks is None


def test_a_timm_whose_forward_features_does_more_than_the_stages_keeps_no_cache(monkeypatch):
    """Should a timm release add a stage to VisionTransformer.forward_features, the stage-by-stage reference
    would no longer be its forward: the first batch is checked against it, and candidates then run whole."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=28, patch_size=7, in_chans=1, num_classes=10, depth=2, embed_dim=32,
                              num_heads=2).eval()
    inputs = torch.randn(70, 1, 28, 28)
    assert reference(model, inputs).blocks is not None
    timms_own = VisionTransformer.forward_features
    monkeypatch.setattr(VisionTransformer, "forward_features", lambda self, x: timms_own(self, x) + 1.0)
    assert plain_vit(model)   # it is still timm's own forward_features, as far as the type can tell
    ref = reference(model, inputs)
    assert ref.blocks is None
    assert torch.equal(ref.features, outputs(model, inputs)[1])
