"""token-depthwise-conv (``edge clean --plugins``): each dwconv mixer becomes one TokenDepthwiseConv plugin node.

Real exports of edge's DepthwiseAttention: the tiny ViT with blocks 1 and 2 replaced, once per
``prefix`` option, and the reference model with ``dwconv:auto=3``. The plugin graph runs in ONNX
Runtime with the plugin's numpy reference (onnxruntime-extensions) and must give the plain cleaned
graph's outputs within 1e-5; ``prefix=attend`` is left as it is, with a note.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from edge.check.compare import ort_session
from edge.check.plugin_ops import DOMAIN, TOKEN_DEPTHWISE_CONV, read_fields
from edge.cli import main
from edge.graph import DEFAULT_PASSES
from edge.graph.clean import clean_file
from edge.graph.passes import PLUGIN_PASSES, select_passes
from edge.check.tensorrt_rules import INFO, check_model, errors

pytest.importorskip("onnxruntime_extensions", reason="onnxruntime-extensions runs the plugin's reference in ORT "
                    "(pip install -e '.[test]')")

TINY = "timm:vit_tiny_patch16_224,img_size=28,patch_size=7,in_chans=1,num_classes=10,depth=4,embed_dim=32,num_heads=2"
PLUGIN = PLUGIN_PASSES["token-depthwise-conv"]
TOLERANCE = 1e-5
#: the mixer's own nodes the plugin node replaces, per mixer (its Reshapes too, but linear-to-gemm writes
#: Reshapes of its own around the plain graph's value projection, which the plugin graph keeps as MatMul + Add)
REPLACED = {
    "pool": ["Slice", "Transpose", "Conv", "Transpose", "Unsqueeze", "ReduceSum", "Concat"],
    "mean": ["Slice", "ReduceMean", "Transpose", "Conv", "Transpose", "Concat"],
    "drop": ["Transpose", "Conv", "Transpose"],
}
MIXER_OPS = ("Slice", "Transpose", "Conv", "Unsqueeze", "ReduceSum", "ReduceMean", "Concat")


def _export(model, plan: str, path, dynamic_batch: bool = False) -> None:
    from edge.export import ExportConfig, export
    from edge.models import data_config

    export(model, path, source=plan, plan=plan, data_config=data_config(model),
           config=ExportConfig(verify=False, dynamic_batch=dynamic_batch))


def _compressed(name: str, plan: str, samples: int):
    from edge.compress import CompressConfig, compress
    from edge.models import create_model

    torch.manual_seed(0)
    model = create_model(name)
    model, _ = compress(model, {"model": name, "weights": None, "img_size": None},
                        CompressConfig(plan=plan, data="fmnist-mini", samples=samples))
    return model


def _randomise_biases(model) -> None:
    """timm starts biases at zero; a trained model's are not (the value bias must survive the rewrite)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)


@pytest.fixture(scope="module")
def tiny_graphs(tmp_path_factory) -> dict[str, dict]:
    """For each prefix option: the export, its default clean and its --plugins clean (paths and reports)."""
    folder = tmp_path_factory.mktemp("token-depthwise")
    graphs = {}
    for prefix in ("pool", "mean", "drop", "attend"):
        model = _compressed(TINY, f"dwconv:blocks=1+2:prefix={prefix}", samples=16)
        _randomise_biases(model)
        paths = {kind: folder / f"{prefix}.{kind}.onnx" for kind in ("export", "clean", "plugins")}
        _export(model, f"dwconv:blocks=1+2:prefix={prefix}", paths["export"])
        clean_file(paths["export"], paths["clean"])
        graphs[prefix] = {**paths, "report": clean_file(paths["export"], paths["plugins"],
                                                        select_passes(plugins=True))["report"]}
    return graphs


def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _outputs(path, x: np.ndarray) -> np.ndarray:
    session = ort_session(str(path))
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("prefix, prefix_tokens", [("pool", 1), ("mean", 1), ("drop", 0)])
def test_each_mixer_becomes_one_plugin_node_with_the_outputs_of_the_plain_graph(tiny_graphs, prefix, prefix_tokens):
    graphs = tiny_graphs[prefix]
    plain, plugged = _ops(graphs["clean"]), _ops(graphs["plugins"])
    assert plugged[TOKEN_DEPTHWISE_CONV] == 2 and plain[TOKEN_DEPTHWISE_CONV] == 0
    assert plugged["Conv"] == plain["Conv"] - 2 == 1                         # the patch embedding's stays
    for op in MIXER_OPS:
        assert plugged[op] == plain[op] - 2 * REPLACED[prefix].count(op), op
    assert sum(plugged.values()) < sum(plain.values())
    model = onnx.load(str(graphs["plugins"]))
    onnx.checker.check_model(model, full_check=True)
    nodes = [n for n in model.graph.node if n.op_type == TOKEN_DEPTHWISE_CONV]
    for node in nodes:
        fields = read_fields(node)
        assert node.domain == DOMAIN and len(node.input) == 1
        assert (fields.kernel_size, fields.grid, fields.prefix_tokens) == (3, (4, 4), prefix_tokens)
        assert fields.prefix_mode == ("pool" if prefix == "pool" else "mean")
        assert (fields.prefix_weights is not None) == (prefix == "pool")
        assert fields.bias is not None and np.abs(fields.bias).max() > 0
    x = np.random.default_rng(3).standard_normal((1, 1, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(_outputs(graphs["plugins"], x), _outputs(graphs["clean"], x), rtol=0, atol=TOLERANCE)
    assert graphs["report"]["notes"] == []


def test_prefix_attend_is_left_as_it_is_with_a_note(tiny_graphs):
    graphs = tiny_graphs["attend"]
    assert _ops(graphs["plugins"]) == _ops(graphs["clean"])
    notes = graphs["report"]["notes"]
    assert len(notes) == 2 and all("prefix=attend" in n and "left as it is" in n for n in notes)
    assert "'/blocks/blocks.1/attn/conv/Conv'" in notes[0] and "'/blocks/blocks.2/attn/conv/Conv'" in notes[1]
    assert graphs["report"]["passes"]["token-depthwise-conv"]["changes"] == 0


def test_the_pass_is_off_by_default_and_runs_before_linear_to_gemm(tiny_graphs):
    assert PLUGIN not in DEFAULT_PASSES and select_passes() == DEFAULT_PASSES
    names = [p.name for p in select_passes(["remove-noops"], plugins=True)]
    assert names[names.index("token-depthwise-conv") + 1] == "linear-to-gemm"
    defaults = [p.name for p in DEFAULT_PASSES if p.name != "remove-noops"]
    assert [n for n in names if n != "token-depthwise-conv"] == defaults
    assert tiny_graphs["pool"]["report"]["passes"]["token-depthwise-conv"]["changes"] == 1
    assert _ops(tiny_graphs["pool"]["clean"])[TOKEN_DEPTHWISE_CONV] == 0


def test_the_pass_runs_to_a_fixed_point(tiny_graphs, tmp_path):
    """Cleaning the plugin graph again with --plugins changes nothing."""
    again = clean_file(tiny_graphs["pool"]["plugins"], tmp_path / "again.onnx", select_passes(plugins=True))
    assert again["report"]["passes"]["token-depthwise-conv"]["changes"] == 0
    assert _ops(tmp_path / "again.onnx") == _ops(tiny_graphs["pool"]["plugins"])


def test_edge_check_takes_the_plugin_op_with_a_note(tiny_graphs):
    findings = check_model(onnx.load(str(tiny_graphs["pool"]["plugins"])))
    plugin = [f for f in findings if f.rule == "plugin"]
    assert errors(findings) == [] and len(plugin) == 2 and all(f.severity == INFO for f in plugin)
    assert "libedge_plugins.so" in plugin[0].what and "--dynamicPlugins" in plugin[0].fix


def test_cli_plugins_flag_prints_the_notes(tiny_graphs, tmp_path, capsys):
    out = tmp_path / "attend.onnx"
    assert main(["clean", str(tiny_graphs["attend"]["export"]), "--out", str(out), "--plugins"]) == 0
    text = capsys.readouterr().out
    assert text.count("note: TokenDepthwiseConv: the depthwise convolution") == 2
    assert main(["clean", str(tiny_graphs["pool"]["export"]), "--out", str(out), "--plugins", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["report"]
    assert report["passes"]["token-depthwise-conv"]["changes"] == 1 and report["notes"] == []
    assert _ops(out)[TOKEN_DEPTHWISE_CONV] == 2


def _plugin_node(**changes) -> onnx.NodeProto:
    fields = {"kernel_size": 3, "grid": [3, 4], "prefix_tokens": 1, "prefix_mode": "pool",
              "weight": numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32)),
              "prefix_weights": numpy_helper.from_array(np.ones((1, 13, 4), np.float32)), **changes}
    fields = {k: v for k, v in fields.items() if v is not None}
    return helper.make_node(TOKEN_DEPTHWISE_CONV, ["x"], ["y"], name="mixer", domain=DOMAIN, **fields)


def test_a_plugin_node_the_creator_would_refuse_is_an_error_naming_the_field():
    from edge.errors import EdgeError

    read_fields(_plugin_node())
    with pytest.raises(EdgeError, match=r"kernel_size=2: expected an odd size <= min\(H, W\) = 3"):
        read_fields(_plugin_node(kernel_size=2, weight=numpy_helper.from_array(np.ones((4, 1, 2, 2), np.float32))))
    with pytest.raises(EdgeError, match=r"prefix_weights of shape None: expected \[1, 13, 4\]"):
        read_fields(_plugin_node(prefix_weights=None))
    with pytest.raises(EdgeError, match="missing \\['weight'\\]"):
        read_fields(_plugin_node(weight=None))
    graph = helper.make_graph([_plugin_node(prefix_mode="attend")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 13, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 13, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    finding = next(f for f in check_model(model) if f.rule == "plugin")
    assert finding in errors(check_model(model)) and "prefix_mode='attend'" in finding.what


@pytest.mark.slow  # compresses and evaluates the reference model (~26 s); the prefix-mode tests run by default
def test_reference_model_dwconv_auto3_gives_three_plugin_nodes_and_the_same_accuracy(tmp_path):
    """The issue's acceptance: `dwconv:auto=3` of fmnist-deit-tiny, exported with a dynamic batch."""
    from edge.check.accuracy import evaluate
    from edge.check.onnx_classifier import OnnxClassifier
    from edge.data import load_dataset
    from edge.data.preprocess import InputSpec

    model = _compressed("fmnist-deit-tiny", "dwconv:auto=3", samples=64)
    raw, plain, plugged = tmp_path / "dw3.onnx", tmp_path / "dw3.clean.onnx", tmp_path / "dw3.plugins.onnx"
    _export(model, "dwconv:auto=3", raw, dynamic_batch=True)
    clean_file(raw, plain)
    clean_file(raw, plugged, select_passes(plugins=True))
    assert _ops(plugged)[TOKEN_DEPTHWISE_CONV] == 3 and _ops(plugged)["Conv"] == 1
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(_outputs(plugged, x), _outputs(plain, x), rtol=0, atol=TOLERANCE)
    dataset = load_dataset("fmnist-mini", "test")
    results = []
    for path in (plain, plugged):
        graph = OnnxClassifier(path)
        results.append(evaluate(graph, dataset, InputSpec.from_data_config(graph.data_config()), show_progress=False))
    assert results[0]["samples"] == results[1]["samples"] == 2000
    assert results[1]["correct"] == results[0]["correct"]
    assert abs(results[1]["loss"] - results[0]["loss"]) < 1e-5
