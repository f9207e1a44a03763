"""Export + clean of full-size timm ViTs (224 x 224, random weights) and of the bundled reference model
with and without approximated blocks: the cleaned graph passes onnx.checker, stays at opset 17,
matches PyTorch and the raw export within the fp32 tolerances, and has the expected structure.

Slow (minutes on two cores): run with ``pytest tests/edge/graph/test_graph_big.py -m slow``.
"""

import collections

import onnx
import pytest
import torch

from edge.check.compare import Tolerance, ort_session
from edge.check.torch_compare import compare_with_torch, verification_inputs
from edge.export import ExportConfig, export
from edge.graph.clean import clean_file
from edge.models import create_model, data_config

pytestmark = pytest.mark.slow

STATIC_SHAPE_OPS = {"Shape", "ConstantOfShape", "Expand", "Where", "Equal", "Slice"}


@torch.no_grad()
def fill_zero_biases(model, seed=0):
    """Seeded N(0, 0.02) values for the biases timm initialises to zero (pretrained ones are not zero)."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in model.named_parameters():
        if name.endswith("bias") and not parameter.any():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)


def inverse_transpose_pairs(model: onnx.ModelProto) -> int:
    producers = {o: n for n in model.graph.node for o in n.output}
    pairs = 0
    for node in model.graph.node:
        first = producers.get(node.input[0]) if node.op_type == "Transpose" else None
        if first is not None and first.op_type == "Transpose":
            p1, p2 = list(first.attribute[0].ints), list(node.attribute[0].ints)
            pairs += [p1[i] for i in p2] == list(range(len(p1)))
    return pairs


def ort_fused_ops(model: onnx.ModelProto, tmp_path) -> collections.Counter:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort-optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


def export_clean_check(model, spec: str, plan: str | None, tmp_path, kept_blocks: int):
    raw_path, clean_path = tmp_path / "raw.onnx", tmp_path / "clean.onnx"
    export(model, raw_path, source=spec, plan=plan, data_config=data_config(model), config=ExportConfig())
    result = clean_file(raw_path, clean_path)  # raises if the checker or the raw-vs-clean comparison fails
    raw, clean = onnx.load(str(raw_path)), onnx.load(str(clean_path))
    onnx.checker.check_model(clean, full_check=True)
    assert [o.version for o in clean.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert all(v["passed"] for v in result["verification"])
    input_size = tuple(data_config(model)["input_size"])
    comparisons = compare_with_torch(model, ort_session(clean.SerializeToString()),
                                     verification_inputs(input_size, 1, None, seed=3), Tolerance())
    assert all(c.passed for c in comparisons), comparisons

    ops = collections.Counter(n.op_type for n in clean.graph.node)
    assert ops["Identity"] == 0 and ops["Dropout"] == 0 and ops["Constant"] == 0
    assert inverse_transpose_pairs(clean) == 0
    assert not STATIC_SHAPE_OPS & set(ops), ops  # static shape arithmetic is folded
    assert ops["Mul"] == 3 * kept_blocks  # attention scale + the two GELU Muls; LayerScale is folded away
    linear_maps = ops["MatMul"] + ops["Gemm"]  # linear-to-gemm writes layers next to Reshapes as Gemm
    assert linear_maps >= 6 * kept_blocks and ops["LayerNormalization"] == 2 * kept_blocks + 1
    assert len(clean.graph.node) < len(raw.graph.node)
    assert {p.key: p.value for p in clean.metadata_props} == {p.key: p.value for p in raw.metadata_props}
    assert ort_fused_ops(clean, tmp_path)["Gelu"] == kept_blocks  # the runtime still fuses every GELU
    return raw, clean


@pytest.mark.parametrize("arch", ["deit_small_patch16_224", "vit_base_patch16_224", "deit3_small_patch16_224",
                                  "vit_small_patch14_dinov2"])
def test_timm_vit_at_224_exports_and_cleans(tmp_path, arch):
    torch.manual_seed(0)
    spec = f"timm:{arch}"
    model = create_model(spec, img_size=224)
    fill_zero_biases(model)
    _, clean = export_clean_check(model, spec, None, tmp_path, kept_blocks=len(model.blocks))
    dims = [d.dim_value for d in clean.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 224, 224]


@pytest.mark.parametrize("plan,kept,matmuls", [
    (None, 12, 72),
    ("linear:9-10", 11, 11 * 6 + 1),
    ("linear:8-9,linear:9-10", 10, 10 * 6 + 1),  # adjacent spans fold into one linear map
    ("linear:3-4,linear:9-10,linear:10-11", 9, 9 * 6 + 2),
])
def test_bundled_reference_model_exports_and_cleans(tmp_path, plan, kept, matmuls):
    from edge.compress import CompressConfig, compress

    model = create_model("fmnist-deit-tiny")
    if plan:
        model, _ = compress(model, {"model": "fmnist-deit-tiny"},
                            CompressConfig(plan=plan, data="fmnist-mini", samples=200, seed=0))
    _, clean = export_clean_check(model, "fmnist-deit-tiny", plan, tmp_path, kept_blocks=kept)
    ops = collections.Counter(n.op_type for n in clean.graph.node)
    assert ops["MatMul"] + ops["Gemm"] == matmuls + 1  # 6 per kept block, 1 per (merged) span, + the head
