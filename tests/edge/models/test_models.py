import pytest
import torch

from edge.errors import EdgeError
from edge.models import create_model, data_config, model_info, parse_model_spec
from edge.models.zoo import ModelSpec

# spec, img_size, (blocks, prefix tokens, class token, registers, grid, embed dim, heads)
ARCHITECTURES = [
    ("timm:vit_tiny_patch16_224", None, (12, 1, True, 0, (14, 14), 192, 3)),
    ("timm:vit_small_patch16_224", None, (12, 1, True, 0, (14, 14), 384, 6)),
    ("timm:vit_base_patch16_224", None, (12, 1, True, 0, (14, 14), 768, 12)),
    ("timm:deit_tiny_patch16_224", None, (12, 1, True, 0, (14, 14), 192, 3)),
    ("timm:deit_small_patch16_224", None, (12, 1, True, 0, (14, 14), 384, 6)),
    ("timm:deit3_small_patch16_224", None, (12, 1, True, 0, (14, 14), 384, 6)),
    ("timm:vit_small_patch14_dinov2", 224, (12, 1, True, 0, (16, 16), 384, 6)),
    ("timm:vit_small_patch14_reg4_dinov2", 224, (12, 5, True, 4, (16, 16), 384, 6)),
    ("timm:vit_base_patch16_clip_224", None, (12, 1, True, 0, (14, 14), 768, 12)),
    ("timm:vit_small_patch16_224,class_token=False,global_pool=avg", None, (12, 0, False, 0, (14, 14), 384, 6)),
    ("fmnist-deit-tiny", None, (12, 1, True, 0, (7, 7), 192, 3)),
]


@pytest.mark.parametrize("spec,img_size,expected", ARCHITECTURES, ids=[a[0] for a in ARCHITECTURES])
def test_architecture_builds_runs_and_reports_geometry(spec, img_size, expected):
    torch.manual_seed(0)
    model = create_model(spec, img_size=img_size, pretrained_weights=False)
    info = model_info(model)
    blocks, prefix, cls, regs, grid, dim, heads = expected
    tokens_info = (info.num_blocks, info.num_prefix_tokens, info.has_class_token, info.num_reg_tokens)
    assert tokens_info == (blocks, prefix, cls, regs)
    assert (info.grid, info.embed_dim, info.num_heads) == (grid, dim, (heads,) * blocks)
    c, h, w = data_config(model)["input_size"]
    assert (h // info.patch_size[0], w // info.patch_size[1]) == grid
    x = torch.randn(1, c, h, w)
    with torch.no_grad():
        tokens = model.forward_features(x)
        logits = model(x)
    assert tokens.shape == (1, info.num_tokens, dim)
    # a headless model (DINOv2: num_classes=0) returns the pooled embedding
    assert logits.shape == (1, info.num_classes or dim) and torch.isfinite(logits).all()


def test_layerscale_and_norm_pre_are_kept():
    deit3 = create_model("timm:deit3_small_patch16_224")
    clip = create_model("timm:vit_base_patch16_clip_224")
    assert type(deit3.blocks[0].ls1).__name__ == "LayerScale"
    assert isinstance(clip.norm_pre, torch.nn.LayerNorm)


def test_dinov2_default_size_is_518():
    info = model_info(create_model("timm:vit_small_patch14_dinov2"))
    assert info.img_size == (518, 518) and info.grid == (37, 37)


def test_non_square_grid():
    spec = parse_model_spec("timm:vit_tiny_patch16_224")
    model = create_model(ModelSpec(spec.text, spec.arch, {"img_size": (224, 160)}))
    info = model_info(model)
    assert info.grid == (14, 10) and info.num_tokens == 141
    assert model.forward_features(torch.randn(1, 3, 224, 160)).shape == (1, 141, 192)


def test_reference_model_config():
    model = create_model("fmnist-deit-tiny", pretrained_weights=False)
    config = data_config(model)
    assert config["input_size"] == (1, 28, 28)
    assert config["mean"] == (0.2860,) and config["std"] == (0.3530,)
    assert model_info(model).params == 5_353_738


@pytest.mark.parametrize("name,close", [("fmnist-deit-tiy", "fmnist-deit-tiny"),
                                        ("timm:vit_smal_patch16_224", "timm:vit_small_patch16_224"),
                                        ("deit_small_patch16_224", "timm:deit_small_patch16_224")])
def test_unknown_model_lists_close_names(name, close):
    with pytest.raises(EdgeError, match="unknown model") as e:
        parse_model_spec(name)
    assert close in str(e.value)


def test_bad_model_option():
    with pytest.raises(EdgeError, match="not key=value"):
        parse_model_spec("timm:vit_tiny_patch16_224,class_token")
    with pytest.raises(EdgeError, match="does not accept these options"):
        create_model("timm:vit_tiny_patch16_224,no_such_option=1")
