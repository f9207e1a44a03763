import collections
import json

import onnx
import pytest
import torch
from torch import nn

from edge.analysis import nose
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.cost import analytic_flops, measured_flops
from edge.compress.methods.attnrm.module import AffineAttention, AttnRmStep, MLPOnlyBlock
from edge.compress.methods.block_approximation.module import ApproximatedSpan
from edge.compress.methods.dwconv.module import DepthwiseAttention
from edge.compress.plan import parse_plan, plan_grammar
from edge.data import ArrayPreprocess, InputSpec, calibration_set
from edge.errors import EdgeError
from edge.export import export
from edge.graph.clean import clean_file
from edge.models import create_model, data_config
from edge.models.info import original_block_indices

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
SOURCE = {"model": TINY, "weights": None, "img_size": None}
D, T = 32, 17   # TINY's width and tokens (16 patches + [CLS])


def tiny(seed=0):
    torch.manual_seed(seed)
    return create_model(TINY)


def run(plan, samples=24, model=None, spec=TINY):
    return compress(model if model is not None else tiny(), {"model": spec, "weights": None, "img_size": None},
                    CompressConfig(plan=plan, data="fmnist-mini", samples=samples))


def images(model, n=3, seed=0):
    torch.manual_seed(seed)
    return torch.randn(n, *data_config(model)["input_size"])


def by_hand(original, x, removed, scale=1.0):
    """The original model with the attention sub-layer of ``removed`` taken out, written out op by op."""
    h = original.norm_pre(original._pos_embed(original.patch_embed(x)))
    for i, block in enumerate(original.blocks):
        if i in removed:
            h = scale * h
            h = h + block.mlp(block.norm2(h))
        else:
            h = block(h)
    return original.forward_head(original.norm(h))


# ---- plan grammar ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,canonical", [
    ("attnrm:blocks=3+0+1", "attnrm:blocks=0+1+3"),
    ("ATTNRM:blocks=2:init=affine:ridge=0.01", "attnrm:blocks=2:init=affine:ridge=0.01"),
    ("attnrm:auto=4", "attnrm:auto=4"),
    ("attnrm:auto=3:select=random:seed=5", "attnrm:auto=3:seed=5:select=random"),
    ("dwconv:blocks=5,attnrm:auto=2:select=first,linear:2-4", "linear:2-4,attnrm:auto=2:select=first,dwconv:blocks=5"),
])
def test_plan_text_is_canonical_and_reparses(text, canonical):
    plan = parse_plan(text)
    assert str(plan) == canonical and str(parse_plan(canonical)) == canonical
    plan.validate(12)


def test_grammar_is_in_the_help():
    grammar = plan_grammar()
    assert "attnrm:blocks=0+1+3" in grammar and "attnrm:auto=K" in grammar and "select=random:seed=S" in grammar


@pytest.mark.parametrize("plan,message", [
    ("attnrm", "does not say which attention"),
    ("attnrm:blocks=a+b", "does not list blocks"),
    ("attnrm:auto=0", "positive block count"),
    ("attnrm:auto=2:select=best", "select=best"),
    ("attnrm:auto=2:select=random:seed=-1", "seed=-1"),
    ("attnrm:auto=2:select=random:seed=x", "seed=x .* not an int"),
    ("attnrm:auto=2:seed=3", "seed= .* select=random only"),
    ("attnrm:blocks=1:select=first", "nothing is selected"),
    ("attnrm:blocks=1:init=zero", "init=zero"),
    ("attnrm:blocks=1:ridge=0.1", "init=affine only"),
    ("attnrm:blocks=1:init=affine:ridge=-1", r"ridge=-1 .* out of range\n.*expected: ridge >= 0"),
    ("attnrm:blocks=1:k=3", "unknown option 'k'"),
])
def test_bad_step_text_is_explained(plan, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan)


@pytest.mark.parametrize("plan,blocks,message", [
    ("attnrm:auto=12", 12, "12 attention layers, 12 blocks are free"),
    ("attnrm:auto=13", 12, "13 attention layers, 12 blocks are free"),
    ("linear:2-4,attnrm:auto=10", 12, "10 attention layers, 10 blocks are free"),
    ("linear:2-4,attnrm:blocks=3", 12, "removes the attention of block 3, which linear:2-4 replaces as a whole"),
    ("attnrm:blocks=5,dwconv:blocks=5", 12, "both replace attention in block 5"),
    ("attnrm:blocks=1+2,attnrm:blocks=2:init=affine", 12, "both replace the attention of block 2"),
    ("attnrm:blocks=12", 12, "out of range for a model with 12 blocks"),
    ("attnrm:auto=1,attnrm:auto=2:select=first", 12, "2 automatic attnrm steps"),
    ("attnrm:blocks=0+1+2+3", 4, "every block it keeps"),
    ("skip:-1-1,attnrm:blocks=2+3", 4, "every block it keeps"),
])
def test_bad_plans_are_refused_before_anything_runs(plan, blocks, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan).validate(blocks)


def test_auto_with_too_few_free_blocks_left_by_dwconv_is_refused_when_built():
    # validation cannot know yet that dwconv takes blocks 0 and 1: the build counts 2 free blocks
    with pytest.raises(EdgeError, match=r"2 attention layers, 2 blocks are free \(2\+3\)"):
        run("attnrm:auto=2:select=first,dwconv:blocks=0+1:init=gaussian", samples=10)


def test_a_block_that_is_not_timms_prenorm_block_is_refused():
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import ResPostBlock

    model = tiny()
    old = model.blocks[1]
    post = ResPostBlock(D, 2, qkv_bias=True)
    post.load_state_dict(old.state_dict(), strict=False)
    model.blocks[1] = post
    with pytest.raises(EdgeError, match="blocks\\[1\\] is a ResPostBlock"):
        run("attnrm:blocks=1", model=model, samples=10)


# ---- the modules ----------------------------------------------------------------------------------

def test_identity_block_equals_removing_the_attention_sublayer_by_hand():
    model, _ = run("attnrm:blocks=0+2")
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), by_hand(tiny(), x, {0, 2}), rtol=0, atol=0)
    assert [type(b).__name__ for b in model.blocks] == ["MLPOnlyBlock", "Block", "MLPOnlyBlock", "Block"]
    assert original_block_indices(model.blocks) == [(0,), (1,), (2,), (3,)]


def test_identity_blocks_keep_no_attention_weight():
    model, _ = run("attnrm:blocks=0+2,attnrm:blocks=3:init=affine")
    keys = set(model.state_dict())
    for block in (0, 2):
        mine = {k for k in keys if k.startswith(f"blocks.{block}.")}
        assert mine and all(".attn." not in k and ".norm1." not in k and ".ls1." not in k for k in mine), mine
        assert f"blocks.{block}.scale" in keys and f"blocks.{block}.mlp.fc1.weight" in keys
    assert not any(k.startswith("blocks.3.attn.qkv") or k.startswith("blocks.3.attn.proj") for k in keys)
    assert {"blocks.3.attn.map.weight", "blocks.3.attn.map.bias", "blocks.3.norm1.weight"} <= keys


def test_scale_two_folds_into_the_layernorm_epsilon_within_tolerance():
    block = tiny().blocks[1]
    x = torch.randn(4, T, D) * 3
    reference = 2 * x + block.mlp(block.norm2(2 * x))   # Eq. 9 at M = 0, as written
    folded = MLPOnlyBlock.from_block(block, scale=2.0, index=1)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), reference.detach(), rtol=0, atol=1e-5)
        # a norm that is not a LayerNorm gets norm2(2 x) as written: the same bits
        rms = MLPOnlyBlock(nn.RMSNorm(D, eps=1e-6), block.mlp, scale=2.0)
        assert torch.equal(rms(x), 2 * x + block.mlp(rms.norm2(2 * x)))
        one = MLPOnlyBlock.from_block(block, scale=1.0)
        assert torch.equal(one(x), x + block.mlp(block.norm2(x)))


def test_affine_fit_equals_a_direct_float64_least_squares():
    ridge = 1e-3
    model, manifest = run(f"attnrm:blocks=1:init=affine:ridge={ridge}", samples=24)
    original = tiny()
    calib = calibration_set("fmnist-mini", 24)
    spec = InputSpec.from_data_config(data_config(original))
    rows = []
    handle = original.blocks[1].attn.register_forward_hook(lambda _m, a, out: rows.append((a[0], out)))
    with torch.no_grad():
        original.forward_features(ArrayPreprocess(spec)(calib.images))
    handle.remove()
    x = torch.cat([r[0] for r in rows]).reshape(-1, D).double()
    y = torch.cat([r[1] for r in rows]).reshape(-1, D).double()
    xc, yc = x - x.mean(0), y - y.mean(0)
    lam = ridge * float((xc * xc).sum()) / D   # the relative ridge: ridge x mean eigenvalue of Xc^T Xc
    # ridge regression as one least-squares problem: [Xc; sqrt(lam) I] W = [Yc; 0]
    weight = torch.linalg.lstsq(torch.cat([xc, lam ** 0.5 * torch.eye(D, dtype=torch.float64)]),
                                torch.cat([yc, torch.zeros(D, D, dtype=torch.float64)])).solution
    bias = y.mean(0) - x.mean(0) @ weight
    module = model.blocks[1].attn
    assert isinstance(module, AffineAttention) and x.shape[0] == 24 * T
    torch.testing.assert_close(module.map.weight.double().T, weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(module.map.bias.double(), bias, rtol=0, atol=1e-6)
    stats = manifest["fit"]["attnrm"]["affine"]["1"]
    assert stats["tokens"] == 24 * T and 0 < stats["r2"] < 1 and stats["ridge"] == ridge


def test_affine_is_closer_to_the_original_than_identity():
    calib = calibration_set("fmnist-mini", 24)
    x = ArrayPreprocess(InputSpec.from_data_config(data_config(tiny())))(calib.images)
    with torch.no_grad():
        reference = tiny().forward_features(x)
        error = {init: (run(f"attnrm:blocks=1+2:init={init}")[0].forward_features(x) - reference).norm().item()
                 for init in ("identity", "affine")}
    assert error["affine"] < error["identity"]


# ---- compress, restore, FLOPs ------------------------------------------------------------------

def _attention_flops(tokens, dim):
    return 2 * tokens * dim * 3 * dim + 2 * tokens * dim * dim + 2 * 2 * tokens * tokens * dim


def test_flops_and_params_drop_by_the_attention_they_remove():
    model, manifest = run("attnrm:blocks=0+2,attnrm:blocks=3:init=affine")
    before, after = manifest["before"], manifest["after"]
    assert after["flops"] == after["flops_analytic"] == analytic_flops(model)
    # identity: qkv, q k^T, attn v and proj go; affine: all but one D x D map (the cost of proj)
    saved = 2 * _attention_flops(T, D) + _attention_flops(T, D) - 2 * T * D * D
    assert before["flops"] - after["flops"] == saved
    # identity: qkv, proj, norm1 go; affine: qkv goes (its map is the size of proj)
    assert before["params"] - after["params"] == 2 * (4 * D * D + 4 * D + 2 * D) + (3 * D * D + 3 * D)


@pytest.mark.parametrize("plan,resolved", [
    ("attnrm:blocks=0+2,attnrm:blocks=3:init=affine", "attnrm:blocks=0+2,attnrm:blocks=3:init=affine"),
    ("attnrm:auto=2:select=first", "attnrm:blocks=0+1"),
    ("linear:0-1,attnrm:blocks=2,dwconv:blocks=3:init=gaussian",
     "linear:0-1,attnrm:blocks=2,dwconv:blocks=3:init=gaussian"),
    # first free = 0 (a span removes 1); dwconv:auto leaves out the blocks attnrm took
    ("linear:0-1,attnrm:auto=1:select=first:init=affine,dwconv:auto=2:init=gaussian",
     "linear:0-1,attnrm:blocks=0:init=affine,dwconv:blocks=2+3:init=gaussian"),
])
def test_compress_composes_and_restores_exactly(tmp_path, plan, resolved):
    model, manifest = run(plan)
    assert manifest["plan"] == resolved
    for block in model.blocks:   # a dilution result by hand: scale 2 lives in the weights only
        if isinstance(block, MLPOnlyBlock):
            block.scale.fill_(2.0)
    save_artifact(model, tmp_path / "art", manifest)
    restored, saved = load_artifact(tmp_path / "art")   # no calibration data needed
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), rtol=0, atol=0)
    assert [float(b.scale) for b in restored.blocks if isinstance(b, MLPOnlyBlock)] == \
        [2.0] * sum(isinstance(b, MLPOnlyBlock) for b in model.blocks)
    assert [type(b).__name__ for b in restored.blocks] == [type(b).__name__ for b in model.blocks]
    record = json.loads((tmp_path / "art" / "edge-model.json").read_text())
    assert [e["step"] for e in record["steps"]] == resolved.split(",")
    assert measured_flops(restored, (1, 28, 28)) == analytic_flops(restored)


def test_compose_with_span_and_dwconv_places_each_module_at_its_seam():
    model, _ = run("linear:0-1,attnrm:blocks=2,dwconv:blocks=3:init=gaussian")
    assert original_block_indices(model.blocks) == [(0,), (1,), (2,), (3,)]
    assert isinstance(model.blocks[1], ApproximatedSpan)
    assert isinstance(model.blocks[2], MLPOnlyBlock) and model.blocks[2].index == 2
    assert isinstance(model.blocks[3].attn, DepthwiseAttention)


def test_random_selection_is_seeded_and_recorded():
    a = run("attnrm:auto=2:select=random:seed=7")[1]
    b = run("attnrm:auto=2:select=random:seed=7")[1]
    assert a["plan"] == b["plan"]
    decided = a["fit"]["attnrm"]["selection"]["attnrm:auto=2:seed=7:select=random"]
    assert decided["seed"] == 7 and decided["select"] == "random" and decided["free"] == [0, 1, 2, 3]
    assert a["plan"] == "attnrm:blocks=" + "+".join(map(str, sorted(decided["order"])))
    seeds = {run(f"attnrm:auto=2:select=random:seed={s}")[1]["plan"] for s in range(6)}
    assert len(seeds) > 1


def test_nose_is_called_with_the_free_blocks_and_its_trajectory_is_kept(monkeypatch):
    calls = []
    trajectory = [{"step": 0, "block": 3, "te": 0.1}, {"step": 0, "block": 2, "te": 0.2}]

    def fake_nose(model, calibration, spec, count, excluded, batch_size, device=None):
        calls.append((count, set(excluded), batch_size, len(calibration), spec.height))
        return [3], trajectory

    monkeypatch.setattr(nose, "nose_select", fake_nose)
    model, manifest = run("linear:-1-0,attnrm:auto=1,dwconv:blocks=1:init=gaussian")
    assert calls == [(1, {0, 1}, 64, 24, 28)]   # span block 0 and dwconv's block 1 are not candidates
    assert manifest["plan"] == "linear:-1-0,attnrm:blocks=3,dwconv:blocks=1:init=gaussian"
    assert manifest["planner"] == trajectory
    assert manifest["fit"]["attnrm"]["selection"]["attnrm:auto=1"]["order"] == [3]
    assert isinstance(model.blocks[3], MLPOnlyBlock)


# ---- export and clean ----------------------------------------------------------------------------

def _ops(path):
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _block_nodes(path, block):
    return [n for n in onnx.load(str(path)).graph.node if f"blocks.{block}/" in n.name]


def _export_and_clean(model, plan, tmp_path, spec=TINY):
    report = export(model, tmp_path / "m.onnx", source=spec, plan=plan, data_config=data_config(model))
    assert all(r["passed"] for r in report["verification"])   # max abs <= 1e-4, rel L2 <= 1e-5 (edge.check.compare)
    cleaned = clean_file(tmp_path / "m.onnx", tmp_path / "c.onnx")
    assert all(r["passed"] for r in cleaned["verification"])
    return tmp_path / "c.onnx"


def _assert_no_attention_left(path, removed, affine=()):
    for block in (*removed, *affine):
        nodes = _block_nodes(path, block)
        products = [n for n in nodes if n.op_type in ("MatMul", "Gemm")]
        assert not [n for n in nodes if n.op_type in ("Softmax", "Split", "Transpose")], block
        # what is left: fc1 and fc2 (and the affine map)
        assert len(products) == 2 + (block in affine), [n.name for n in products]
        assert all("mlp" in n.name or "attn/map" in n.name for n in products)


def test_export_and_clean_leave_no_trace_of_the_removed_attention(tmp_path):
    model, manifest = run("attnrm:blocks=0+2,attnrm:blocks=3:init=affine")
    model.blocks[2].scale.fill_(2.0)   # as dilution leaves it
    path = _export_and_clean(model, manifest["plan"], tmp_path)
    ops = _ops(path)
    assert ops["Softmax"] == 4 - 3
    _assert_no_attention_left(path, (0, 2), affine=(3,))
    # scale 2: the LayerNorm reads x with eps / 4, the Mul by 2 feeds the residual Add only
    nodes = _block_nodes(path, 2)
    norm = next(n for n in nodes if n.op_type == "LayerNormalization")
    mul = next(n for n in nodes if n.op_type == "Mul" and "mlp" not in n.name)
    assert next(a.f for a in norm.attribute if a.name == "epsilon") == pytest.approx(1e-6 / 4, rel=1e-6)
    assert norm.input[0] == mul.input[0]
    assert not [n for n in _block_nodes(path, 0) if n.op_type == "Mul" and "mlp" not in n.name]   # scale 1


def test_registers_without_class_token_export_and_clean(tmp_path):
    spec = TINY + ",reg_tokens=4,class_token=False,global_pool=avg,no_embed_class=True"
    model, manifest = run("attnrm:blocks=1,attnrm:blocks=3:init=affine", model=tiny_timm(spec), spec=spec)
    assert model.num_prefix_tokens == 4 and not model.has_class_token
    path = _export_and_clean(model, manifest["plan"], tmp_path, spec=spec)
    assert _ops(path)["Softmax"] == 4 - 2
    _assert_no_attention_left(path, (1,), affine=(3,))


@pytest.mark.slow   # about 12 s: export and clean of 12 blocks
def test_reference_model_exports_clean_with_twelve_minus_k_softmaxes(tmp_path):
    model = create_model("fmnist-deit-tiny")
    model, manifest = run("attnrm:blocks=0+1+3+4", samples=10, model=model, spec="fmnist-deit-tiny")
    model.blocks[1].scale.fill_(2.0)
    path = _export_and_clean(model, manifest["plan"], tmp_path, spec="fmnist-deit-tiny")
    assert _ops(path)["Softmax"] == 12 - 4
    _assert_no_attention_left(path, (0, 1, 3, 4))


SMALL = "timm:vit_small_patch16_224,img_size=32"
REGISTERS = "timm:vit_small_patch16_224,img_size=32,reg_tokens=4,no_embed_class=True"


@pytest.mark.slow   # 20-30 s each: a 22 M-parameter model created, exported and cleaned
@pytest.mark.parametrize("spec,prefix", [(SMALL, 1), (REGISTERS, 5)])
def test_timm_models_compress_export_and_clean(tmp_path, spec, prefix):
    model, manifest = run("attnrm:blocks=0+5,attnrm:blocks=9:init=affine", samples=8, model=tiny_timm(spec),
                          spec=spec)
    assert model.num_prefix_tokens == prefix and len(model.blocks) == 12
    assert manifest["after"]["flops"] == manifest["after"]["flops_analytic"] < manifest["before"]["flops"]
    model.blocks[5].scale.fill_(2.0)
    path = _export_and_clean(model, manifest["plan"], tmp_path, spec=spec)
    assert _ops(path)["Softmax"] == 12 - 3
    _assert_no_attention_left(path, (0, 5), affine=(9,))


def tiny_timm(spec):
    torch.manual_seed(0)
    return create_model(spec)


def test_step_object_text():
    assert str(AttnRmStep(blocks=(0, 4))) == "attnrm:blocks=0+4"
    assert str(AttnRmStep(auto=3, options={"select": "first"})) == "attnrm:auto=3:select=first"
    assert not AttnRmStep(auto=3).is_resolved and AttnRmStep(blocks=(1,)).option("init") == "identity"
