"""fuse-layer-norm: every decomposed LayerNorm form exporters write becomes one LayerNormalization.

Torch's forms are exported from small modules with torch.onnx (dynamo=False, as edge export);
the forms torch does not write (Reciprocal, Pow(-0.5), a positive axis, eps first) are built by
hand. Each fused graph must match the original in ONNX Runtime and hold fewer nodes.
"""

import collections
import io
import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from edge.check.compare import ort_session, run_ort
from edge.cli import main
from edge.graph import PASSES, clean_graph

FUSE = PASSES["fuse-layer-norm"]
WIDTH = 8
RNG = np.random.default_rng(0)


class HandWrittenNorm(nn.Module):
    """A LayerNorm over the last axis as people write it by hand, in one of torch's forms."""

    def __init__(self, form: str, affine: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.form, self.eps = form, eps
        self.weight = nn.Parameter(torch.rand(WIDTH) + 0.5) if affine else None
        self.bias = nn.Parameter(torch.rand(WIDTH)) if affine else None

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        if self.form == "pow-div":  # (x - mean) / sqrt(mean((x - mean)^2) + eps)
            y = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        elif self.form == "mul-rsqrt":  # (x - mean) * rsqrt(mean((x - mean)(x - mean)) + eps)
            y = centred * torch.rsqrt((centred * centred).mean(-1, keepdim=True) + self.eps)
        elif self.form == "torch-var":  # torch.var centres x a second time
            y = (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps)
        else:
            raise ValueError(self.form)
        return y * self.weight + self.bias if self.weight is not None else y


class Block(nn.Module):
    """Linear -> hand-written LayerNorm -> Linear: the decomposed norm between two GEMMs."""

    def __init__(self, form: str = "pow-div") -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(WIDTH, WIDTH), HandWrittenNorm(form), nn.Linear(WIDTH, 4)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)))


def export(module: nn.Module, opset: int, shape=(2, 5, WIDTH)) -> onnx.ModelProto:
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(*shape),), buffer, dynamo=False, opset_version=opset,
                          input_names=["x"], output_names=["y"], do_constant_folding=True)
    return onnx.load_from_string(buffer.getvalue())


def ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node if n.op_type != "Constant")


def fuse_and_compare(model: onnx.ModelProto, scale: float = 1.0):
    """fuse-layer-norm alone through the manager; outputs compared again here on inputs with an offset."""
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = (RNG.standard_normal(shape) * scale + 3.0).astype(np.float32)
    cleaned, report = clean_graph(model, passes=(FUSE,))
    np.testing.assert_allclose(run_ort(ort_session(cleaned.SerializeToString()), x),
                               run_ort(ort_session(model.SerializeToString()), x), rtol=1e-4, atol=1e-4)
    onnx.checker.check_model(cleaned, full_check=True)
    return cleaned, report


def layer_norm_of(model: onnx.ModelProto) -> onnx.NodeProto:
    (norm,) = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    return norm


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMean axes: attribute below 18, an input from 18
@pytest.mark.parametrize("form", ["pow-div", "mul-rsqrt", "torch-var"])
@pytest.mark.parametrize("affine", [True, False])
def test_torch_forms_become_one_layer_norm(form, affine, opset):
    model = export(HandWrittenNorm(form, affine), opset)
    cleaned, report = fuse_and_compare(model, scale=10.0)
    assert ops(cleaned) == {"LayerNormalization": 1}
    assert report.nodes_after == 1 < report.nodes_before
    norm = layer_norm_of(cleaned)
    attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
    assert attrs["axis"] == -1 and attrs["epsilon"] == pytest.approx(1e-6)
    assert len(norm.input) == (3 if affine else 2)


def _hand_built(nodes, inits, shape=(2, 5, WIDTH), opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _norm_nodes(inverse: str, axes=(-1,), eps_first=False, scale_first=False, square="Mul"):
    """x - mean over ``axes``, squared, mean, + eps, then the normalisation ``inverse``, * gamma + beta."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=list(axes)),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["sq"]) if square == "Mul" else
             helper.make_node("Pow", ["d", "int_two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["v"], axes=list(axes)),
             helper.make_node("Add", ["eps", "v"] if eps_first else ["v", "eps"], ["ve"])]
    if inverse == "reciprocal":
        nodes += [helper.make_node("Sqrt", ["ve"], ["s"]), helper.make_node("Reciprocal", ["s"], ["r"])]
    elif inverse == "pow-half":
        nodes += [helper.make_node("Pow", ["ve", "minus_half"], ["r"])]
    nodes.append(helper.make_node("Mul", ["r", "d"] if scale_first else ["d", "r"], ["n"]))
    nodes += [helper.make_node("Mul", ["gamma", "n"], ["g"]), helper.make_node("Add", ["g", "beta"], ["y"])]
    return nodes


def _inits():
    return {"eps": np.array(1e-5, np.float32), "minus_half": np.array(-0.5, np.float32), "int_two": np.array(2),
            "gamma": RNG.uniform(0.5, 2, WIDTH).astype(np.float32),
            "beta": RNG.standard_normal((1, 1, WIDTH)).astype(np.float32)}


@pytest.mark.parametrize("inverse,axes,eps_first,scale_first,square", [
    ("reciprocal", (-1,), False, False, "Mul"),  # x * Reciprocal(Sqrt(var + eps))
    ("pow-half", (-1,), False, False, "Mul"),    # x * Pow(var + eps, -0.5)
    ("pow-half", (2,), True, True, "Mul"),       # the last axis by its index, eps first, the scale first
    ("reciprocal", (-1,), False, False, "Pow"),  # Pow(d, 2) with an int64 exponent
])
def test_hand_built_forms_torch_does_not_write(inverse, axes, eps_first, scale_first, square):
    model = _hand_built(_norm_nodes(inverse, axes, eps_first, scale_first, square), _inits())
    cleaned, report = fuse_and_compare(model, scale=10.0)
    assert ops(cleaned) == {"LayerNormalization": 1} and report.nodes_after < report.nodes_before
    scale, bias = ({t.name: numpy_helper.to_array(t) for t in cleaned.graph.initializer}[n]
                   for n in layer_norm_of(cleaned).input[1:])
    assert scale.shape == bias.shape == (WIDTH,)


def test_opset_18_hand_built_axes_input():
    nodes = _norm_nodes("reciprocal")
    for node in nodes:
        if node.op_type == "ReduceMean":
            del node.attribute[:]
            node.input.append("last_axis")
    model = _hand_built(nodes, {**_inits(), "last_axis": np.array([-1], np.int64)}, opset=18)
    cleaned, _ = fuse_and_compare(model)
    assert ops(cleaned) == {"LayerNormalization": 1}


def _unchanged(model):
    cleaned, report = clean_graph(model, passes=(FUSE,))
    assert report.passes["fuse-layer-norm"].changes == 0 and "LayerNormalization" not in ops(cleaned)
    return cleaned


@pytest.mark.parametrize("case", ["not the last axis", "two axes", "eps not a constant", "mean read elsewhere"])
def test_other_norms_are_left_alone(case):
    inits = _inits()
    if case == "not the last axis":  # a norm over tokens: LayerNormalization(axis=-1) computes something else
        nodes = _norm_nodes("reciprocal", axes=(1,))
    elif case == "two axes":
        nodes = _norm_nodes("reciprocal", axes=(1, 2))
    elif case == "eps not a constant":
        nodes = [helper.make_node("Relu", ["x"], ["eps_full"]),
                 helper.make_node("ReduceMean", ["eps_full"], ["eps"], axes=[-1])] + _norm_nodes("reciprocal")
        del inits["eps"]
    else:  # the mean is also written out: removing its ReduceMean would lose it
        nodes = _norm_nodes("reciprocal") + [helper.make_node("Add", ["y", "m"], ["y2"])]
        model = _hand_built(nodes, inits)
        model.graph.output[0].name = "y2"
        _unchanged(model)
        return
    _unchanged(_hand_built(nodes, inits))


def test_rms_norm_is_left_decomposed():
    """timm's RmsNorm (x * rsqrt(mean(x^2) + eps)): no single op before opset 23, which TensorRT 10.3 lacks."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"]),
             helper.make_node("Mul", ["n", "gamma"], ["y"])]
    _unchanged(_hand_built(nodes, _inits()))


def test_edge_clean_fuses_a_hand_written_layer_norm_exported_at_opset_17(tmp_path, capsys):
    """Issue 30's acceptance: the decomposed-LayerNorm graph leaves `edge clean` with one
    LayerNormalization and no Pow, verified by edge clean on its two input sets."""
    raw = export(Block("pow-div"), 17)
    assert {"Pow", "ReduceMean", "Sub", "Sqrt", "Div"} <= set(ops(raw))
    onnx.save(raw, str(tmp_path / "raw.onnx"))
    assert main(["clean", str(tmp_path / "raw.onnx"), "--out", str(tmp_path / "clean.onnx"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    cleaned = onnx.load(str(tmp_path / "clean.onnx"))
    assert ops(cleaned)["LayerNormalization"] == 1 and "Pow" not in ops(cleaned)
    assert not {"ReduceMean", "Sqrt", "Div"} & set(ops(cleaned))
    assert result["report"]["passes"]["fuse-layer-norm"]["changes"] == 1
    assert [v["inputs"] for v in result["verification"]] == ["random", "random-large"]
    assert all(v["max_abs"] <= 1e-4 for v in result["verification"])


def test_a_graph_below_opset_17_is_upgraded_then_fused():
    """LayerNormalization needs opset 17: the manager upgrades an opset-13 graph first, then the pass fuses."""
    model = export(HandWrittenNorm("pow-div"), 13)
    cleaned, report = clean_graph(model, passes=(FUSE,))
    assert report.upgraded["from"] == 13 and report.upgraded["to"] == 17
    assert ops(cleaned) == {"LayerNormalization": 1}


@pytest.mark.parametrize("opset", [13, 14, 16])
def test_nn_layer_norm_exported_below_opset_17_comes_back_as_one_node(opset):
    """Below opset 17 torch writes nn.LayerNorm out as ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add; after the
    manager's upgrade to 17, every pass leaves one LayerNormalization."""
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4))
    raw = export(model, opset)
    assert "Pow" in ops(raw) and "LayerNormalization" not in ops(raw)
    cleaned, report = clean_graph(raw)
    assert ops(cleaned)["LayerNormalization"] == 1 and not {"Pow", "Sqrt", "ReduceMean"} & set(ops(cleaned))
    assert report.upgraded["from"] == opset and report.passes["fuse-layer-norm"].changes == 1


def test_a_timm_vit_exported_at_opset_14_gets_its_layer_norms_back():
    """A torch.onnx export (not edge export) of a 2-block timm ViT at opset 14: 5 norms written out, 5 fused."""
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    import timm

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=10)
    raw = export(vit, 14, shape=(1, 3, 32, 32))
    assert ops(raw)["Pow"] == 5 and "LayerNormalization" not in ops(raw)
    cleaned, report = clean_graph(raw)
    assert ops(cleaned)["LayerNormalization"] == 5 and not {"Pow", "ReduceMean"} & set(ops(cleaned))
    assert report.passes["fuse-layer-norm"].changes >= 1 and report.nodes_after < report.nodes_before



class HandWrittenRmsNorm(nn.Module):
    """timm's RmsNorm formula written out (timm itself calls F.rms_norm, which torch.onnx with
    dynamo=False cannot export at opsets 17-20)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(WIDTH) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def test_rms_norm_export_is_left_decomposed():
    raw = export(HandWrittenRmsNorm(), 17)
    assert {"Pow", "ReduceMean", "Sqrt"} <= set(ops(raw))
    _unchanged(raw)
