import collections
import json
from pathlib import Path

import onnx
import pytest
import torch
from torch.nn import functional as F

from edge.analysis.attention import WelfordMap, attention_maps, attention_modules, collect_attention_stats
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.cost import analytic_flops, measured_flops
from edge.compress.methods.dwconv.build import build_dwconv, prefix_pool_weights, token_grid
from edge.compress.methods.dwconv.kernels import KernelFit, gaussian_kernel, mean_attention_kernel
from edge.compress.methods.dwconv.module import DepthwiseAttention, depthwise_from_attention, ensembled_projections
from edge.compress.plan import parse_plan
from edge.data import ArrayPreprocess, InputSpec, calibration_set
from edge.errors import EdgeError
from edge.export import export
from edge.graph.clean import clean_file
from edge.models import create_model, data_config
from edge.models.attention import explicit_attention

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
SOURCE = {"model": TINY, "weights": None, "img_size": None}


def tiny(seed=0, spec=TINY):
    torch.manual_seed(seed)
    return create_model(spec)


def non_square(seed=0, reg_tokens=0):
    """A 7x5 patch grid (28x20 input, patch 4), optionally with register tokens."""
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    import timm

    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(28, 20), patch_size=4, in_chans=1,
                             num_classes=10, depth=2, embed_dim=32, num_heads=2, reg_tokens=reg_tokens).eval()


def run(plan, samples=24, seed=0):
    return compress(tiny(seed), SOURCE, CompressConfig(plan=plan, data="fmnist-mini", samples=samples))


def per_head_outputs(attn, x):
    """The original attention's output before ``proj`` ([B, N, heads*head_dim]), read at the ``norm`` seam."""
    captured = []
    handle = attn.norm.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        with torch.no_grad():
            attn(x)
    finally:
        handle.remove()
    return captured[0]


# ---- attention statistics ---------------------------------------------------------------------

def test_welford_equals_two_pass_float64():
    generator = torch.Generator().manual_seed(0)
    data = torch.rand(23, 2, 5, 5, generator=generator) ** 3   # attention-like, skewed, float32
    acc = WelfordMap.zeros((2, 5, 5))
    for chunk in torch.split(data, [1, 7, 10, 5]):
        acc.update(chunk)
    exact = data.double()
    assert acc.count == 23
    torch.testing.assert_close(acc.mean, exact.mean(0), rtol=1e-13, atol=0)
    torch.testing.assert_close(acc.std(), exact.std(0, unbiased=True), rtol=1e-12, atol=0)
    other = WelfordMap.zeros((2, 5, 5))
    other.update(data)   # one batch: the same arithmetic, the same bits
    assert torch.equal(other.mean, acc.mean) and torch.equal(other.m2, acc.m2)


def test_sigma_scores_do_not_depend_on_batch_size_and_fused_flag_is_restored():
    model = tiny()
    calib = calibration_set("fmnist-mini", 12)
    spec = InputSpec.from_data_config(data_config(model))
    one = collect_attention_stats(model, calib, spec, batch_size=1)
    five = collect_attention_stats(model, calib, spec, batch_size=5)
    torch.testing.assert_close(five.sigma_head(), one.sigma_head(), rtol=1e-9, atol=0)
    torch.testing.assert_close(five.sigma_block(), one.sigma_head().mean(1), rtol=1e-9, atol=0)
    assert one.samples == 12 and one.sigma_head().shape == (4, 2)
    assert all(block.attn.fused_attn for block in model.blocks)   # switched off only while capturing
    # the captured maps are softmax rows: the mean map's rows sum to 1
    torch.testing.assert_close(one.mean_map(2).sum(-1), torch.ones(2, 17, dtype=torch.float64), rtol=0, atol=1e-6)


def test_sigma_is_the_summed_std_of_the_patch_maps():
    model = tiny()
    calib = calibration_set("fmnist-mini", 6)
    spec = InputSpec.from_data_config(data_config(model))
    stats = collect_attention_stats(model, calib, spec, batch_size=4)
    maps = []
    with attention_maps({1: attention_modules(model)[1]}, lambda _b, m: maps.append(m.double())), torch.no_grad():
        model.forward_features(ArrayPreprocess(spec)(calib.images))
    two_pass = torch.cat(maps).std(0)[:, 1:, 1:].sum((-2, -1))
    torch.testing.assert_close(stats.sigma_head()[1], two_pass, rtol=1e-6, atol=0)


# ---- the module ---------------------------------------------------------------------------------

def _delta(channels, k):
    kernels = torch.zeros(channels, k, k, dtype=torch.float64)
    kernels[:, k // 2, k // 2] = 1
    return kernels


@pytest.mark.parametrize("heads", [(0, 1), (1,)])
def test_delta_kernel_equals_the_value_path(heads):
    model = tiny()
    attn = model.blocks[1].attn
    x = torch.randn(3, 17, 32)
    hd = attn.head_dim
    module = depthwise_from_attention(attn, block=1, conv_heads=heads, grid=(4, 4), num_prefix_tokens=1, k=3,
                                      variant="unensembled", prefix="mean", kernels=_delta(len(heads) * hd, 3))
    # expected: the conv heads' channels hold V itself (patches) or the patch mean of V (class token)
    expected = per_head_outputs(attn, x).clone()
    v = (x @ attn.qkv.weight.T + attn.qkv.bias)[..., 64:]
    for h in heads:
        ch = slice(h * hd, (h + 1) * hd)
        expected[:, 1:, ch] = v[:, 1:, ch]
        expected[:, :1, ch] = v[:, 1:, ch].mean(1, keepdim=True)
    with torch.no_grad():
        torch.testing.assert_close(module(x), attn.proj(expected), rtol=0, atol=1e-5)


def test_prefix_attend_keeps_the_class_token_attention():
    model = tiny()
    attn = model.blocks[2].attn
    x = torch.randn(2, 17, 32)
    module = depthwise_from_attention(attn, block=2, conv_heads=(0, 1), grid=(4, 4), num_prefix_tokens=1, k=3,
                                      variant="unensembled", prefix="attend", kernels=_delta(32, 3))
    with torch.no_grad(), explicit_attention(model):
        torch.testing.assert_close(module(x)[:, 0], attn(x)[:, 0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("heads,variant", [((0, 1), "unensembled"), ((1,), "unensembled"), ((0, 1), "ensembled")])
def test_prefix_pool_with_this_images_attention_rows_reproduces_its_class_token(heads, variant):
    model = tiny()
    attn = model.blocks[1].attn
    x = torch.randn(1, 17, 32)
    maps = []
    with attention_maps({1: attn}, lambda _b, m: maps.append(m[0].double())), torch.no_grad():
        attn(x)
    weights = prefix_pool_weights(maps[0], heads, 16, variant, 1)
    width = 16 if variant == "ensembled" else 16 * len(heads)
    module = depthwise_from_attention(attn, block=1, conv_heads=heads, grid=(4, 4), num_prefix_tokens=1, k=3,
                                      variant=variant, prefix="pool", kernels=_delta(width, 3), prefix_weights=weights)
    with torch.no_grad(), explicit_attention(model):
        expected = attn(x)[:, 0]
        if variant == "ensembled":   # uniform ensemble: its class token is the heads' mean attention over mean V
            wv, bv, woe = ensembled_projections(attn, heads)
            v = x.double() @ wv.T + bv
            expected = ((maps[0][list(heads), 0].mean(0)[None, :, None] * v).sum(1) @ woe.T
                        + attn.proj.bias.double()).float()
        torch.testing.assert_close(module(x)[:, 0], expected, rtol=0, atol=1e-5)


def test_full_convolution_equals_depthwise_with_head_shared_kernels():
    model = non_square()
    attn = model.blocks[0].attn
    head_kernels = torch.randn(2, 3, 3, dtype=torch.float64)
    common = dict(block=0, conv_heads=(0, 1), grid=(7, 5), num_prefix_tokens=1, k=3, prefix="mean")
    bias = torch.randn(32, dtype=torch.float64)
    dw = depthwise_from_attention(attn, variant="unensembled", kernels=head_kernels.repeat_interleave(16, 0),
                                  bias=bias, **common)
    full = depthwise_from_attention(attn, variant="full", kernels=head_kernels, bias=bias, **common)
    x = torch.randn(2, 36, 32)
    with torch.no_grad():
        torch.testing.assert_close(full(x), dw(x), rtol=0, atol=1e-5)
    assert full.conv.groups == 1 and dw.conv.groups == 32


def test_ensembled_variant_folds_heads_into_one():
    model = tiny()
    attn = model.blocks[0].attn
    module = depthwise_from_attention(attn, block=0, conv_heads=(0, 1), grid=(4, 4), num_prefix_tokens=1, k=3,
                                      variant="ensembled", prefix="mean", kernels=_delta(16, 3))
    wv = attn.qkv.weight.detach()[64:].reshape(2, 16, 32)
    torch.testing.assert_close(module.value.weight, wv.mean(0), rtol=0, atol=1e-7)  # softmax(0) = 1/2 each
    assert module.conv.groups == 16 and module.proj.in_features == 16


# ---- kernel initialisation ---------------------------------------------------------------------

def test_least_squares_recovers_a_known_convolution():
    generator = torch.Generator().manual_seed(3)
    grid, k, channels = (7, 5), 3, 6
    kernel = torch.randn(channels, 1, k, k, generator=generator, dtype=torch.float64)
    bias = torch.randn(channels, generator=generator, dtype=torch.float64)
    fit = KernelFit.zeros(channels, grid, k)
    for _ in range(3):
        v = torch.randn(4, 35, channels, generator=generator, dtype=torch.float64)
        image = v.transpose(1, 2).reshape(4, channels, *grid)
        y = F.conv2d(image, kernel, bias, padding=1, groups=channels).flatten(2).transpose(1, 2)
        fit.update(v, y)
    w, b, stats = fit.solve(0.0)
    torch.testing.assert_close(w, kernel[:, 0], rtol=0, atol=1e-10)
    torch.testing.assert_close(b, bias, rtol=0, atol=1e-10)
    assert stats["r2_min"] > 1 - 1e-10 and stats["tokens"] == 3 * 4 * 35


def test_mean_attention_kernel_of_a_shift_and_the_gaussian():
    rows, cols = 4, 5
    n = rows * cols
    shift = torch.zeros(1, n + 1, n + 1, dtype=torch.float64)   # every patch attends to its right neighbour
    for i in range(rows):
        for j in range(cols - 1):
            shift[0, 1 + i * cols + j, 1 + i * cols + j + 1] = 1
    kernel = mean_attention_kernel(shift, (rows, cols), 1, 3)[0]
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[1, 2] = 1
    torch.testing.assert_close(kernel, expected, rtol=0, atol=0)
    g = gaussian_kernel(3)
    assert abs(float(g.sum()) - 1) < 1e-12 and g[1, 1] == g.max() and torch.equal(g, g.T)


# ---- compress, restore, FLOPs -------------------------------------------------------------------

@pytest.mark.parametrize("plan", ["dwconv:auto=2", "dwconv:heads=auto=3:init=mean:variant=ensembled",
                                  "dwconv:blocks=1+3:prefix=attend:init=gaussian", "dwconv:blocks=2:variant=full",
                                  "dwconv:blocks=0+2:prefix=drop", "linear:0-1,dwconv:blocks=3",
                                  "dwconv:heads=0.1+2.0+2.1:prefix=pool"])
def test_compress_restores_exactly_and_counts_flops(tmp_path, plan):
    model, manifest = run(plan)
    assert parse_plan(manifest["plan"]).is_resolved and "auto" not in manifest["plan"]
    assert manifest["after"]["flops"] == manifest["after"]["flops_analytic"]
    save_artifact(model, tmp_path / "art", manifest)
    restored, saved = load_artifact(tmp_path / "art")   # no calibration data needed
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), rtol=0, atol=0)
    record = json.loads((tmp_path / "art" / "edge-model.json").read_text())
    modules = [m for e in record["steps"] if e["method"] == "dwconv" for m in e["record"]["modules"]]
    assert record["format_version"] == 2 and modules and all(r["k"] == 3 for r in modules)
    assert [e["step"] for e in record["steps"]] == manifest["plan"].split(",")
    assert measured_flops(restored, (1, 28, 28)) == analytic_flops(restored)


def test_auto_selects_lowest_or_highest_sigma():
    low, manifest = run("dwconv:auto=2")
    high, manifest_high = run("dwconv:auto=2:order=highest")
    sigma = manifest["fit"]["dwconv"]["sigma"]["sigma_block"]
    ranked = sorted(range(4), key=sigma.__getitem__)
    assert manifest["plan"] == "dwconv:blocks=" + "+".join(map(str, sorted(ranked[:2])))
    assert manifest_high["plan"] == "dwconv:blocks=" + "+".join(map(str, sorted(ranked[2:])))
    assert manifest["after"]["flops"] < manifest["before"]["flops"]
    assert sum(isinstance(b.attn, DepthwiseAttention) for b in low.blocks) == 2


def test_lsq_fit_is_closer_to_the_original_than_the_gaussian():
    calib = calibration_set("fmnist-mini", 24)
    x = ArrayPreprocess(InputSpec.from_data_config(data_config(tiny())))(calib.images)
    with torch.no_grad():
        reference = tiny().forward_features(x)
        errors = {init: (run(f"dwconv:blocks=1+2:init={init}")[0].forward_features(x) - reference).norm().item()
                  for init in ("lsq", "gaussian")}
    _, manifest = run("dwconv:blocks=1")
    assert errors["lsq"] < errors["gaussian"]
    assert 0 < manifest["fit"]["dwconv"]["dwconv:blocks=1"]["1"]["rel_error"] < 1


# ---- export --------------------------------------------------------------------------------------

def _count_in_block(graph, op, block):
    return sum(1 for n in graph.node if n.op_type == op and f"blocks.{block}/attn" in n.name)


def _assert_channels_last_layout(graph, convs):
    """Each depthwise Conv reads a [B, rows, cols, C] -> NCHW Transpose and writes through its inverse.

    That 4-D NHWC<->NCHW pair is the pattern runtimes fold into the convolution's own layout
    change (ONNX Runtime's ReorderInput/ReorderOutput with channels_last; TensorRT's reformatting),
    where a 3-D [B, N, C] -> [B, C, N] Transpose plus Reshape stays a separate copy.
    """
    producer = {out: n for n in graph.node for out in n.output}
    consumers = collections.defaultdict(list)
    for n in graph.node:
        for name in n.input:
            consumers[name].append(n)

    def perm(node):
        return list(next(a.ints for a in node.attribute if a.name == "perm"))

    for conv in convs:
        before = producer[conv.input[0]]
        (after,) = consumers[conv.output[0]]
        assert (before.op_type, perm(before)) == ("Transpose", [0, 3, 1, 2]), conv.name
        assert (after.op_type, perm(after)) == ("Transpose", [0, 2, 3, 1]), conv.name


@pytest.mark.parametrize("plan", ["dwconv:blocks=0+1+2+3:prefix=mean", "dwconv:blocks=0+1+2+3:prefix=attend",
                                  "dwconv:blocks=0+1+2+3:prefix=pool", "dwconv:blocks=1+2:variant=ensembled"])
def test_export_is_linear_dwconv_linear_and_verified(tmp_path, plan):
    model, manifest = run(plan)
    replaced = parse_plan(manifest["plan"]).steps_of("dwconv")[0].blocks
    report = export(model, tmp_path / "m.onnx", source=TINY, plan=manifest["plan"], data_config=data_config(model))
    assert all(r["passed"] for r in report["verification"])
    clean_file(tmp_path / "m.onnx", tmp_path / "c.onnx")   # verifies against the raw graph too
    graph = onnx.load(str(tmp_path / "c.onnx")).graph
    convs = [n for n in graph.node if n.op_type == "Conv" and "attn" in n.name]
    width = model.blocks[replaced[0]].attn.conv_width
    assert len(convs) == len(replaced)
    assert all(next(a.i for a in n.attribute if a.name == "group") == width for n in convs)
    _assert_channels_last_layout(graph, convs)
    for block in replaced:
        assert 1 <= _count_in_block(graph, "Transpose", block) <= 2   # found by name: the count is real
        slices = 2 if "attend" in plan else 1   # attend: the prefix rows (its queries) and the patch rows of V
        assert _count_in_block(graph, "Slice", block) <= slices and _count_in_block(graph, "Concat", block) <= 1
    if len(replaced) == 4:
        ops = collections.Counter(n.op_type for n in graph.node)
        assert ops["Transpose"] <= 1 + 2 * 4   # 1: the patch embedding's flatten
        assert ops["Softmax"] == (4 if "attend" in plan else 0)


def test_export_of_a_non_square_grid_with_registers(tmp_path):
    model = non_square(reg_tokens=2)
    spec = InputSpec.from_data_config(data_config(model))
    # the gaussian init with prefix=mean reads no images
    steps = parse_plan("dwconv:blocks=0+1:init=gaussian:prefix=mean").steps_of("dwconv")
    steps, modules, _ = build_dwconv(model, steps, None, spec)
    for block, module in modules.items():
        assert module.grid == (7, 5) and module.num_prefix_tokens == 3
        model.blocks[block].attn = module
    report = export(model, tmp_path / "m.onnx", source="non-square", plan=str(steps[0]),
                    data_config=data_config(model))
    assert all(r["passed"] for r in report["verification"])


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("plan,message", [
    ("dwconv:blocks=1:k=4", "must be odd"),
    ("dwconv:blocks=1:k=5", "larger than the patch grid"),
    ("dwconv:blocks=2+9", "out of range"),
    ("dwconv:heads=1.7", "does not exist"),
    ("dwconv:auto=5", "5 blocks, 4 are left"),
    ("linear:0-2,dwconv:blocks=2", "which a span removes"),
    ("dwconv:blocks=1:prefix=drop,dwconv:blocks=2", "some dwconv steps only"),
    ("dwconv:blocks=1:variant=ensembled:prefix=attend", "prefix=attend only with variant=unensembled"),
])
def test_bad_dwconv_input_is_explained(plan, message):
    with pytest.raises(EdgeError, match=message):
        run(plan, samples=10)


def test_tokens_that_do_not_form_a_grid_are_refused():
    with pytest.raises(EdgeError, match="do not form a fixed grid"):
        token_grid(tiny(spec=TINY + ",dynamic_img_size=true"))
    model = tiny()
    model.patch_embed.grid_size = (3, 5)   # metadata that no longer matches the position embedding
    with pytest.raises(EdgeError, match="do not form its 3x5 patch grid"):
        token_grid(model)


def test_already_dwconv_compressed_model_is_refused():
    model, _ = run("dwconv:blocks=1:init=gaussian")
    with pytest.raises(EdgeError, match="already compressed"):
        compress(model, SOURCE, CompressConfig(plan="dwconv:blocks=2", data="fmnist-mini", samples=10))


# ---- CLI -----------------------------------------------------------------------------------------

def test_cli_analyze_attention_writes_scores_and_plot(tmp_path, capsys):
    from edge.cli import main

    code = main(["analyze", TINY, "--data", "fmnist-mini", "--samples", "10", "--attention", "--out",
                 str(tmp_path / "a"), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    scores = json.loads((tmp_path / "a" / "attention.json").read_text())
    assert len(scores["sigma_block"]) == 4 and len(scores["sigma_head"][0]) == 2
    assert result["attention"]["sigma_block"] == scores["sigma_block"]
    assert Path(tmp_path / "a" / "attention_std.png").stat().st_size > 1000
