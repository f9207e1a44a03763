"""The method registry: a new method is one module and its registration, and every seam finds it."""

from __future__ import annotations

import json

import pytest
import torch

from edge.cli import build_parser
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.cost import analytic_flops, measured_flops
from edge.compress.finetune import select_trainable
from edge.compress.method import Method
from edge.compress.plan import parse_plan
from edge.compress.registry import method_named, methods, register_method, registered, unregister_method
from edge.errors import EdgeError
from edge.models import create_model

from .toy_method import Gain, GainMethod

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
SOURCE = {"model": TINY, "img_size": None}


@pytest.fixture
def toy():
    with registered(GainMethod()) as method:
        yield method


def test_built_in_methods_are_registered_in_application_order():
    assert [m.name for m in methods()] == ["block-approximation", "attnrm", "dwconv", "wpac"]
    assert "linear" in method_named("block-approximation").keywords


def test_the_registry_refuses_a_second_method_with_a_taken_name_or_keyword(toy):
    class SameName(GainMethod):
        keywords = ("other",)
        step_types = ()

    class SameKeyword(GainMethod):
        name = "another"
        keywords = ("linear",)
        step_types = ()

    with pytest.raises(ValueError, match="'toy-gain' is already registered"):
        register_method(SameName())
    with pytest.raises(ValueError, match="claims plan keyword.s. linear of method 'block-approximation'"):
        register_method(SameKeyword())


def test_an_unregistered_keyword_is_unknown_and_the_message_lists_the_registry(toy):
    with pytest.raises(EdgeError, match="one of identity, .*dwconv, wpac, gain"):
        parse_plan("gian:blocks=1")
    assert isinstance(method_named("toy-gain"), Method)


def test_a_toy_method_goes_through_plan_compress_artifact_flops_help_and_finetune(toy, tmp_path, capsys):
    plan = parse_plan("gain:blocks=1+2:value=0.5, dwconv:blocks=3:init=gaussian")
    assert str(plan) == "dwconv:blocks=3:init=gaussian,gain:blocks=1+2:value=0.5"   # registry order
    torch.manual_seed(0)
    model, manifest = compress(create_model(TINY), SOURCE,
                               CompressConfig(plan=str(plan), data="fmnist-mini", samples=16))
    assert [isinstance(model.blocks[i].mlp, Gain) for i in range(4)] == [False, True, True, False]
    assert manifest["fit"]["gain"] == {"1": 0.5, "2": 0.5}
    assert [(e["method"], e["step"], e["record"].get("blocks")) for e in manifest["steps"]] == \
        [("dwconv", "dwconv:blocks=3:init=gaussian", None), ("toy-gain", "gain:blocks=1+2:value=0.5", [1, 2])]
    # FLOPs: the MLPs of blocks 1 and 2 are gone; the Gain modules count their own (none)
    assert manifest["after"]["flops"] == manifest["after"]["flops_analytic"] < manifest["before"]["flops"]
    save_artifact(model, tmp_path / "art", manifest)
    assert json.loads((tmp_path / "art" / "edge-model.json").read_text())["steps"][1]["method"] == "toy-gain"
    restored, _ = load_artifact(tmp_path / "art")
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), rtol=0, atol=0)
    assert measured_flops(restored, (1, 28, 28)) == analytic_flops(restored)
    # fine-tuning with --train replaced trains the toy's parameters too
    trainable = select_trainable(restored, "replaced")
    assert trainable == 2 + sum(p.numel() for p in restored.blocks[3].attn.parameters())
    assert restored.blocks[1].mlp.gain.requires_grad and not restored.blocks[0].mlp.fc1.weight.requires_grad
    # the CLI help shows its grammar
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compress", "--help"])
    assert "gain:blocks=1+2" in " ".join(capsys.readouterr().out.split())


def test_an_artifact_of_a_method_this_edge_lacks_is_refused_clearly(toy, tmp_path):
    model, manifest = compress(create_model(TINY), SOURCE,
                               CompressConfig(plan="gain:blocks=1", data="fmnist-mini", samples=8))
    save_artifact(model, tmp_path / "art", manifest)
    unregister_method("toy-gain")
    try:
        with pytest.raises(EdgeError, match="uses compression method.s. toy-gain, which this edge does not have"):
            load_artifact(tmp_path / "art")
    finally:
        register_method(toy)
