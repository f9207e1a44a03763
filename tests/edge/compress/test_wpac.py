import copy

import numpy as np
import onnx
import pytest
import torch

from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.cost import analytic_flops
from edge.compress.methods.wpac.build import build_wpac, place_wpac
from edge.compress.methods.wpac.module import NarrowAttention, WpacStep, aligned_width
from edge.compress.methods.wpac.statistics import (
    WeightedMoments,
    collect_statistics,
    permutation_bases,
    principal_axes,
)
from edge.compress.plan import parse_plan, plan_grammar
from edge.data import ArrayPreprocess, InputSpec, calibration_set
from edge.errors import EdgeError
from edge.export import export
from edge.graph.clean import clean_file
from edge.models import create_model, data_config

# head dim 64, MLP 512: wide enough for the default alignments (16 per head, 64 for the MLP)
WIDE = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=128,num_heads=2"
SMALL = "timm:deit_small_patch16_224,img_size=32,num_classes=10"   # a head of the calibration set's classes
REGISTERS = "timm:vit_tiny_patch16_224,img_size=32,depth=3,reg_tokens=4,num_classes=10"


def model_of(spec, seed=0):
    torch.manual_seed(seed)
    return create_model(spec)


def run(plan, spec=WIDE, samples=16, model=None, seed=0):
    model = model if model is not None else model_of(spec)
    return compress(model, {"model": spec, "weights": None, "img_size": None},
                    CompressConfig(plan=plan, data="fmnist-mini", samples=samples, seed=seed))


def images(model, n=3, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.randn(n, *data_config(model)["input_size"], dtype=dtype)


def rotated_in_float64(model, plan="wpac:keep=1", samples=8):
    """``model`` in float64 and its copy with the plan's modules placed (built in float64 too)."""
    original = model.double().eval()
    rotated = copy.deepcopy(original)
    steps = parse_plan(plan).steps
    modules, report = build_wpac(rotated, steps, calibration_set("fmnist-mini", samples, 0),
                                 InputSpec.from_data_config(data_config(rotated)), batch_size=samples)
    place_wpac(rotated, modules)
    return original, rotated, report


# ---- plan grammar ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,canonical", [
    ("wpac:keep=0.5", "wpac:keep=0.5"),
    ("WPAC:v=0.75:qk=0.5:mlp=0.5", "wpac:mlp=0.5:qk=0.5:v=0.75"),
    ("wpac:keep=0.5:blocks=3+1:criterion=random:seed=2", "wpac:blocks=1+3:criterion=random:keep=0.5:seed=2"),
    ("wpac:keep=0.25:mlp=1:align=8:mlp_align=32", "wpac:align=8:keep=0.25:mlp=1.0:mlp_align=32"),
])
def test_plan_text_is_canonical_and_reparses(text, canonical):
    plan = parse_plan(text)
    assert str(plan) == canonical and str(parse_plan(canonical)) == canonical
    plan.validate(12)


def test_parts_default_to_keep():
    step = parse_plan("wpac:keep=0.5:mlp=1").steps[0]
    assert step.keep() == {"qk": 0.5, "v": 0.5, "mlp": 1.0}
    assert step.option("align") == 16 and step.option("mlp_align") == 64 and step.option("criterion") == "wpac"
    assert str(WpacStep(blocks=(0, 2), options={"keep": 0.5})) == "wpac:blocks=0+2:keep=0.5"


def test_grammar_is_in_the_help():
    grammar = plan_grammar()
    assert "wpac:keep=F" in grammar and "wpac:qk=F:v=F:mlp=F" in grammar and "criterion=wpac|taylor" in grammar


@pytest.mark.parametrize("plan,message", [
    ("wpac", "does not say how much to keep"),
    ("wpac:align=8", "does not say how much to keep"),
    ("wpac:keep=0", r"keep=0 .* out of range\n.*expected: 0 < keep <= 1"),
    ("wpac:keep=1.5", r"keep=1.5 .* out of range\n.*expected: 0 < keep <= 1"),
    ("wpac:qk=-0.5", r"qk=-0.5 .* out of range\n.*expected: 0 < qk <= 1"),
    ("wpac:keep=0.5:mlp=2", r"mlp=2 .* out of range\n.*expected: 0 < mlp <= 1"),
    ("wpac:keep=0.5:align=0", "align=0"),
    ("wpac:keep=0.5:mlp_align=-64", "mlp_align=-64"),
    ("wpac:keep=0.5:criterion=best", "criterion=best"),
    ("wpac:keep=0.5:seed=3", "seed= .* criterion=random only"),
    ("wpac:keep=0.5:criterion=random:seed=-1", "seed=-1"),
    ("wpac:keep=0.5:blocks=a+b", "does not list blocks"),
    ("wpac:keep=half", "keep=half .* not a float"),
    ("wpac:keep=0.5:ratio=2", "unknown option 'ratio'"),
])
def test_bad_step_text_is_explained(plan, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan)


@pytest.mark.parametrize("plan,message", [
    ("wpac:keep=0.5:blocks=12", "block 12 is out of range for a model with 12 blocks"),
    ("wpac:keep=0.5,wpac:keep=0.75:blocks=3", "both narrow block 3"),
    ("linear:2-4,wpac:keep=0.5:blocks=3", "narrows block 3, which linear:2-4 removes"),
    ("linear:2-4,wpac:keep=0.5", r"narrows block 3, .*\n.*\n.*blocks=0\+1\+2\+5\+6\+7\+8\+9\+10\+11"),
    ("attnrm:blocks=1,wpac:keep=0.5:blocks=0+1", "narrows block 1, which attnrm:blocks=1 replaces the attention of"),
    ("dwconv:blocks=5,wpac:keep=0.5", "narrows block 5, which dwconv:blocks=5 replaces the attention of"),
])
def test_wpac_on_blocks_another_step_takes_is_refused(plan, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan).validate(12)


def test_wpac_beside_other_steps_on_other_blocks_is_accepted():
    plan = parse_plan("wpac:keep=0.5:blocks=0+1+5,linear:2-4,attnrm:blocks=6,wpac:keep=0.75:blocks=7")
    assert str(plan) == "linear:2-4,attnrm:blocks=6,wpac:blocks=0+1+5:keep=0.5,wpac:blocks=7:keep=0.75"
    plan.validate(12)


# ---- widths ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("width,keep,align,expected", [
    (64, 0.5, 16, 32), (64, 0.25, 16, 16), (64, 0.75, 16, 48), (64, 0.6, 16, 32), (64, 0.65, 16, 48),
    (768, 0.5, 64, 384), (1536, 0.5, 64, 768), (48, 0.9, 32, 32), (48, 1.0, 32, 48), (64, 1.0, 128, 64),
])
def test_widths_round_to_the_nearest_multiple_of_the_alignment(width, keep, align, expected):
    assert aligned_width(width, keep, align, "w") == expected


def test_alignment_larger_than_the_width_is_refused():
    with pytest.raises(EdgeError, match="head dim is 64, smaller than the alignment 128"):
        aligned_width(64, 0.5, 128, "blocks[0] Q/K head dim")


def test_target_below_one_alignment_unit_is_refused():
    with pytest.raises(EdgeError, match=r"keeping 0.2 of 64 is 12.8, below one alignment unit of 16"):
        aligned_width(64, 0.2, 16, "blocks[0] V head dim")


@pytest.mark.parametrize("plan,message", [
    ("wpac:keep=0.5:align=128", r"blocks\[0\] Q/K head dim is 64, smaller than the alignment 128"),
    ("wpac:qk=0.5:v=0.2:mlp=1", r"blocks\[0\] V head dim: keeping 0.2 of 64 is 12.8, below one alignment unit"),
    ("wpac:keep=1:mlp=0.1", r"blocks\[0\] MLP width: keeping 0.1 of 512 is 51.2, below one alignment unit of 64"),
])
def test_bad_widths_are_refused_before_anything_is_measured(plan, message):
    with pytest.raises(EdgeError, match=message):
        run(plan)


def test_qk_norm_is_refused():
    with pytest.raises(EdgeError, match=r"blocks\[0\].attn normalises Q and K \(qk_norm\)"):
        run("wpac:keep=0.5", model=model_of(WIDE + ",qk_norm=True"), spec=WIDE + ",qk_norm=True")


# ---- statistics -----------------------------------------------------------------------------------

def test_weighted_covariance_is_centred_on_the_weighted_mean():
    torch.manual_seed(0)
    x = torch.randn(2, 50, 4, dtype=torch.float64) * 3 + 5
    w = torch.rand(2, 50, dtype=torch.float64)
    moments = WeightedMoments.zeros(2, 4)
    moments.update(x[:, :20], w[:, :20])   # streamed in two parts, as two batches (or two processes) would
    moments.update(x[:, 20:], w[:, 20:])
    for g in range(2):
        expected = np.cov(x[g].numpy().T, aweights=w[g].numpy(), bias=True)
        np.testing.assert_allclose(moments.covariance()[g].numpy(), expected, rtol=0, atol=1e-12)
        mean = (w[g, :, None] * x[g]).sum(0) / w[g].sum()
        np.testing.assert_allclose(moments.mean()[g].numpy(), mean.numpy(), rtol=0, atol=1e-12)
    assert moments.rows == 50


def test_principal_axes_are_sorted_orthonormal_and_signed():
    torch.manual_seed(0)
    a = torch.randn(3, 6, 6, dtype=torch.float64)
    cov = a @ a.transpose(1, 2)
    rotation, values = principal_axes(cov)
    assert torch.all(values[:, :-1] >= values[:, 1:])
    eye = torch.eye(6, dtype=torch.float64).expand(3, 6, 6)
    torch.testing.assert_close(rotation @ rotation.transpose(1, 2), eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(rotation @ cov @ rotation.transpose(1, 2), torch.diag_embed(values), atol=1e-10, rtol=0)
    largest = rotation.abs().argmax(-1, keepdim=True)
    assert torch.all(rotation.gather(-1, largest) > 0)


def test_permutation_bases_pick_dims_by_score():
    basis = permutation_bases(torch.tensor([[0.1, 3.0, 2.0, 3.0]], dtype=torch.float64))
    assert basis[0].argmax(-1).tolist() == [1, 3, 2, 0]   # ties keep their order


def test_taylor_importance_is_grad_times_activation_of_the_correct_class_logits():
    model = model_of(WIDE)
    data = calibration_set("fmnist-mini", 6, 0)
    spec = InputSpec.from_data_config(data_config(model))
    stats = collect_statistics(model, {1: 1}, data, spec, batch_size=4)[1]
    # by hand: one forward, the activations kept, the gradient of the summed correct-class logits
    x, labels = next(data.batches(6, ArrayPreprocess(spec)))
    kept = {}
    h1 = model.blocks[1].attn.qkv.register_forward_hook(lambda _m, _a, out: kept.setdefault("qkv", out))
    h2 = model.blocks[1].mlp.fc2.register_forward_pre_hook(lambda _m, args: kept.setdefault("hidden", args[0]))
    try:
        score = model(x.requires_grad_(True)).gather(1, labels[:, None]).sum()
        g_qkv, g_hidden = torch.autograd.grad(score, [kept["qkv"], kept["hidden"]])
    finally:
        h1.remove()
        h2.remove()
    taylor_mlp = (kept["hidden"] * g_hidden).abs().double().sum((0, 1))
    torch.testing.assert_close(stats.taylor_mlp, taylor_mlp, rtol=1e-5, atol=1e-9)
    element = (kept["qkv"] * g_qkv).abs().double().reshape(6, 17, 3, 2, 64)
    torch.testing.assert_close(stats.taylor_qkv, element.sum((0, 1)), rtol=1e-5, atol=1e-9)
    weights = element.mean(-1)   # one weight per token and head: [B, N, 3, H]
    torch.testing.assert_close(stats.v.weight, weights[:, :, 2].sum((0, 1)), rtol=1e-5, atol=1e-9)
    assert stats.images == 6 and stats.q.rows == 6 * 17


def test_no_parameter_gradient_is_left_behind():
    model = model_of(WIDE)
    run("wpac:keep=0.5", model=model)
    assert all(p.grad is None for p in model.parameters())


# ---- function preservation (float64) --------------------------------------------------------------

@pytest.mark.parametrize("spec", ["fmnist-deit-tiny", SMALL, REGISTERS])
def test_rotation_keeps_the_function(spec):
    original, rotated, report = rotated_in_float64(model_of(spec))
    x = images(original, dtype=torch.float64)
    with torch.no_grad():
        difference = (rotated(x) - original(x)).abs().max().item()
    assert difference <= 1e-5, difference   # measured about 1e-14 (float64) on all three
    # and the weights really did turn: the rotation is not the identity
    moved = (rotated.blocks[0].attn.qkv.weight[:64] - original.blocks[0].attn.qkv.weight[:64]).abs().max()
    assert moved > 1e-3
    assert report["blocks"]["0"]["qk"] == original.blocks[0].attn.head_dim
    assert report["blocks"]["0"]["qk_variance_kept"] == [1.0] * original.blocks[0].attn.num_heads


def test_leading_principal_axes_hold_most_of_the_weighted_variance():
    _, _, report = rotated_in_float64(model_of("fmnist-deit-tiny"), plan="wpac:keep=0.5", samples=8)
    shares = [s for entry in report["blocks"].values() for s in entry["v_variance_kept"] + entry["qk_variance_kept"]]
    assert min(shares) > 0.5   # half of the axes hold more than half of the variance, sorted largest first


# ---- truncation -----------------------------------------------------------------------------------

def test_keep_half_halves_every_width_and_keeps_the_scale():
    model, manifest = run("wpac:keep=0.5")
    for block in model.blocks:
        attn = block.attn
        assert isinstance(attn, NarrowAttention)
        assert (attn.num_heads, attn.qk_dim, attn.v_dim) == (2, 32, 32)
        assert attn.qkv.weight.shape == (2 * (32 + 32 + 32), 128) and attn.proj.weight.shape == (128, 64)
        assert attn.scale == pytest.approx(64 ** -0.5)
        assert block.mlp.fc1.weight.shape == (256, 128) and block.mlp.fc2.weight.shape == (128, 256)
        assert type(block.mlp).__name__ == "Mlp"
    assert manifest["after"]["flops"] == manifest["after"]["flops_analytic"] == analytic_flops(model)
    assert manifest["plan"] == "wpac:keep=0.5" and manifest["calibration"]["samples"] == 16


def test_per_part_widths_may_differ_between_qk_v_and_blocks():
    model, manifest = run("wpac:qk=0.25:v=0.75:mlp=1:blocks=0,wpac:keep=0.5:blocks=1")
    a0, a1 = model.blocks[0].attn, model.blocks[1].attn
    assert (a0.qk_dim, a0.v_dim, model.blocks[0].mlp.fc1.out_features) == (16, 48, 512)
    assert (a1.qk_dim, a1.v_dim, model.blocks[1].mlp.fc1.out_features) == (32, 32, 256)
    assert a0.qkv.out_features == 2 * (16 + 16 + 48) and a0.proj.in_features == 96
    assert manifest["after"]["flops"] == manifest["after"]["flops_analytic"]


def test_flops_count_the_attention_products():
    attn = NarrowAttention(128, 2, 16, 48, 0.125)
    tokens = 17
    linear = 2 * tokens * 128 * 2 * (16 + 16 + 48) + 2 * tokens * 96 * 128
    assert attn.flops(tokens) == linear + 2 * tokens * tokens * 2 * (16 + 48)


def test_narrow_attention_matches_its_explicit_form():
    torch.manual_seed(0)
    attn = NarrowAttention(32, 2, 16, 8, 0.2).eval()
    x = torch.randn(2, 5, 32)
    fused = attn(x)
    attn.fused_attn = False
    torch.testing.assert_close(attn(x), fused, atol=1e-6, rtol=1e-5)


def test_wpac_truncation_stays_closer_to_the_original_than_random():
    def error(criterion):
        base = model_of(WIDE)
        model, _ = run(f"wpac:qk=0.5:v=0.5:mlp=1:criterion={criterion}", model=copy.deepcopy(base))
        x = images(base, n=8)
        with torch.no_grad():
            return ((model(x) - base(x)).norm() / base(x).norm()).item()

    assert error("wpac") < error("random")


# ---- artifacts, determinism, export ---------------------------------------------------------------

def test_artifact_restores_without_data(tmp_path):
    model, manifest = run("wpac:qk=0.25:v=0.75:mlp=0.5")
    save_artifact(model, tmp_path / "a", manifest)
    restored, saved = load_artifact(tmp_path / "a")
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), atol=0, rtol=0)
    assert saved["steps"][0]["record"]["blocks"][0] == {
        "block": 0, "mlp": 256,
        "attention": {"heads": 2, "qk": 16, "v": 48, "scale": 0.125, "qkv_bias": True, "proj_bias": True}}
    assert saved["fit"]["wpac"]["images"] == 16


@pytest.mark.parametrize("criterion", ["wpac", "taylor", "magnitude", "random"])
def test_same_seed_gives_the_same_plan_and_weights(criterion):
    plan = f"wpac:keep=0.5:criterion={criterion}"
    first, a = run(plan)
    second, b = run(plan)
    assert a["plan"] == b["plan"] and a["fit"] == b["fit"]
    for (name, x), (_, y) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(x, y), name


def test_random_criterion_seeds_differ():
    first, _ = run("wpac:keep=0.5:criterion=random:seed=0")
    second, _ = run("wpac:keep=0.5:criterion=random:seed=1")
    assert not torch.equal(first.blocks[0].attn.qkv.weight, second.blocks[0].attn.qkv.weight)


def test_criteria_keep_different_dims():
    weights = {c: run(f"wpac:keep=0.5:criterion={c}")[0].blocks[1].attn.qkv.weight
               for c in ("wpac", "taylor", "magnitude")}
    assert not torch.equal(weights["wpac"], weights["taylor"])
    assert not torch.equal(weights["taylor"], weights["magnitude"])


def _matmul_widths(path):
    """For every MatMul inside a block: its operands' last two dims (shapes inferred)."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    out = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and "blocks" in node.name:
            out.append((node.name, [shapes[i][-2:] for i in node.input[:2]]))
    return out


def test_export_and_clean_give_aligned_matmuls(tmp_path):
    model, manifest = run("wpac:qk=0.25:v=0.75:mlp=0.5")
    report = export(model, tmp_path / "m.onnx", source=WIDE, plan=manifest["plan"], data_config=data_config(model))
    assert all(r["passed"] for r in report["verification"])   # max abs <= 1e-4, rel L2 <= 1e-5 (edge.check.compare)
    cleaned = clean_file(tmp_path / "m.onnx", tmp_path / "c.onnx")
    assert all(r["passed"] for r in cleaned["verification"])
    matmuls = _matmul_widths(tmp_path / "c.onnx")
    assert len(matmuls) == 2 * 6   # per block: qkv, q k^T, attn v, proj, fc1, fc2
    tokens = 17
    dims = {d for _, operands in matmuls for shape in operands for d in shape} - {tokens}
    assert dims == {128, 16, 48, 160, 96, 256}   # embed, qk, v, qkv (2 x (16+16+48)), proj in, MLP
    assert all(d % 16 == 0 for d in dims) and 256 % 64 == 0


# ---- the CLI --------------------------------------------------------------------------------------

def test_cli_compress_then_eval(tmp_path):
    from edge.cli import main

    out = tmp_path / "w50"
    assert main(["compress", WIDE, "--plan", "wpac:keep=0.5", "--data", "fmnist-mini", "--samples", "16",
                 "--out", str(out)]) == 0
    assert main(["eval", str(out), "--data", "fmnist-mini"]) == 0
