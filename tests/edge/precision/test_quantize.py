"""edge quantize: fp16 islands and TensorRT-style int8 Q/DQ on the bundled reference model (fmnist-mini).

The full-split accuracy figures (all 10,000 test images, each calibration method) come from
benchmarks/precision.py; here the structure is checked exactly and accuracy on a subset.
"""

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from calib.placement import qdq_violations
from edge.errors import EdgeError
from edge.precision.fp16 import Fp16Config, convert_to_fp16
from edge.precision.gate import GateConfig
from edge.precision.int8 import Int8Config
from edge.precision.quantize import quantize_file

TEST_IMAGES = 300  # the full 10,000: benchmarks/precision.py
CALIBRATION = 64
GATE = GateConfig(images=200, node_images=4)   # the default: 500 and 8; the gate's own tests are test_gate.py


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The reference model exported with a dynamic batch (float32), and its fp16 and int8 variants."""
    from edge.export import ExportConfig, export
    from edge.models import create_model, data_config

    folder = tmp_path_factory.mktemp("quantize")
    model = create_model("fmnist-deit-tiny")
    fp32 = folder / "ref.onnx"
    export(model, fp32, source="fmnist-deit-tiny", plan=None, data_config=data_config(model),
           config=ExportConfig(dynamic_batch=True, verify=False))
    fp16 = folder / "ref.fp16.onnx"
    int8 = folder / "ref.int8.onnx"
    int8_modelopt = folder / "ref.int8.modelopt.onnx"
    int8_linear = folder / "ref.int8.linear-sq.onnx"
    gate = GATE
    reports = {"fp16": quantize_file(fp32, fp16, "fp16", gate=gate),
               "int8": quantize_file(fp32, int8, "int8", gate=gate, int8=Int8Config(
                   data="fmnist-mini", samples=CALIBRATION, cache_dir=str(folder / "cache"), placement="skip")),
               "int8_modelopt": quantize_file(fp32, int8_modelopt, "int8", gate=gate, int8=Int8Config(
                   data="fmnist-mini", samples=CALIBRATION, cache_dir=str(folder / "cache"), placement="modelopt")),
               "int8_linear": quantize_file(fp32, int8_linear, "int8", gate=gate, int8=Int8Config(  # the default
                   data="fmnist-mini", samples=CALIBRATION, cache_dir=str(folder / "cache")))}
    return {"fp32": fp32, "fp16": fp16, "int8": int8, "int8_modelopt": int8_modelopt, "int8_linear": int8_linear,
            "reports": reports, "folder": folder}


def value_types(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def test_fp16_casts_only_at_island_boundaries(graphs):
    model = onnx.load(str(graphs["fp16"]))
    types = value_types(model)
    FLOAT, HALF = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    producers = {o: n for n in model.graph.node for o in n.output}
    ops = collections.Counter(n.op_type for n in model.graph.node)
    for node in model.graph.node:
        if node.op_type in ("LayerNormalization", "Gemm"):  # islands: norms, the head
            assert all(types[i] == FLOAT for i in node.input if i), node.name
        if node.op_type in ("MatMul", "Softmax"):  # Softmax float16 by default: no Casts inside attention
            assert all(types[i] == HALF for i in node.input), node.name
        if node.op_type == "Cast":
            assert {types[node.input[0]], types[node.output[0]]} == {FLOAT, HALF}, node.name  # crosses a boundary
            assert producers.get(node.input[0]) is None or producers[node.input[0]].op_type != "Cast"  # no chains
    assert types[model.graph.input[0].name] == FLOAT and types[model.graph.output[0].name] == FLOAT
    # 12 blocks x (norm1, norm2) in and out + the input + the final island (norm -> head): 50 Casts
    assert ops["Cast"] == 50 == graphs["reports"]["fp16"]["casts"]
    weights = {t.name: t.data_type for t in model.graph.initializer}
    matmul_weights = [n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert len(matmul_weights) == 48 and all(weights[w] == HALF for w in matmul_weights)  # stored fp16, no Cast
    metadata = {p.key: p.value for p in model.metadata_props}
    assert (metadata["edge.precision"], metadata["edge.softmax"]) == ("float16", "float16")
    assert "Softmax" not in metadata["edge.fp32_ops"].split(",")


def test_fp16_softmax_float32_is_an_option(graphs, tmp_path):
    out = tmp_path / "softmax32.onnx"
    report = quantize_file(graphs["fp32"], out, "fp16", fp16=Fp16Config(softmax="float32"), gate=GATE)
    model = onnx.load(str(out))
    types = value_types(model)
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(softmax) == 12 and all(types[n.input[0]] == types[n.output[0]] == onnx.TensorProto.FLOAT
                                      for n in softmax)
    assert report["casts"] == 74 and report["softmax"] == "float32"  # 24 more: into and out of each Softmax
    metadata = {p.key: p.value for p in model.metadata_props}
    assert metadata["edge.softmax"] == "float32" and "Softmax" in metadata["edge.fp32_ops"].split(",")
    with pytest.raises(EdgeError, match="Softmax precision"):
        quantize_file(graphs["fp32"], out, "fp16", fp16=Fp16Config(softmax="bf16"))


def test_int8_graph_follows_tensorrt_qdq_rules(graphs):
    model = onnx.load(str(graphs["int8"]))
    assert qdq_violations(model) == []
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    for node in qdq:  # symmetric int8 only
        zero_point = inits[node.input[2]]
        assert zero_point.data_type == onnx.TensorProto.INT8 and not np.any(numpy_helper.to_array(zero_point))
    readers = collections.Counter(r.op_type for r in model.graph.node for i in r.input
                                  if i in producers and producers[i].op_type == "DequantizeLinear")
    assert set(readers) == {"MatMul", "Gemm", "Conv", "Add"}
    for node in model.graph.node:
        dq_inputs = [i for i in node.input if i in producers and producers[i].op_type == "DequantizeLinear"]
        if node.op_type in ("MatMul", "Gemm", "Conv"):
            assert len(dq_inputs) == 2, node.name  # both operands quantized (activation and weight / activation)
        if node.op_type in ("LayerNormalization", "Softmax"):
            assert not dq_inputs, node.name
        if node.op_type == "MatMul" and node.input[1] in producers:
            dq = producers[node.input[1]]
            if dq.input[0] in inits:  # a weight: per output channel
                scale = numpy_helper.to_array(inits[dq.input[1]])
                assert scale.size == numpy_helper.to_array(inits[dq.input[0]]).shape[1] > 1
    residual = [n for n in model.graph.node if n.op_type == "Add" and any(
        i in producers and producers[i].op_type == "DequantizeLinear" for i in n.input)]
    assert len(residual) == 24  # 2 residual Adds per block, skip input only
    assert all(sum(i in producers and producers[i].op_type == "DequantizeLinear" for i in n.input) == 1
               for n in residual)
    assert graphs["reports"]["int8"]["quantized_nodes"] == {"MatMul": 72, "Gemm": 1, "Conv": 1, "Add": 24,
                                                            "LayerNormalization": 0}


def test_int8_computes_the_unquantized_part_in_float16(graphs):
    """TensorRT INT8+FP16: everything outside Q/DQ is float16 but the fp16 pass's float32 islands."""
    model = onnx.load(str(graphs["int8"]))
    types = value_types(model)
    FLOAT, HALF = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    producers = {o: n for n in model.graph.node for o in n.output}
    ops = collections.Counter(types[n.output[0]] for n in model.graph.node
                              if n.op_type in ("MatMul", "Add", "Softmax", "Erf", "Mul", "Reshape")
                              and types[n.output[0]] in (FLOAT, HALF))  # not the shape arithmetic
    assert ops[HALF] > 200 and ops[FLOAT] == 0  # every GEMM output, residual Add, GELU, Softmax
    for node in model.graph.node:
        if node.op_type == "LayerNormalization":
            assert types[node.input[0]] == types[node.output[0]] == FLOAT, node.name
        if node.op_type == "DequantizeLinear":  # a DQ feeds its reader in the reader's type: no Cast between
            assert all(r.op_type != "Cast" for r in model.graph.node if node.output[0] in r.input), node.name
        if node.op_type == "MatMul":
            assert all(producers[i].op_type == "DequantizeLinear" and types[i] == HALF for i in node.input)
    assert types[model.graph.input[0].name] == FLOAT and types[model.graph.output[0].name] == FLOAT
    assert max(o.version for o in model.opset_import if o.domain == "") == 19  # float16 Q/DQ scales
    metadata = {p.key: p.value for p in model.metadata_props}
    assert (metadata["edge.precision"], metadata["edge.float_precision"], metadata["edge.softmax"]) == \
        ("int8", "float16", "float16")
    assert graphs["reports"]["int8"]["check"]["top1_agreement"] >= 0.95


def test_int8_modelopt_placement(graphs):
    """ModelOpt's: the branch input of each residual Add, the LayerNorm inputs, no Q/DQ in the head; the
    LayerNorm's DQ writes float16 and a Cast to float32 follows (NVIDIA/TensorRT#4832)."""
    from calib.placement import _float_view, residual_adds
    from edge.precision.fp16 import head_nodes

    model = onnx.load(str(graphs["int8_modelopt"]))
    skip = residual_adds(_float_view(model))
    assert qdq_violations(model, "modelopt") == []
    assert any("not a residual skip input" in p for p in qdq_violations(model, "skip"))
    producers = {o: n for n in model.graph.node for o in n.output}
    head = head_nodes(model.graph)

    def dequantized(node):
        return [i for i, name in enumerate(node.input) if name in producers and (
            producers[name].op_type == "DequantizeLinear" or producers[name].op_type == "Cast"
            and producers[name].input[0] in producers and producers[producers[name].input[0]].op_type
            == "DequantizeLinear")]

    roles = collections.Counter()
    for node in model.graph.node:
        if node.name in head:
            assert not dequantized(node), node.name  # the GEMV head stays float
        elif node.op_type == "Add" and dequantized(node):
            branch = node.input[dequantized(node)[0]]
            source = producers[producers[branch].input[0]].input[0]  # DQ <- Q <- the float tensor
            roles["Add branch"] += node.name in skip and skip[node.name] != source
        elif node.op_type == "LayerNormalization":
            roles["LayerNorm"] += dequantized(node) == [0] and producers[node.input[0]].op_type == "Cast"
    assert roles == {"Add branch": 24, "LayerNorm": 24}  # the final norm belongs to the head
    assert graphs["reports"]["int8_modelopt"]["float16_rest"]["dq_fp32_outputs"] == []
    assert graphs["reports"]["int8_modelopt"]["quantized_nodes"] == {"MatMul": 72, "Gemm": 0, "Conv": 1, "Add": 24,
                                                                     "LayerNormalization": 24}
    assert {p.key: p.value for p in model.metadata_props}["edge.qdq_placement"] == "modelopt"
    assert graphs["reports"]["int8_modelopt"]["check"]["top1_agreement"] >= 0.95


def test_int8_default_is_linear_sq(graphs):
    """The default placement: SmoothQuant folded into the 24 LayerNorm -> qkv/fc1 pairs, then Q/DQ on the weight
    GEMMs' two inputs only (48 Linear MatMuls and the patch Conv); the attention MatMuls, residual Adds, LayerNorms
    and the head float16/float32, no float32-output DQ."""
    model = onnx.load(str(graphs["int8_linear"]))
    assert qdq_violations(model, "linear-sq") == []
    assert any("no constant weight" in p for p in qdq_violations(onnx.load(str(graphs["int8_modelopt"])), "linear"))
    report = graphs["reports"]["int8_linear"]
    assert report["quantized_nodes"] == {"MatMul": 48, "Gemm": 0, "Conv": 1, "Add": 0, "LayerNormalization": 0}
    assert (report["quantize_nodes"], report["dequantize_nodes"]) == (49, 98)
    assert report["float16_rest"]["dq_fp32_outputs"] == []
    assert len(report["smoothquant"]["smoothed"]) == 24 and report["smoothquant"]["alpha"] == 0.5
    types = value_types(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type == "MatMul" and not any(i in producers and producers[i].op_type == "DequantizeLinear"
                                                for i in node.input):
            assert all(types[i] == onnx.TensorProto.FLOAT16 for i in node.input), node.name  # attention, fp16
    assert {p.key: p.value for p in model.metadata_props}["edge.qdq_placement"] == "linear-sq"


def test_int8_cli_keeps_onnxruntime_advice_off_the_terminal(graphs, tmp_path, capfd):
    """--unquantized fp32 keeps INT8+FP32; ONNX Runtime's pre-processing advice lands in the result."""
    import json

    from edge.cli import main

    out = tmp_path / "fp32rest.onnx"
    assert main(["quantize", str(graphs["fp32"]), "--precision", "int8", "--data", "fmnist-mini", "--samples",
                 str(CALIBRATION), "--cache-dir", str(tmp_path / "cache"), "--unquantized", "fp32", "--out", str(out),
                 "--gate-images", "100", "--json"]) == 0
    captured = capfd.readouterr()
    assert "pre-processing" not in captured.err and "WARNING" not in captured.err
    result = json.loads(captured.out)
    assert any("pre-processing" in line for line in result["onnxruntime_log"])
    model = onnx.load(str(out))
    assert onnx.TensorProto.FLOAT16 not in set(value_types(model).values())
    metadata = {p.key: p.value for p in model.metadata_props}
    assert (metadata["edge.float_precision"], result["float_precision"]) == ("float32", "float32")
    assert "edge.softmax" not in metadata


def test_structure_check_catches_a_broken_graph(graphs):
    model = onnx.load(str(graphs["int8"]))
    zero_point = next(t for t in model.graph.initializer if t.name.endswith("_zero_point"))
    zero_point.CopyFrom(numpy_helper.from_array(np.ones_like(numpy_helper.to_array(zero_point)), zero_point.name))
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in
              {t.name for t in model.graph.initializer})
    ln.input[0] = dq.output[0]
    problems = qdq_violations(model)
    assert any("non-zero zero point" in p for p in problems)
    assert any("read by LayerNormalization" in p for p in problems)


def accuracy(path, images, labels, spec):
    from edge.check.compare import ort_session
    from edge.data import ArrayPreprocess

    session = ort_session(str(path), threads=2)
    x = ArrayPreprocess(spec)(images).numpy()
    logits = np.concatenate([session.run(None, {"input": x[i:i + 250]})[0] for i in range(0, len(x), 250)])
    return float((logits.argmax(-1) == labels.numpy()).mean())


def test_accuracy_on_fmnist_mini(graphs):
    from edge.data import load_dataset
    from edge.precision.calibration import input_spec_of

    data = load_dataset("fmnist-mini", "test")
    images, labels = data.images[:TEST_IMAGES], data.labels[:TEST_IMAGES]
    spec = input_spec_of(onnx.load(str(graphs["fp32"]), load_external_data=False), "ref")
    acc = {k: accuracy(graphs[k], images, labels, spec) for k in ("fp32", "fp16", "int8", "int8_modelopt",
                                                                   "int8_linear")}
    assert acc["fp32"] > 0.8
    assert abs(acc["fp16"] - acc["fp32"]) <= 1 / TEST_IMAGES + 1e-9  # one image (acceptance: 0.2 pt, full split)
    for int8 in ("int8", "int8_modelopt", "int8_linear"):
        assert acc["fp32"] - acc[int8] <= 6 / TEST_IMAGES + 1e-9     # acceptance: 1.0 pt on the full split
        assert graphs["reports"][int8]["check"]["top1_agreement"] >= 0.95


def test_agreement_check_covers_a_static_batch_above_64(graphs):
    from edge.precision.quantize import _check_images

    model = onnx.load(str(graphs["fp32"]))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 100  # as `edge export --batch 100` writes
    assert _check_images(model, "ref", "fmnist-mini", 64)[0].shape[0] == 100  # the gate asked for 64 images


def test_calibration_is_cached_and_deterministic(graphs, tmp_path):
    config = Int8Config(data="fmnist-mini", samples=CALIBRATION, cache_dir=str(graphs["folder"] / "cache"),
                        placement="skip")
    report = quantize_file(graphs["fp32"], tmp_path / "again.onnx", "int8", int8=config, gate=GATE)
    assert report["calibration"]["cache_hit"] is True
    assert (tmp_path / "again.onnx").read_bytes() == graphs["int8"].read_bytes()


def test_bad_input_writes_nothing(graphs, tmp_path):
    out = tmp_path / "out.onnx"
    with pytest.raises(EdgeError, match="does not exist"):
        quantize_file(tmp_path / "missing.onnx", out, "fp16")
    with pytest.raises(EdgeError, match="already int8"):
        quantize_file(graphs["int8"], out, "int8")
    with pytest.raises(EdgeError, match="calibration method"):
        quantize_file(graphs["fp32"], out, "int8", int8=Int8Config(method="kl"))
    with pytest.raises(EdgeError, match="--precision"):
        quantize_file(graphs["fp32"], out, "int4")
    assert not out.exists()


def test_fp16_block_list_is_configurable():
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain=""),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    converted, report = convert_to_fp16(model, Fp16Config(block_list=("Gelu",), keep_head_fp32=False))
    assert report.fp32_nodes == ["gelu"] and report.casts == 2  # into Relu's fp16 island, and back for the output
    x = torch.randn(2, 3).numpy()
    from edge.check.compare import ort_session

    y = ort_session(converted.SerializeToString()).run(None, {"x": x})[0]
    assert y.dtype == np.float32 and np.allclose(y, np.maximum(0.5 * x * (1 + np.vectorize(__import__("math").erf)(
        x / np.sqrt(2))), 0), atol=2e-3)
