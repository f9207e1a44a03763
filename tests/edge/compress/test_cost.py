"""FLOPs of every timm ``VisionTransformer`` head and token layout edge supports (issue 13, finding 15).

Attention pooling (``global_pool='map'``, SigLIP's head) crashed torch's FLOP counter under
``no_grad``; each variant is compressed end to end at a tiny size and both counts must agree.
"""

import pytest
import torch

from edge.cli import main
from edge.compress import CompressConfig, compress
from edge.compress.cost import analytic_flops, measured_flops
from edge.models import create_model, data_config

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=32,num_heads=2"
VARIANTS = {
    "class-token": "",
    "no-class-token-avg": ",class_token=False,global_pool=avg",
    "avg-pool": ",global_pool=avg",
    "map-pool": ",global_pool=map",
    "map-pool-no-class-token": ",class_token=False,global_pool=map",
    "map-pool-with-prefix": ",reg_tokens=2,global_pool=map,pool_include_prefix=True",
    "prr-pool": ",global_pool=prr",
    "reg-tokens": ",reg_tokens=4",
    "fc-norm": ",fc_norm=True",
    "headless": ",num_classes=0",
}


@pytest.mark.parametrize("options", VARIANTS.values(), ids=VARIANTS.keys())
def test_measured_flops_equal_the_analytic_count(options):
    torch.manual_seed(0)
    model = create_model(TINY + options)
    assert measured_flops(model, (1, 28, 28)) == analytic_flops(model)
    with torch.inference_mode():  # a caller's inference mode changes nothing
        assert measured_flops(model, (1, 28, 28)) == analytic_flops(model)
    assert all(p.requires_grad for p in model.parameters())  # counting leaves the model as it was


def test_map_head_flops_by_hand():
    """One latent query attends over the 16 patch tokens: q, proj and the MLP see 1 token, kv sees 16."""
    model = create_model(TINY + ",global_pool=map")
    plain = create_model(TINY + ",global_pool=token")
    d, n = 32, 16
    head = 2 * (d * d + n * d * 2 * d + 2 * n * d + d * d + 2 * d * 4 * d)
    assert analytic_flops(model) - analytic_flops(plain) == head


@pytest.mark.parametrize("options", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_variant_compresses(options):
    torch.manual_seed(0)
    model = create_model(TINY + options)
    source = {"model": TINY + options, "weights": None, "img_size": None}
    config = CompressConfig(plan="linear:0-1", data="fmnist-mini", samples=20)
    _, manifest = compress(model, source, config)
    for side in ("before", "after"):
        assert manifest[side]["flops"] == manifest[side]["flops_analytic"]
    assert manifest["after"]["flops"] < manifest["before"]["flops"]


def test_map_pool_vit_compresses_and_exports_through_the_cli(tmp_path, capsys):
    spec = TINY + ",global_pool=map"
    art, onnx_file = tmp_path / "art", tmp_path / "art.onnx"
    assert main(["compress", spec, "--plan", "linear:0-1", "--data", "fmnist-mini", "--samples", "20",
                 "--out", str(art)]) == 0
    assert main(["export", str(art), "--out", str(onnx_file)]) == 0
    assert onnx_file.is_file() and data_config(create_model(spec))["input_size"] == (1, 28, 28)
    assert "Traceback" not in capsys.readouterr().err
