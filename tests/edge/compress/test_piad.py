"""PIAD (edge/compress/methods/wpac/piad.py), its units and order (supernet.py), and sub-network
extraction (extract.py, through edge/compress/derive.py).

The tiny teacher of conftest.py (embed 32, 2 heads of 16, MLP 128) is compressed by
``wpac:keep=1:align=8:mlp_align=32``: full widths in WPAC's order, and with these alignments every
block has 1 droppable Q/K unit, 1 V unit and 3 MLP units (12 per model when all are listed).
"""

import copy
import json

import onnx
import pytest
import torch

from edge.cli import main
from edge.compress import CompressConfig, compress, load_artifact, save_artifact
from edge.compress.cost import analytic_flops
from edge.compress.derive import derive_model
from edge.compress.finetune import FinetuneConfig, finetune
from edge.compress.methods.wpac.build import cut_widths
from edge.compress.methods.wpac.droppable import DroppableAttention, DroppableMlp, Droppables
from edge.compress.methods.wpac.module import NarrowAttention
from edge.compress.methods.wpac.piad import growth_steps, sampled_drops, wpac_parts
from edge.compress.methods.wpac.supernet import (
    Part,
    dropped_flops,
    greedy_order,
    part_stops,
    pooled_tail,
    select,
    supernet_record,
    widths_after,
)
from edge.compress.plan import parse_plan
from edge.errors import EdgeError
from edge.export import export
from edge.models import create_model, data_config

from .conftest import TINY

PLAN = "wpac:keep=1:align=8:mlp_align=32"
WIDE = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=2,embed_dim=128,num_heads=2"


def _artifact(teacher_weights, folder, plan=PLAN, spec=TINY):
    source = {"model": spec, "weights": str(teacher_weights) if teacher_weights else None, "img_size": None}
    model = create_model(spec, weights=teacher_weights) if teacher_weights else _seeded(spec)
    model, manifest = compress(model, source, CompressConfig(plan=plan, data="fmnist-mini", samples=24))
    return save_artifact(model, folder, manifest)


def _seeded(spec):
    torch.manual_seed(0)
    return create_model(spec)


@pytest.fixture(scope="module")
def full(teacher_weights, tmp_path_factory):
    """The tiny teacher rotated by WPAC at full width."""
    return _artifact(teacher_weights, tmp_path_factory.mktemp("w") / "full")


def _config(**overrides) -> FinetuneConfig:
    # 48 images in batches of 16: 3 steps per epoch; 2 epochs; the list grows at steps 0 and 3
    base = dict(data="fmnist-mini", train_samples=48, batch_size=16, epochs=2, eval_samples=50, threads=1,
                amp="off", lr=1e-3, warmup_steps=1, device="cpu", piad=True, piad_target=0.6, piad_epochs=2,
                piad_samples=32)
    return FinetuneConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def supernet(full, tmp_path_factory):
    """6 PIAD steps (2 epochs, the list grown at steps 0 and 3 to 0.3 and 0.6 of the MACs)."""
    out = tmp_path_factory.mktemp("piad") / "super"
    record = finetune(full, out, _config())
    return out, record


def _images(n=4, seed=0):
    torch.manual_seed(seed)
    return torch.randn(n, 1, 28, 28)


# ---- units, FLOPs, order (no data) ------------------------------------------------------------------

@pytest.mark.parametrize("width,align,stops", [(64, 16, (16, 32, 48, 64)), (48, 32, (32, 48)), (16, 16, (16,)),
                                               (8, 16, (8,)), (768, 64, tuple(range(64, 769, 64)))])
def test_a_part_keeps_aligned_widths_or_its_whole_width(width, align, stops):
    assert part_stops(width, align) == stops


def test_unit_flops_add_up_to_the_cut_models_flops_with_the_attention_products():
    model = _seeded(WIDE)
    rotated, _ = compress(model, {"model": WIDE}, CompressConfig(plan="wpac:keep=1", data="fmnist-mini", samples=8))
    parts = wpac_parts(rotated, 16, 64)
    assert sorted(parts) == ["0.mlp", "0.qk", "0.v", "1.mlp", "1.qk", "1.v"]
    tokens = 17
    assert parts["0.qk"].flops_per_dim == parts["0.v"].flops_per_dim == 2 * tokens * 2 * (2 * 128 + tokens)
    assert parts["0.mlp"].flops_per_dim == 2 * tokens * (128 + 128)
    full = analytic_flops(rotated)
    widths = {"0.qk": 16, "0.v": 48, "0.mlp": 192, "1.qk": 64, "1.v": 32, "1.mlp": 512}
    cut = cut_widths(copy.deepcopy(rotated), widths)
    assert analytic_flops(cut) == full - dropped_flops(parts, widths)
    attn = cut.blocks[0].attn
    assert (attn.qk_dim, attn.v_dim, cut.blocks[0].mlp.fc1.out_features) == (16, 48, 192)
    assert attn.scale == pytest.approx(64 ** -0.5)


def test_pools_never_fall_towards_the_head():
    part = Part(0, "mlp", (1, 2, 3, 4, 5), 10)
    # per-dim scores 9, 2, 4, 2, 3: units from the tail 3, 2, 4, 2 (per FLOP 0.3, 0.2, 0.4, 0.2); the first two
    # pool (0.25), the last two pool (0.3); the head dim is never a unit
    pools = pooled_tail(part, 5, [9.0, 2.0, 4.0, 2.0, 3.0])
    assert [(p.units, p.mean) for p in pools] == [(2, pytest.approx(0.25)), (2, pytest.approx(0.3))]
    # scores falling towards the head pool into one
    assert [p.units for p in pooled_tail(part, 5, [5.0, 1.0, 3.0, 2.0, 4.0])] == [4]
    assert [p.units for p in pooled_tail(part, 3, [0.0, 2.0, 1.0, 9.0, 9.0])] == [1, 1]   # a cut part: dims 0..2


def test_greedy_order_drops_each_part_from_its_tail_lowest_score_first():
    parts = {"0.qk": Part(0, "qk", (8, 16), 100), "0.mlp": Part(0, "mlp", (32, 64, 96, 128), 10)}
    scores = {"0.qk": [1.0] * 8 + [0.05] * 8, "0.mlp": [1.0] * 32 + [0.2] * 32 + [0.1] * 32 + [0.3] * 32}
    order, values = greedy_order(parts, {"0.qk": 16, "0.mlp": 128}, scores)
    # qk's tail: 0.4 / 800 per FLOP; mlp's last two units pool (0.3 > 0.1 from the tail: 12.8 / 640), then 6.4 / 320
    assert order == ["0.qk", "0.mlp", "0.mlp", "0.mlp"]
    assert values == sorted(values)
    assert widths_after(parts, order) == {"0.qk": 8, "0.mlp": 32}


def test_selection_is_the_largest_sub_network_within_the_target_and_refuses_below_the_smallest():
    parts = {"0.qk": Part(0, "qk", (8, 16), 100), "0.mlp": Part(0, "mlp", (32, 64, 96, 128), 10)}
    # 2000 FLOPs; the order's sub-networks: 1680 (0.84), 880 (0.44), 560 (0.28), 240 (0.12)
    record = supernet_record(parts, ["0.mlp", "0.qk", "0.mlp", "0.mlp"], [0.0] * 4, flops=2000, by="wpac")
    for fraction in (1.0, 0.9, 0.84, 0.8, 0.5, 0.44, 0.3, 0.2, 0.12):
        chosen = select(record, fraction)
        assert chosen.flops <= fraction * 2000
        assert chosen.coarser_flops is None or chosen.coarser_flops > fraction * 2000
    assert [select(record, f).flops for f in (1.0, 0.9, 0.84, 0.8, 0.3, 0.12)] == [2000, 1680, 1680, 880, 560, 240]
    assert select(record, 1.0).drops == 0 and select(record, 0.9).widths == {"0.qk": 16, "0.mlp": 96}
    with pytest.raises(EdgeError, match=r"macs=0.1 is below the smallest sub-network .* leaves 0.1200 .*"
                                        r"\n.*macs >= 0.1200"):
        select(record, 0.1)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(EdgeError, match=r"outside \(0, 1\]"):
            select(record, bad)


@pytest.mark.parametrize("plan,message", [
    ("wpac:macs=0", r"macs=0 .* out of range\n.*expected: 0 < macs <= 1"),
    ("wpac:macs=1.5", r"macs=1.5 .* out of range\n.*expected: 0 < macs <= 1"),
    ("wpac:macs=0.5:keep=0.5", "both macs= and keep="),
    ("wpac:macs=0.5:criterion=random", "criterion=wpac"),
])
def test_bad_macs_steps_are_refused_when_parsed(plan, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan)


@pytest.mark.parametrize("plan,message", [
    ("wpac:macs=0.5,wpac:keep=0.5:blocks=3", "beside other wpac steps"),
    ("linear:2-3,wpac:macs=0.5:blocks=0+1", "which other steps"),
])
def test_macs_beside_other_steps_is_refused(plan, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan).validate(12)


# ---- the masks ---------------------------------------------------------------------------------------

def test_droppable_modules_at_full_width_compute_what_the_model_computes(full):
    model, _ = load_artifact(full)
    x = _images()
    with torch.no_grad():
        expected = model(x)
        modules = Droppables.put(model, 8, 32)
        assert isinstance(model.blocks[0].attn, DroppableAttention) and isinstance(model.blocks[1].mlp, DroppableMlp)
        for mode in (model.eval, model.train):   # nothing dropped: the same function in both modes
            mode()
            torch.testing.assert_close(model(x), expected, atol=1e-6, rtol=1e-5)
        modules.restore()
    assert isinstance(model.blocks[0].attn, NarrowAttention)


def test_masks_compute_the_cut_model_while_training_and_the_whole_in_eval(full):
    model, _ = load_artifact(full)
    x = _images()
    widths = {"0.qk": 8, "0.v": 16, "0.mlp": 64, "1.qk": 16, "1.v": 8, "1.mlp": 32}
    cut = cut_widths(copy.deepcopy(model), widths).eval()
    with torch.no_grad():
        whole, truncated = model.eval()(x), cut(x)
        modules = Droppables.put(model, 8, 32)
        modules.set_widths(widths)
        torch.testing.assert_close(model.train()(x), truncated, atol=1e-6, rtol=1e-5)   # no dropout in TINY
        torch.testing.assert_close(model.eval()(x), whole, atol=1e-6, rtol=1e-5)
        modules.set_widths(widths, pinned=True)
        torch.testing.assert_close(model.eval()(x), truncated, atol=1e-6, rtol=1e-5)
    # no shape changes: the parameters are the artifact's own
    assert [p.shape for p in model.parameters()] == [p.shape for p in load_artifact(full)[0].parameters()]


def test_a_skipped_module_leaves_the_residual_only(full):
    model, _ = load_artifact(full)
    modules = Droppables.put(model, 8, 32)
    block = model.blocks[0]
    x = torch.randn(2, 17, 32)
    modules.attention[0].skip = True
    with torch.no_grad():
        y = block.eval()(x)
        expected = x + block.mlp(block.norm2(x))
    torch.testing.assert_close(y, expected)


# ---- the schedule ------------------------------------------------------------------------------------

def test_growth_steps_are_the_first_steps_of_the_progressive_epochs():
    assert growth_steps(6, 2, 2) == [0, 3]
    assert growth_steps(300, 3, 2) == [0, 100]
    assert growth_steps(469 * 3, 3, 3) == [0, 469, 938]
    assert growth_steps(10, 3, 3) == [0, 3, 6]


def test_sampled_truncations_are_deterministic_and_cover_both_ends():
    draws = [sampled_drops(0, step, 5) for step in range(400)]
    assert draws == [sampled_drops(0, step, 5) for step in range(400)]
    assert draws != [sampled_drops(1, step, 5) for step in range(400)]
    assert set(draws) == set(range(6))          # 0 (the whole network) .. 5 (the smallest)
    assert all(sampled_drops(3, step, 0) == 0 for step in range(10))


def test_the_dropout_list_grows_monotonically_to_the_target_on_schedule(supernet):
    out, record = supernet
    piad = record["phases"]["piad"]
    growth = piad["growth"]
    assert [g["step"] for g in growth] == piad["growth_steps"] == [0, 3]
    assert [g["goal"] for g in growth] == [pytest.approx(0.3), pytest.approx(0.6)]
    saved = [g["listed_macs_saved"] for g in growth]
    assert saved[0] >= 0.3 and saved[1] >= 0.6 and saved == sorted(saved)
    assert [g["listed"] for g in growth] == sorted(g["listed"] for g in growth)
    # each growth adds units until the goal is reached, not one more
    model, manifest = load_artifact(out)
    sn = manifest["supernet"]
    parts = {f"{p['block']}.{p['part']}": Part.from_dict(p) for p in sn["parts"]}
    listed = sn["order"][:sn["trained"]]
    for g in growth:
        before = dropped_flops(parts, widths_after(parts, listed[:g["listed"] - 1])) / sn["flops"]
        assert before < g["goal"] <= g["listed_macs_saved"]
    # the list is the head of the order, in the order it grew; the whole order drops every droppable unit
    assert sn["by"] == "piad" and sn["trained"] == piad["listed"] == len(listed)
    assert sorted(sn["order"]) == sorted(n for n, p in parts.items() for _ in range(p.units()))
    assert all(isinstance(b.attn, NarrowAttention) for b in model.blocks)   # the masks are gone
    assert sn["flops"] == analytic_flops(model)


def test_piad_is_deterministic_with_a_seed(full, supernet, tmp_path):
    out, record = supernet
    again = finetune(full, tmp_path / "again", _config())
    first, second = load_artifact(out)[1]["supernet"], load_artifact(tmp_path / "again")[1]["supernet"]
    assert first["order"] == second["order"] and first["scores"] == second["scores"]
    w1, w2 = load_artifact(out)[0].state_dict(), load_artifact(tmp_path / "again")[0].state_dict()
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=0, msg=key)
    assert again["phases"]["piad"]["growth"] == record["phases"]["piad"]["growth"]


def test_an_interrupted_piad_run_resumes_to_the_same_super_network(full, supernet, tmp_path):
    out, _ = supernet
    finetune(full, tmp_path / "r", _config(max_steps=4, checkpoint_every=1))
    finetune(full, tmp_path / "r", _config())
    a, b = load_artifact(out), load_artifact(tmp_path / "r")
    assert a[1]["supernet"]["order"] == b[1]["supernet"]["order"]
    for key, value in a[0].state_dict().items():
        torch.testing.assert_close(b[0].state_dict()[key], value, rtol=0, atol=0, msg=key)


# ---- extraction --------------------------------------------------------------------------------------

def test_extraction_at_macs_1_is_the_super_network(supernet):
    out, _ = supernet
    model, manifest = derive_model(out, "wpac:macs=1")
    original, _ = load_artifact(out)
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), original(x), rtol=0, atol=0)
    assert manifest["extracted"]["drops"] == 0 and manifest["after"]["flops"] == manifest["before"]["flops"]


@pytest.mark.parametrize("fraction", [0.9, 0.75, 0.6, 0.5])
def test_extraction_keeps_at_most_the_fraction_and_is_the_largest_such_sub_network(supernet, tmp_path, fraction):
    out, _ = supernet
    model, manifest = derive_model(out, f"wpac:macs={fraction}")
    full_flops = manifest["before"]["flops_analytic"]
    flops = analytic_flops(model)
    assert flops == manifest["after"]["flops"] == manifest["extracted"]["flops"]
    assert flops <= fraction * full_flops
    coarser = manifest["extracted"]["coarser_flops"]
    assert coarser is None or coarser > fraction * full_flops
    for block in model.blocks:   # every width aligned (8 per head, 32 for the MLP) or whole
        attn = block.attn
        assert attn.qk_dim % 8 == 0 and attn.v_dim % 8 == 0 and block.mlp.fc1.out_features % 32 == 0
    assert manifest["plan"] == f"wpac:align=8:macs={fraction}:mlp_align=32"
    # the artifact restores without data, and the same cut from it again gives the same weights
    save_artifact(model, tmp_path / "sub", manifest)
    restored, saved = load_artifact(tmp_path / "sub")
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(restored(x), model(x), rtol=0, atol=0)
    assert saved["extracted"]["trained"] is True      # within the dropout list PIAD trained (down to 0.4)


def test_a_sub_network_of_a_sub_network_is_the_same_cut(supernet, tmp_path):
    out, _ = supernet
    model, manifest = derive_model(out, "wpac:macs=0.8")
    save_artifact(model, tmp_path / "s80", manifest)
    direct, _ = derive_model(out, "wpac:macs=0.5")
    target = 0.5 * manifest["before"]["flops_analytic"] / manifest["after"]["flops_analytic"]
    nested, _ = derive_model(tmp_path / "s80", f"wpac:macs={target:.12f}")
    assert analytic_flops(nested) == analytic_flops(direct)


def test_extraction_refusals(supernet, full, teacher_weights, tmp_path):
    out, _ = supernet
    smallest = select(load_artifact(out)[1]["supernet"], 1.0).smallest_flops / analytic_flops(load_artifact(out)[0])
    with pytest.raises(EdgeError, match=rf"below the smallest sub-network .*\n.*macs >= {smallest:.3f}"):
        derive_model(out, "wpac:macs=0.05")
    with pytest.raises(EdgeError, match="not a super-network"):   # full width, but never ranked
        derive_model(full, "wpac:macs=0.5")
    with pytest.raises(EdgeError, match="takes only a sub-network plan"):
        derive_model(out, "wpac:macs=0.5:blocks=0")
    with pytest.raises(EdgeError, match="takes only a sub-network plan"):
        derive_model(out, "wpac:keep=0.5")


def test_extracted_sub_network_exports_with_aligned_matmuls(tmp_path):
    artifact = _artifact(None, tmp_path / "super", plan="wpac:macs=1", spec=WIDE)
    manifest = load_artifact(artifact)[1]
    assert manifest["supernet"]["by"] == "wpac" and manifest["after"]["flops"] == manifest["before"]["flops"]
    model, sub = derive_model(artifact, "wpac:macs=0.5")
    assert sub["after"]["flops"] <= 0.5 * sub["before"]["flops"]
    report = export(model, tmp_path / "m.onnx", source=WIDE, plan=sub["plan"], data_config=data_config(model))
    assert all(r["passed"] for r in report["verification"])
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(tmp_path / "m.onnx")))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*graph.graph.value_info, *graph.graph.input, *graph.graph.output)}
    shapes.update({t.name: list(t.dims) for t in graph.graph.initializer})
    tokens, embed = 17, 128
    widths = {d for node in graph.graph.node if node.op_type in ("MatMul", "Gemm") and "blocks" in node.name
              for name in node.input[:2] for d in shapes[name][-2:]} - {tokens, embed}
    assert widths and all(d % 16 == 0 for d in widths), widths
    widths_mlp = {b.mlp.fc1.out_features for b in model.blocks}
    assert all(w % 64 == 0 for w in widths_mlp), widths_mlp


def test_compress_at_macs_ranks_and_cuts_in_one_step(tmp_path):
    model, manifest = compress(_seeded(WIDE), {"model": WIDE}, CompressConfig(plan="wpac:macs=0.6",
                                                                              data="fmnist-mini", samples=8))
    assert manifest["after"]["flops"] <= 0.6 * manifest["before"]["flops"]
    macs = manifest["fit"]["wpac"]["macs"]
    assert macs["fraction"] == 0.6 and macs["flops"] == manifest["after"]["flops"]
    assert manifest["supernet"]["flops"] == manifest["after"]["flops"]       # what is left can be cut further
    save_artifact(model, tmp_path / "w60", manifest)
    sub, _ = derive_model(tmp_path / "w60", "wpac:macs=0.5")
    assert analytic_flops(sub) <= 0.5 * manifest["after"]["flops"]


# ---- bad inputs to the fine-tune -----------------------------------------------------------------------

def test_piad_on_an_artifact_without_wpac_is_refused(teacher_weights, tmp_path):
    dense = _artifact(teacher_weights, tmp_path / "dense", "dwconv:blocks=0:init=gaussian")
    with pytest.raises(EdgeError, match="--piad: .* has no width-compressed \\(wpac\\) blocks"):
        finetune(dense, tmp_path / "ft", _config())
    assert not (tmp_path / "ft").exists()


def test_bad_piad_options_are_refused_before_anything_is_written(full, tmp_path):
    with pytest.raises(EdgeError, match="which is off(.|\n)*add --piad"):
        finetune(full, tmp_path / "ft", _config(piad=False, piad_target=0.5))
    with pytest.raises(EdgeError, match="--piad-epochs 3 is more than --epochs 2"):
        finetune(full, tmp_path / "ft", _config(piad_epochs=3))
    with pytest.raises(EdgeError, match=r"--piad-target 0.95: dropping every droppable unit of this model saves "
                                        r"0.6186 of its MACs(.|\n)*--piad-target <= 0.6185"):
        finetune(full, tmp_path / "ft", _config(piad_target=0.95))
    assert not (tmp_path / "ft").exists()


def test_cli_piad_then_extraction(full, tmp_path, capsys):
    out = tmp_path / "s"
    args = ["finetune", str(full), "--piad", "--piad-target", "0.5", "--piad-samples", "16", "--data", "fmnist-mini",
            "--train-samples", "32", "--batch-size", "16", "--epochs", "1", "--eval-samples", "20", "--threads", "1",
            "--amp", "off", "--out", str(out), "--json"]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["phases"]["piad"]["listed_macs_saved"] >= 0.5 and record["recipe"]["piad"] is True
    assert main(["compress", str(out), "--plan", "wpac:macs=0.6", "--out", str(tmp_path / "c"), "--json"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["after"]["flops"] <= 0.6 * cut["before"]["flops"] and cut["extracted"]["from"] == str(out)
    assert main(["compress", str(out), "--plan", "wpac:macs=0.01", "--out", str(tmp_path / "x")]) == 2
    assert "below the smallest sub-network" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main([*args[:-3], "--piad-target", "1", "--out", str(tmp_path / "y")]) == 2
    assert "--piad-target: 1 is out of range" in capsys.readouterr().err and not (tmp_path / "y").exists()


# ---- a latency budget (a latency table, edge.latency) -------------------------------------------------

def _synthetic_table(supernet, path):
    """A latency table holding every part of every sub-network along the order: 1 ms of overhead, then
    (attention) heads x (2 qk + v) / 100 ms and (MLP) hidden / 100 ms per part, 0.5 ms for embed and head."""
    from edge.latency import LatencyTable, model_parts
    from edge.latency.parts import overhead_part
    from edge.latency.table import Target

    model, manifest = load_artifact(supernet)
    record = manifest["supernet"]
    parts = {f"{p['block']}.{p['part']}": Part.from_dict(p) for p in record["parts"]}
    medians = {}

    def cost(part):
        if part.kind == "attention":
            return int(part.get("heads")) * (2 * int(part.get("qk")) + int(part.get("v"))) / 100
        return int(part.get("hidden")) / 100 if part.kind == "mlp" else 0.5

    widths = {name: p.width for name, p in parts.items()}
    for k in range(len(record["order"]) + 1):
        if k:
            widths = widths_after(parts, [record["order"][k - 1]], widths)
            cut_widths(model, widths)
        for part in model_parts(model):
            medians[part] = {"median_ms": 1.0 + cost(part)}
    medians[overhead_part(32, 17)] = {"median_ms": 1.0}
    table = LatencyTable.from_medians(Target("onnxruntime", "test CPU", "fp32", 1, 1), medians)
    return table.save(path), table


def test_a_latency_budget_keeps_the_largest_sub_network_predicted_within_it(supernet, tmp_path):
    from edge.compress.derive import derive_model as cut
    from edge.latency import predict_model

    out, _ = supernet
    path, table = _synthetic_table(out, tmp_path / "table.json")
    whole = predict_model(load_artifact(out)[0], table).total_ms
    for budget in (whole, whole - 1.0, whole - 2.5):
        model, manifest = cut(out, f"wpac:latency-ms={budget}:table={path}",
                              predict=lambda m: predict_model(m, table).total_ms, predictor={"table": str(path)})
        latency = manifest["extracted"]["latency"]
        assert predict_model(model, table).total_ms == latency["predicted_ms"] <= budget
        assert latency["coarser_predicted_ms"] is None or latency["coarser_predicted_ms"] > budget
        assert analytic_flops(model) == manifest["after"]["flops"]
    assert cut(out, f"wpac:latency-ms={whole}:table={path}", predict=lambda m: 0.0)[1]["extracted"]["drops"] == 0
    with pytest.raises(EdgeError, match="latency-ms=0.5 is below the smallest sub-network .* predicted at"):
        cut(out, f"wpac:latency-ms=0.5:table={path}", predict=lambda m: predict_model(m, table).total_ms)
    with pytest.raises(EdgeError, match="needs a latency predictor"):
        cut(out, f"wpac:latency-ms=5:table={path}")


def test_cli_latency_budget_reads_the_table(supernet, tmp_path, capsys):
    from edge.latency import predict_model

    out, _ = supernet
    path, table = _synthetic_table(out, tmp_path / "table.json")
    budget = predict_model(load_artifact(out)[0], table).total_ms - 2.0
    assert main(["compress", str(out), "--plan", f"wpac:latency-ms={budget}:table={path}", "--out",
                 str(tmp_path / "c"), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["extracted"]["latency"]["predicted_ms"] <= budget
    assert record["extracted"]["latency"]["predictor"]["target"] == "onnxruntime on test CPU, fp32, batch 1, 1 threads"
    assert main(["compress", str(out), "--plan", f"wpac:latency-ms=5:table={tmp_path / 'none.json'}", "--out",
                 str(tmp_path / "x")]) == 2
    assert "cannot read the latency table" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("plan,message", [
    ("wpac:latency-ms=5", "latency-ms= and table= go together"),
    ("wpac:table=t.json", "latency-ms= and table= go together"),
    ("wpac:latency-ms=5:table=t.json:macs=0.5", "drop macs"),
    ("wpac:latency-ms=-1:table=t.json", r"latency-ms=-1 .* out of range\n.*expected: 0 < latency-ms <= 1000000000"),
])
def test_bad_latency_steps_are_refused_when_parsed(plan, message):
    with pytest.raises(EdgeError, match=message):
        parse_plan(plan)


def test_a_latency_budget_on_a_plain_model_is_refused():
    with pytest.raises(EdgeError, match="cuts a sub-network from a super-network artifact by a latency table"):
        parse_plan("wpac:latency-ms=5:table=t.json").validate(12)
