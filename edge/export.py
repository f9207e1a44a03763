"""``edge export``: a (compressed) timm ViT as a verified ONNX graph.

* opset 17 by default (native LayerNormalization), legacy TorchScript exporter (its output
  is byte-stable: the same inputs give the same file);
* timm's fused attention is switched off while exporting, so attention is plain
  MatMul/Softmax that TensorRT and every runtime fuse themselves;
* static batch 1 by default, ``batch=N`` or ``dynamic_batch=True``;
* stable names: input ``input``, output ``logits`` (``features`` for a headless model);
* ``metadata_props``: source model, plan, edge version, input size, mean/std, interpolation;
* checked with ``onnx.checker`` (full check) and against PyTorch with ONNX Runtime before the
  file is written (atomically); a failing export writes nothing. The inputs compared: seeded random
  ones, and real test images (the caller's: ``edge.data``'s ``ImageSet.inputs``, read with the model's own
  preprocessing).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from edge.check.compare import Tolerance, ort_session
from edge.check.torch_compare import compare_with_torch, verification_inputs
from edge.config import MAX_BATCH, option
from edge.errors import EdgeError
from edge.fileio import write_atomic
from edge.models.attention import explicit_attention
from edge.onnx_metadata import graph_metadata, with_metadata

REAL_IMAGES = 8  # real test images compared (repeated to fill a larger static batch)
DEFAULT_OPSET = 17
MAX_OPSET = 20  # the highest opset of torch's TorchScript exporter (dynamo=False), torch 2.x
INPUT_NAME = "input"


@dataclass
class ExportConfig:
    batch: int = option(1, minimum=1, maximum=MAX_BATCH)
    dynamic_batch: bool = False
    opset: int = option(DEFAULT_OPSET, minimum=17, maximum=MAX_OPSET)  # 17: native LayerNormalization
    verify: bool = True


def output_name(model: nn.Module) -> str:
    return "logits" if getattr(model, "num_classes", 0) else "features"


def export_bytes(model: nn.Module, input_size: tuple[int, int, int], config: ExportConfig) -> bytes:
    """The raw ONNX export (no metadata, not checked)."""
    if config.opset < 17:
        raise EdgeError(f"opset {config.opset} is too old", expected="opset >= 17 (native LayerNormalization)")
    if config.batch < 1:
        raise EdgeError(f"--batch {config.batch}", expected="a batch of at least 1")
    model.eval()
    x = torch.zeros(config.batch, *input_size)
    out = output_name(model)
    dynamic = {INPUT_NAME: {0: "batch"}, out: {0: "batch"}} if config.dynamic_batch else None
    buffer = io.BytesIO()
    with explicit_attention(model), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=config.opset,
                          input_names=[INPUT_NAME], output_names=[out], dynamic_axes=dynamic,
                          do_constant_folding=True)
    return buffer.getvalue()


def export(model: nn.Module, out: str | Path, *, source: str, plan: str | None, data_config: dict,
           config: ExportConfig | None = None, real_inputs: torch.Tensor | None = None) -> dict:
    """Export, check and verify ``model``; write ``out`` only if everything passes."""
    config = config or ExportConfig()
    out = Path(out)
    input_size = tuple(int(v) for v in data_config["input_size"])
    proto = with_metadata(export_bytes(model, input_size, config), graph_metadata(source, plan, data_config))
    data = proto.SerializeToString()
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as e:
        raise EdgeError(f"the exported graph of {source} fails onnx.checker", found=str(e)[:500]) from e
    report = {"out": str(out), "opset": config.opset, "batch": "dynamic" if config.dynamic_batch else config.batch,
              "input": INPUT_NAME, "output": output_name(model), "bytes": len(data),
              # counted as `edge clean` counts them: operators, Constant nodes apart
              "nodes": sum(n.op_type != "Constant" for n in proto.graph.node),
              "constant_nodes": sum(n.op_type == "Constant" for n in proto.graph.node),
              "metadata": {p.key: p.value for p in proto.metadata_props}}
    if config.verify:
        batch = 2 if config.dynamic_batch else config.batch
        inputs = verification_inputs(input_size, batch, real_inputs)
        results = compare_with_torch(model, ort_session(data), inputs, Tolerance())
        report["verification"] = [r.as_dict() for r in results]
        failed = [r for r in results if not r.passed]
        if failed:
            worst = failed[0]
            raise EdgeError(f"ONNX Runtime disagrees with PyTorch on the export of {source} ({worst.inputs} inputs)",
                            expected=f"max abs error <= {Tolerance().max_abs}, relative L2 <= {Tolerance().rel_l2}",
                            found=f"max abs {worst.max_abs:.3e}, relative L2 {worst.rel_l2:.3e}",
                            fix="nothing was written; report this model and plan as a bug")
    write_atomic(data, out)
    return report
