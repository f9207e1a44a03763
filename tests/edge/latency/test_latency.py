"""Latency parts, tables and predictions (edge.latency): part listing of the reference model and of
compressed models (checked against the real modules' FLOPs), the table's JSON round trip, the refusal
of a table measured elsewhere, prediction = overhead + sum of the parts, and a tiny grid timed for real
on ONNX Runtime (structure only: tests never assert timings)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edge.cli import main
from edge.errors import EdgeError
from edge.latency import LatencyTable, Part, Target, model_parts, predict_model, predict_parts
from edge.latency.grid import GridConfig, grid_parts
from edge.latency.measure import measure_table
from edge.latency.modules import input_shape, part_module
from edge.latency.parts import overhead_part
from edge.profile.graphs import TimingConfig
from tests.conftest import TINY

CPU = Target("onnxruntime", "Test CPU", "fp32", 1, 2)


def module_flops(part: Part) -> int:
    with FlopCounterMode(display=False) as counter:
        part_module(part)(torch.zeros(1, *input_shape(part)))
    return int(counter.get_total_flops())


def model_flops(model: nn.Module) -> int:
    from edge.compress.cost import measured_flops
    from edge.models import data_config

    return measured_flops(model, tuple(data_config(model)["input_size"]))


@pytest.fixture(scope="module")
def tiny():
    from edge.models import create_model

    torch.manual_seed(0)
    return create_model(TINY)


def compressed(plan: str):
    from edge.compress import CompressConfig, compress
    from edge.models import create_model

    torch.manual_seed(0)
    model, _ = compress(create_model(TINY), {"model": TINY}, CompressConfig(plan=plan, data="fmnist-mini", samples=24))
    return model


def test_reference_model_parts(reference_model):
    parts = model_parts(reference_model)
    assert [p.kind for p in parts] == ["embed", *["attention", "mlp"] * 12, "head"]
    attention = parts[1]
    assert attention.key == "attention:dim=192,tokens=50,heads=3,ls=0,proj_bias=1,qk=64,qkv_bias=1,v=64"
    assert parts[2].key == "mlp:dim=192,tokens=50,bias=1,hidden=768,ls=0,scaled=0"
    assert parts[0].size("patch_h") == 4 and parts[0].size("prefix") == 1
    assert parts[-1].get("pool") == "token" and parts[-1].size("classes") == 10
    # the part modules compute what the model computes: the same FLOPs, part by part summed
    assert sum(module_flops(p) for p in parts) == model_flops(reference_model)


@pytest.mark.parametrize("plan, kinds", [
    ("linear:1-2", ["embed", "attention", "mlp", "attention", "mlp", "span", "attention", "mlp", "head"]),
    ("dwconv:blocks=0+2", ["embed", "dwconv", "mlp", "attention", "mlp", "dwconv", "mlp", "attention", "mlp", "head"]),
    ("attnrm:blocks=1+3", ["embed", "attention", "mlp", "mlp", "attention", "mlp", "mlp", "head"]),
    ("dwconv:heads=1.0:prefix=attend,attnrm:blocks=3:init=affine,linear:1-2:prefix=own:ridge=1e-4",
     ["embed", "attention", "mlp", "dwconv", "mlp", "span", "attn_map", "mlp", "head"]),
])
def test_compressed_model_parts(plan, kinds):
    model = compressed(plan)
    parts = model_parts(model)
    assert [p.kind for p in parts] == kinds
    assert sum(module_flops(p) for p in parts) == model_flops(model)


def test_scattered_dwconv_and_prefix_map_keys():
    model = compressed("dwconv:heads=1.0:prefix=attend,linear:1-2:prefix=own:ridge=1e-4")
    parts = {p.kind: p for p in model_parts(model)}
    assert parts["dwconv"].size("kept") == 1 and parts["dwconv"].size("width") == 16
    assert parts["dwconv"].get("prefix") == "attend" and parts["dwconv"].size("rows") == 4
    assert parts["span"].size("prefix_map") == 1


class NarrowLike(nn.Module):
    """Shaped as width compression's narrower attention (qkv: heads x (2 qk + v); proj: heads x v), not its class."""

    def __init__(self, dim: int, heads: int, qk: int, v: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.qkv = nn.Linear(dim, heads * (2 * qk + v))
        self.proj = nn.Linear(heads * v, dim)


def test_width_compressed_shapes_are_read_from_the_linear_layers(tiny):
    import copy

    model = copy.deepcopy(tiny)
    model.blocks[1].attn = NarrowLike(32, 2, 8, 12)
    model.blocks[1].mlp.fc1 = nn.Linear(32, 64)
    model.blocks[1].mlp.fc2 = nn.Linear(64, 32)
    parts = model_parts(model)
    assert (parts[3].size("qk"), parts[3].size("v"), parts[3].size("heads")) == (8, 12, 2)
    assert parts[4].size("hidden") == 64
    narrow = part_module(parts[3])
    assert narrow(torch.zeros(2, *input_shape(parts[3]))).shape == (2, 17, 32)


def test_unknown_block_is_refused_by_name(tiny):
    import copy

    model = copy.deepcopy(tiny)
    model.blocks[2] = nn.Conv1d(3, 3, 1)
    with pytest.raises(EdgeError, match=r"blocks\[2\] is a Conv1d"):
        model_parts(model)


def test_part_json_round_trip_and_bad_kind():
    part = Part.make("mlp", 192, 50, hidden=384, bias=True, scaled=1, ls=0)
    assert Part.from_json(json.loads(json.dumps(part.to_json()))) == part
    assert Part.make("mlp", 192, 50, ls=0, scaled=1, bias=1, hidden=384) == part  # order does not matter
    with pytest.raises(EdgeError, match="part kind 'conv'"):
        Part.make("conv", 8, 8)


def fake_median(part: Part, parts: list[Part]) -> float:
    """0.5 ms for the first distinct part, 1.5 for the second, ..."""
    return 0.5 + list(dict.fromkeys(parts)).index(part)


def fake_table(parts: list[Part], target: Target = CPU) -> LatencyTable:
    medians = {p: {"median_ms": fake_median(p, parts), "p90_ms": fake_median(p, parts) + 0.1} for p in parts}
    medians[overhead_part(32, 17)] = {"median_ms": 0.25}
    return LatencyTable.from_medians(target, medians, source={"model": "test"})


def test_table_round_trip(tiny, tmp_path):
    table = fake_table(model_parts(tiny))
    path = table.save(tmp_path / "t.json")
    loaded = LatencyTable.load(path)
    assert loaded.target == table.target and loaded.overhead_ms == 0.25
    assert loaded.entries == table.entries
    assert json.loads(path.read_text())["format"] == "edge-latency-table"


def test_prediction_is_overhead_plus_net_parts(tiny):
    parts = model_parts(tiny)
    table = fake_table(parts)
    prediction = predict_model(tiny, table, CPU)
    assert len(set(parts)) == 4 and len(parts) == 10   # the 4 blocks' sub-layers are 2 distinct parts, 4 times each
    expected = 0.25 + sum(fake_median(p, parts) - 0.25 for p in parts)
    assert prediction.total_ms == pytest.approx(expected, rel=1e-12)
    assert [p for p, _ in prediction.parts] == parts
    twice = predict_parts([*parts, parts[1]], table)   # one more attention sub-layer: 1.5 - 0.25 more
    assert twice.total_ms == pytest.approx(expected + 1.25, rel=1e-12)


def test_table_from_another_target_is_refused_naming_both(tiny):
    table = fake_table(model_parts(tiny))
    jetson = Target("tensorrt", "NVIDIA Jetson Orin Nano Developer Kit", "fp16", 1, None, "MAXN_SUPER")
    with pytest.raises(EdgeError) as refused:
        predict_model(tiny, table, jetson)
    message = str(refused.value)
    assert "backend, device, power_mode, precision, threads differ" in message
    assert "tensorrt on NVIDIA Jetson Orin Nano Developer Kit, power mode MAXN_SUPER, fp16, batch 1" in message
    assert "onnxruntime on Test CPU, fp32, batch 1, 2 threads" in message
    with pytest.raises(EdgeError, match="batch differ"):
        table.check(Target("onnxruntime", "Test CPU", "fp32", 32, 2))


def test_missing_part_and_bad_file_are_refused(tiny, tmp_path):
    table = fake_table(model_parts(tiny)[:3])
    with pytest.raises(EdgeError, match="is not in the latency table"):
        predict_model(tiny, table)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(EdgeError, match="is not a latency table"):
        LatencyTable.load(bad)


def test_full_grid_holds_every_width_and_the_model_own_parts(reference_model):
    parts = grid_parts(reference_model, GridConfig(grid="full"))
    keys = {p.key for p in parts}
    assert {p.key for p in model_parts(reference_model)} <= keys
    widths = {(p.size("qk"), p.size("v")) for p in parts if p.kind == "attention"}
    assert widths == {(a, b) for a in (16, 32, 48, 64) for b in (16, 32, 48, 64)}
    assert sorted({p.size("hidden") for p in parts if p.kind == "mlp"}) == list(range(64, 769, 64))
    assert {p.get("prefix") for p in parts if p.kind == "dwconv"} == {"pool", "mean", "attend"}
    assert sum(p.kind == "overhead" for p in parts) == 1 and len(keys) == len(parts)


def test_tiny_grid_timed_for_real_on_onnx_runtime(tiny):
    timing = TimingConfig(threads=1, warmup=1, iterations=4, rounds=2, sessions=1)
    table = measure_table(tiny, GridConfig(grid="model", batch=2), timing, source=TINY)
    parts = model_parts(tiny)
    assert {p.key for p in parts} | {overhead_part(32, 17).key} == set(table.entries)
    assert table.target.backend == "onnxruntime" and table.target.batch == 2 and table.target.threads == 1
    assert table.overhead_ms > 0 and all(e.latency["iterations"] == 4 for e in table.entries.values())
    # the token-stream parts are timed as chains of as many copies as the model has blocks (4), counted once
    assert {p.kind: table.entry(p).repeat for p in parts} == {"embed": 1, "attention": 4, "mlp": 4, "head": 1}
    mlp = table.entry(parts[2])
    assert mlp.net_ms == pytest.approx((mlp.median_ms - table.overhead_ms) / 4, rel=1e-12)
    prediction = predict_model(tiny, table, table.target)
    assert prediction.total_ms == pytest.approx(table.overhead_ms + sum(ms for _, ms in prediction.parts))


def test_chained_part_graph(tiny):
    import onnx

    from edge.latency.grid import part_graph_bytes

    mlp, embed = model_parts(tiny)[2], model_parts(tiny)[0]
    chain = onnx.load_from_string(part_graph_bytes(mlp, 1, "x", repeat=3))
    meta = {p.key: p.value for p in chain.metadata_props}
    assert meta["edge.latency_part"] == mlp.key and meta["edge.latency_repeat"] == "3"
    assert sum(n.op_type == "LayerNormalization" for n in chain.graph.node) == 3
    alone = onnx.load_from_string(part_graph_bytes(embed, 1, "x", repeat=3))
    assert {p.key: p.value for p in alone.metadata_props}["edge.latency_repeat"] == "1"


def test_cli_writes_a_table(tmp_path, capsys):
    out = tmp_path / "tables" / "tiny.json"
    code = main(["profile", TINY, "--latency-table", str(out), "--grid", "model", "--warmup", "1", "--iterations", "2",
                 "--rounds", "2", "--threads", "1", "--json"])
    assert code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    table = LatencyTable.load(out)
    assert printed["target"]["threads"] == 1
    assert len(table.entries) == len(printed["parts"]) == 5   # embed, attention, mlp, head, overhead
    assert main(["profile", "x.onnx", "--latency-table", str(tmp_path / "y.json")]) == 2
