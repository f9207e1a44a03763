"""Activation-outlier statistics of the reference model and of `fmnist-deit-tiny-outliers`, on real test images.

Per block: the residual stream's largest channel magnitude over the median channel's (a channel's
magnitude is its largest |x| over the images and tokens), the largest channels, Sun et al.'s ratio (largest
|x| over the median |x|), the largest token norm over the median token norm and the tokens that hold it;
per LayerNorm: the per-channel range spread (max / min range, and the 99th / 1st percentile version).
Beside them: what was published for pretrained ViTs (:data:`PUBLISHED`, each with its source), and what
the outliers do to a per-tensor INT8 quantizer, simulated in torch (:func:`simulated_int8`).

    python benchmarks/outlier_stats.py                        # bundled models, full test split
    python benchmarks/outlier_stats.py --outliers-weights runs/outliers/model.safetensors --data DIR

Writes benchmarks/results/outlier_stats.json (``--json-out``) and prints one line per block.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUTLIERS = "fmnist-deit-tiny-outliers"

# What was published for pretrained ViTs, as its source states it (read from the source named; not measured
# here). Only figures found in the material searchable from this project; where a paper's number could
# not be read, the finding is given in words.
PUBLISHED = [
    {"model": "ViT-B/16 (google/vit-base-patch16-224), ONNX, one real image",
     "finding": "13 of its 25 LayerNorms receive values up to |x| = 1418 (residual-stream outliers); a "
                "decomposed LayerNorm's Pow(x, 2) overflows float16 there (top-1 85.22 % -> 18.96 %)",
     "largest_abs": 1418, "layernorms_reached": "13/25",
     "source": "onnxsim/onnxsim, scripts/nvidia/README.md, section 'Transformer: ViT-B/16' (Jetson Orin Nano, "
               "TensorRT 10.3)"},
    {"model": "DINOv2-reg ViT-G (Sun et al. 2024, 'Massive activations in large language models', sec. on ViTs)",
     "finding": "massive activations in two fixed feature dimensions (179 and 999) of one register token "
                "(reg 3) at layer 40, plotted on a magnitude axis to 1,000; removing them by a fixed mean "
                "(Fix-Reg-Mean) keeps ImageNet accuracy (ViT-G 87.0 -> 87.0, ViT-B 84.8 -> 85.0): they act "
                "as fixed biases",
     "source": "locuslab/massive-activations: README.md (the layer-40 command and the Fix-Reg-Mean table) and "
               "lib/plot_utils_vit.py (the paper's figure: dims 179 and 999, register 3, axis 0-1k)"},
    {"model": "LLaMA2-7B (for scale; an LLM, not a ViT)",
     "finding": "massive activations in two fixed feature dimensions (1415, 2533) on the starting token and the "
                "first period or newline; 'very few activations ... e.g., 100,000 times larger' than others",
     "source": "Sun et al. 2024, arXiv 2402.17762, abstract and Figure 1 caption"},
    {"model": "CLIP and DINOv2 ViTs (Jiang, Dravid, Efros, Gandelsman 2025, 'Vision Transformers don't need "
              "trained registers')",
     "finding": "a sparse set of MLP neurons ('register neurons') concentrates the high-norm activations on "
                "outlier tokens; main analysis on OpenCLIP ViT-B/16",
     "source": "https://avdravid.github.io/test-time-registers and arXiv 2506.08010 (abstract)"},
    {"model": "DINOv2 and other large ViTs (Darcet et al. 2024, 'Vision Transformers need registers')",
     "finding": "a few high-norm 'artifact' tokens on low-information background patches, holding global "
                "information; no number was readable in the material searched here",
     "source": "arXiv 2309.16588 as summarised by aiwiki.ai/wiki/vision_registers and the DINOv2 model cards"},
    {"model": "DeiT / ViT / Swin (RepQ-ViT, Li et al. 2023)",
     "finding": "post-LayerNorm activations with 'severe inter-channel variation', handled by per-channel "
                "quantization then reparameterised into LayerNorm's affine and the next Linear; no per-channel "
                "range figure was readable in the material searched here",
     "source": "arXiv 2212.08254, abstract"},
]


def load_models(outliers_weights: str | None):
    from edge.models import BUNDLED, create_model

    models = {"fmnist-deit-tiny": create_model("fmnist-deit-tiny")}
    if outliers_weights:
        models[OUTLIERS] = create_model("fmnist-deit-tiny", weights=outliers_weights)
    elif OUTLIERS in BUNDLED and BUNDLED[OUTLIERS].weights.is_file():
        models[OUTLIERS] = create_model(OUTLIERS)
    else:
        print(f"{OUTLIERS}: no weights (pass --outliers-weights or ship them); measuring the reference only",
              file=sys.stderr)
    return models


def measure(model, data, calibration, images: int | None, device: str) -> dict:
    from edge.analysis.outliers import outlier_statistics
    from edge.data import ArrayPreprocess, InputSpec
    from edge.models import data_config
    from edge.train.outliers import subset

    chosen = subset(data, images, 0)
    preprocess = ArrayPreprocess(InputSpec.from_data_config(data_config(model)))
    stats = outlier_statistics(model, chosen.batches(250, preprocess), device)
    return {"data": chosen.name, **stats,
            "simulated_int8": simulated_int8(model, chosen, calibration, preprocess, device)}


def int8_sites(model) -> dict[str, list]:
    """Where a per-tensor INT8 quantizer is simulated: the residual stream (every block's output, what a
    Q/DQ where LayerNorm reads the stream sees) or every LayerNorm's output (what the GEMMs read)."""
    return {"residual_stream": list(model.blocks),
            "post_layernorm": [norm for block in model.blocks for norm in (block.norm1, block.norm2)]}


def top1(model, data, preprocess, device: str) -> float:
    import torch

    correct = 0
    with torch.no_grad():
        for x, y in data.batches(250, preprocess):
            correct += int((model(x.to(device)).argmax(-1).cpu() == y).sum())
    return correct / len(data)


def per_tensor_scales(model, modules: list, calibration, preprocess, device: str) -> dict:
    """Each module's symmetric INT8 scale: the largest |output| on the calibration images / 127."""
    import torch

    largest: dict = {}

    def record(module, inputs, output):
        largest[module] = max(largest.get(module, 0.0), float(output.detach().abs().max()))

    handles = [m.register_forward_hook(record) for m in modules]
    try:
        with torch.no_grad():
            for x, _ in calibration.batches(250, preprocess):
                model(x.to(device))
    finally:
        for handle in handles:
            handle.remove()
    return {m: largest[m] / 127 for m in modules}


def top1_rounded(model, scales: dict, data, preprocess, device: str) -> float:
    """Top-1 with each module's output rounded to INT8 at its scale (a forward hook per module)."""

    def rounded(module, inputs, output):
        return (output / scales[module]).round().clamp(-127, 127) * scales[module]

    handles = [m.register_forward_hook(rounded) for m in scales]
    try:
        return top1(model, data, preprocess, device)
    finally:
        for handle in handles:
            handle.remove()


def simulated_int8(model, data, calibration, preprocess, device: str) -> dict:
    """Top-1 in float32 and with each site set of :func:`int8_sites` rounded to symmetric per-tensor INT8
    (scales from the calibration images), simulated in torch with forward hooks: what the outliers do to
    a per-tensor quantizer, not a measurement of an ONNX or TensorRT graph."""
    model = model.to(device).eval()
    result = {"float32": top1(model, data, preprocess, device), "calibration": calibration.name}
    for name, modules in int8_sites(model).items():
        scales = per_tensor_scales(model, modules, calibration, preprocess, device)
        result[f"int8_per_tensor_{name}"] = top1_rounded(model, scales, data, preprocess, device)
    return result


def print_stats(name: str, stats: dict) -> None:
    print(f"\n{name} ({stats['images']} images of {stats['data']})")
    print("block  max|x|  ch-ratio  sun-ratio  tok-norm-ratio  top channels          top tokens")
    for b in stats["blocks"]:
        channels = ", ".join(f"{c['channel']}:{c['magnitude']:.0f}" for c in b["top_channels"][:2])
        tokens = ", ".join(f"{t['token']}({t['share_of_images']:.0%})" for t in b["top_tokens"][:2])
        print(f"{b['block']:>5}  {b['max_abs']:>6.0f}  {b['channel_ratio']:>8.1f}  {b['sun_ratio']:>9.0f}  "
              f"{b['token_norm_ratio']:>14.1f}  {channels:<20}  {tokens}")
    spreads = stats["layernorms"]
    print("LayerNorm range spread max/min: " + ", ".join(f"{s['range_spread']:.0f}" for s in spreads.values()))
    print("LayerNorm range spread p99/p1:  " + ", ".join(f"{s['range_spread_p99_p1']:.0f}" for s in spreads.values()))
    s = stats["summary"]
    massive = f"{len(s['massive_blocks'])}/{s['blocks']}"
    spread = f"{len(s['spread_layernorms'])}/{s['layernorms']}"
    print(f"blocks with channel ratio >= {s['channel_ratio_threshold']:.0f}: {massive}; LayerNorms with spread >= "
          f"{s['range_spread_threshold']:.0f}: {spread} (p99/p1: {len(s['spread_layernorms_p99_p1'])}); "
          f"meets the targets: {s['meets_targets']}")
    q = stats["simulated_int8"]
    print(f"top-1 float32 {q['float32']:.4f}; simulated per-tensor INT8 of the residual stream "
          f"{q['int8_per_tensor_residual_stream']:.4f}, of every LayerNorm output "
          f"{q['int8_per_tensor_post_layernorm']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outliers-weights", help=f"weights of {OUTLIERS} (default: the bundled file)")
    parser.add_argument("--data", default="fmnist", help="fmnist, fmnist-mini or a folder of IDX files")
    parser.add_argument("--images", type=int, default=None, help="test images (default: the whole split)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calibration", type=int, default=500,
                        help="training images that set the simulated INT8 scales (500)")
    parser.add_argument("--json-out", default=str(ROOT / "benchmarks/results/outlier_stats.json"))
    args = parser.parse_args()

    from benchmarks._results import provenance
    from edge.data import load_dataset

    started, load = time.perf_counter(), __import__("os").getloadavg()
    from edge.train.outliers import subset

    data = load_dataset(args.data, "test")
    calibration = subset(load_dataset(args.data, "train"), args.calibration, 0)
    record = {"models": {}, "published": PUBLISHED}
    for name, model in load_models(args.outliers_weights).items():
        record["models"][name] = measure(model, data, calibration, args.images, args.device)
        print_stats(name, record["models"][name])
    record["provenance"] = provenance("outlier_stats.py", args, parser, started=started, load_before=load)
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
