"""Shared by the fine-tuning tests (distillation, dilution): a tiny ViT and a teacher trained briefly."""

import pytest

from edge.train import TrainConfig, train

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"


@pytest.fixture(scope="session")  # trained once for every fine-tuning test module (12 s)
def teacher_weights(tmp_path_factory):
    """A tiny ViT trained for 32 steps on fmnist-mini (a random one has near-constant, ill-conditioned logits)."""
    out = tmp_path_factory.mktemp("teacher")
    train(TrainConfig(model=TINY, data="fmnist-mini", epochs=4, batch_size=32, train_samples=256, warmup_steps=4,
                      threads=1, amp="off", save_dtype="float32", eval_every_epoch=False), out)
    return out / "model.safetensors"
