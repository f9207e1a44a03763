"""TensorRT's rules pass on every kind of graph edge writes (issue 29, point 9).

The README's commands export a compressed model, clean it, and convert it to fp16 and int8 Q/DQ;
`edge bundle` writes the same three precisions of each pipeline variant. Here that chain runs with
the writers those commands call (edge.export, edge.graph.clean, edge.precision.quantize) on the
4-block tiny ViT, uncompressed and compressed by each method (block approximation, depthwise
convolution, attention removal, width pruning), with few calibration images, and the quantize
options the README names (--softmax fp32, --placement skip, --unquantized fp32) on the uncompressed
one; each graph is checked for TensorRT 10.3 and 10.16. tests/test_readme.py checks the README's own
graphs the same way.
"""

from __future__ import annotations

import onnx
import pytest
import torch

from edge.check.tensorrt_rules import check_model, errors
from edge.check.tensorrt_support import PARSERS

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
#: one plan per compression method (None: the uncompressed model)
PLANS = {"reference": None, "linear": "linear:0-2", "dwconv": "dwconv:blocks=1+2", "attnrm": "attnrm:blocks=1+2",
         "wpac": "wpac:keep=0.5:align=8"}
SAMPLES = 32


def _structure_only():
    """The accuracy gate of edge quantize on, but not refusing: these models have random weights, so their int8
    loses top-1 agreement on near-tied logits (the tiny one: 0.92); what is tested here is the graph's structure."""
    from edge.precision.gate import GateConfig

    return GateConfig(images=16, node_images=1, accept_loss=True)


def _model(plan: str | None):
    from edge.compress import CompressConfig, compress
    from edge.models import create_model

    torch.manual_seed(0)
    model = create_model(TINY)
    if plan is not None:
        model, _ = compress(model, {"model": TINY, "weights": None, "img_size": None},
                            CompressConfig(plan=plan, data="fmnist-mini", samples=SAMPLES))
    return model


def _write_graphs(name: str, plan: str | None, folder) -> dict:
    """What `edge export`, `edge clean` and `edge quantize --precision fp16|int8` write for one model."""
    from edge.export import ExportConfig, export
    from edge.graph.clean import clean_file
    from edge.models import data_config
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file

    model = _model(plan)
    paths = {kind: folder / f"{name}.{kind}.onnx" for kind in ("export", "clean", "fp16", "int8")}
    export(model, paths["export"], source=TINY, plan=plan, data_config=data_config(model),
           config=ExportConfig(verify=False))
    clean_file(paths["export"], paths["clean"])
    quantize_file(paths["clean"], paths["fp16"], "fp16", gate=_structure_only(), check_data="fmnist-mini")
    quantize_file(paths["clean"], paths["int8"], "int8", gate=_structure_only(),
                  int8=Int8Config(data="fmnist-mini", samples=SAMPLES, cache_dir=str(folder / "cache")))
    return paths


def _write_variants(clean, folder) -> dict:
    """The README's other quantize options on one clean graph: --softmax fp32, --placement skip, --unquantized fp32."""
    from edge.precision.fp16 import Fp16Config
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file

    paths = {kind: folder / f"reference.{kind}.onnx" for kind in ("fp16-softmax32", "int8-skip", "int8-fp32")}
    quantize_file(clean, paths["fp16-softmax32"], "fp16", fp16=Fp16Config(softmax="float32"), gate=_structure_only(),
                  check_data="fmnist-mini")
    for kind, options in (("int8-skip", {"placement": "skip"}), ("int8-fp32", {"float_precision": "float32"})):
        quantize_file(clean, paths[kind], "int8", gate=_structure_only(),
                      int8=Int8Config(data="fmnist-mini", samples=SAMPLES, cache_dir=str(folder / "cache"), **options))
    return paths


@pytest.fixture(scope="module")
def edge_graphs(tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("trt-rules")
    graphs = {}
    for name, plan in PLANS.items():
        for kind, path in _write_graphs(name, plan, folder).items():
            graphs[f"{name}.{kind}"] = path
    for kind, path in _write_variants(graphs["reference.clean"], folder).items():
        graphs[f"reference.{kind}"] = path
    return graphs


@pytest.mark.parametrize("tensorrt", sorted(PARSERS))
def test_every_graph_edge_writes_passes_the_rules(edge_graphs, tensorrt):
    failing = {}
    for name, path in edge_graphs.items():
        found = errors(check_model(onnx.load(str(path)), tensorrt))
        if found:
            failing[name] = [f.line() for f in found[:5]]
    assert len(edge_graphs) == len(PLANS) * 4 + 3 and not failing, failing


def test_the_int8_graphs_hold_what_the_qdq_rules_read(edge_graphs):
    """The rules saw real Q/DQ: per-channel weight scales with their axis written, and opset 19 at IR 9."""
    for name in PLANS:
        model = onnx.load(str(edge_graphs[f"{name}.int8"]))
        initializers = {t.name: t for t in model.graph.initializer}
        per_channel = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
                       and n.input[1] in initializers and len(initializers[n.input[1]].dims) == 1
                       and initializers[n.input[1]].dims[0] > 1]
        assert per_channel and all(any(a.name == "axis" for a in n.attribute) for n in per_channel), name
        assert model.ir_version >= 9 and {o.domain: o.version for o in model.opset_import}[""] == 19, name


def test_attention_blocks_of_the_tiny_model_keep_the_fused_shape(edge_graphs):
    """Head size 16 (embed 32, 2 heads): every block of the reference's clean, fp16 and int8 graphs is fusable;
    a float32 Softmax in a float16 graph puts Casts in the chain, reported (information) as not fusable."""
    for kind in ("clean", "fp16", "int8", "fp16-softmax32"):
        notes = [f for f in check_model(onnx.load(str(edge_graphs[f"reference.{kind}"])))
                 if f.rule == "attention-fusion"]
        fusable = [f for f in notes if "head size 16" in f.what and "fuses" in f.what]
        assert len(notes) == 4 and len(fusable) == (0 if kind == "fp16-softmax32" else 4), kind
