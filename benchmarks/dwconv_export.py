"""Drop-in depthwise convolution: the fine-tuned ablation models exported, cleaned and checked.

    # after benchmarks/dwconv_ablation.py: every row of its JSON whose fine-tuned artifact is on disk
    python benchmarks/dwconv_ablation.py --lr 5e-4 --out benchmarks/results/dwconv_ablation_epoch_lr5e-4.json
    python benchmarks/dwconv_export.py --ablation benchmarks/results/dwconv_ablation_epoch_lr5e-4.json
    # a quick look: two rows, 500 test images
    python benchmarks/dwconv_export.py --plans dwconv:auto=3:init=lsq dwconv:auto=6:init=lsq --eval-samples 500 \\
        --out /tmp/dwconv_export.json --md-out /tmp/dwconv-export.md

For each row this runs what a user runs: ``edge export`` (onnx.checker, then ONNX Runtime against
PyTorch on seeded random and on eight real test images, max abs error <= 1e-4 and relative L2 <=
1e-5, the export issue's tolerances) and ``edge clean`` (every pass verified, the cleaned graph
compared with the raw one). It then counts, in the cleaned graph, the depthwise Conv of each
replaced block (group = channels), the layout Transposes and the Slice/Concat nodes named in that
block, and measures the cleaned graph's top-1 accuracy with ONNX Runtime on the test split next to
the PyTorch accuracy of the same artifact.

Writes benchmarks/results/dwconv_export.json and docs/results/dwconv-export.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path

import onnx
import torch
from _results import provenance, write_results  # benchmarks/ is on sys.path: run as python benchmarks/NAME.py
from dwconv_ablation import fine_tuned_folder

from edge.check.accuracy import evaluate
from edge.check.onnx_classifier import OnnxClassifier
from edge.compress import is_artifact, load_artifact
from edge.compress.methods.dwconv.module import DepthwiseAttention
from edge.data import ArrayPreprocess, InputSpec, load_dataset
from edge.errors import EdgeError
from edge.export import export
from edge.graph.clean import clean_file
from edge.models import data_config
from edge.progress import log
from edge.runtime import set_threads

ROOT = Path(__file__).resolve().parents[1]


def block_census(graph: onnx.GraphProto, blocks: dict[int, int]) -> dict:
    """Per replaced block (index -> conv width): depthwise Convs, Transposes, Slices, Concats, Softmaxes by name."""
    counts: dict[int, collections.Counter] = {b: collections.Counter() for b in blocks}
    groups: dict[int, list[int]] = {b: [] for b in blocks}
    for node in graph.node:
        for block in blocks:
            if f"blocks.{block}/attn" in node.name:
                counts[block][node.op_type] += 1
                if node.op_type == "Conv":
                    groups[block] += [a.i for a in node.attribute if a.name == "group"]
    per_block = {str(b): {"depthwise_convs": sum(g == blocks[b] for g in groups[b]), "conv_width": blocks[b],
                          **{op.lower(): counts[b][op] for op in ("Transpose", "Slice", "Concat", "Softmax")}}
                 for b in blocks}
    return {"per_block": per_block, "max_transposes": max(v["transpose"] for v in per_block.values()),
            "max_slices": max(v["slice"] for v in per_block.values()),
            "max_concats": max(v["concat"] for v in per_block.values()),
            "ops": dict(sorted(collections.Counter(n.op_type for n in graph.node).items()))}


def check_row(folder: Path, dataset, real, threads: int) -> dict:
    model, manifest = load_artifact(folder)
    model.eval()
    blocks = {i: b.attn.conv_width for i, b in enumerate(model.blocks) if isinstance(b.attn, DepthwiseAttention)}
    config = data_config(model)
    spec = InputSpec.from_data_config(config)
    with tempfile.TemporaryDirectory() as tmp:
        raw, clean = Path(tmp) / "raw.onnx", Path(tmp) / "clean.onnx"
        exported = export(model, raw, source=str(folder), plan=manifest["plan"], data_config=config,
                          real_inputs=ArrayPreprocess(spec)(real))
        cleaned = clean_file(raw, clean)
        graph = onnx.load(str(clean)).graph
        onnx_eval = evaluate(OnnxClassifier(clean, threads=threads), dataset, spec, show_progress=False)
    torch_eval = evaluate(model, dataset, spec, show_progress=False)
    return {"artifact": str(folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder),
            "plan": manifest["plan"], "replaced_blocks": sorted(blocks),
            "export_verification": exported["verification"], "clean_verification": cleaned["verification"],
            "nodes_raw": exported["nodes"], "nodes_clean": len(graph.node),
            "census": block_census(graph, blocks),
            "accuracy_torch": torch_eval["accuracy"], "accuracy_onnx": onnx_eval["accuracy"],
            "correct_torch": torch_eval["correct"], "correct_onnx": onnx_eval["correct"],
            "samples": onnx_eval["samples"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ablation", type=Path,
                        default=ROOT / "benchmarks" / "results" / "dwconv_ablation_epoch_lr5e-4.json",
                        help="the JSON written by benchmarks/dwconv_ablation.py")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "dwconv_ablation",
                        help="the --work folder of that ablation run")
    parser.add_argument("--plans", nargs="+", help="rows to check (default: all of the ablation's rows)")
    parser.add_argument("--eval-samples", type=int, help="test images (default: the whole test split)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dwconv_export.json")
    parser.add_argument("--md-out", type=Path, default=ROOT / "docs" / "results" / "dwconv-export.md")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    if not args.ablation.is_file():
        raise SystemExit(f"error: {args.ablation} does not exist; run benchmarks/dwconv_ablation.py first")
    ablation = json.loads(args.ablation.read_text())
    rows = {r["plan"]: r for r in ablation["rows"]}
    plans = args.plans or list(rows)
    unknown = [p for p in plans if p not in rows]
    if unknown:
        raise SystemExit(f"error: {', '.join(unknown)} not in {args.ablation}; its rows: {', '.join(rows)}")
    folders = {p: fine_tuned_folder(args.work, p, ablation["settings"]["finetune"]) for p in plans}
    missing = [str(f) for f in folders.values() if not is_artifact(f)]
    if missing:
        raise SystemExit(f"error: no fine-tuned artifact at {', '.join(missing)}; re-run the ablation with "
                         f"--work {args.work} (it resumes)")
    set_threads(args.threads)
    dataset = load_dataset(ablation["settings"]["finetune"]["data"], "test")
    real = dataset.images[:8]   # the verification's real images: the first eight of the test split
    if args.eval_samples:
        dataset = dataset.subset(torch.arange(args.eval_samples))
    results = []
    for plan in plans:
        log(f"{plan}: export, clean, evaluate ({folders[plan]})")
        try:
            row = {"row": plan, **check_row(folders[plan], dataset, real, args.threads)}
        except EdgeError as e:
            row = {"row": plan, "error": str(e)}
        else:
            row["accuracy_ablation"] = rows[plan]["accuracy_after"]
        results.append(row)
    ok = [r for r in results if "error" not in r]
    record = {"benchmark": "dwconv_export", "ablation": str(args.ablation.relative_to(ROOT)
                                                              if args.ablation.is_relative_to(ROOT) else args.ablation),
              "test": dataset.name, "test_images": len(dataset), "rows": results,
              "all_verified": len(ok) == len(results),
              "max_transposes_per_block": max((r["census"]["max_transposes"] for r in ok), default=None),
              "max_abs_error": max((v["max_abs"] for r in ok for v in r["export_verification"]), default=None),
              "max_rel_l2": max((v["rel_l2"] for r in ok for v in r["export_verification"]), default=None),
              **provenance("dwconv_export.py", args, parser, started=started, load_before=load_before)}
    write_results(record, args.out, args.md_out, markdown)
    if not record["all_verified"]:
        raise SystemExit(1)


def markdown(r: dict) -> str:
    hw, v = r["hardware"], r["versions"]
    lines = ["# Drop-in depthwise convolution: exported ablation models", "",
             f"Generated by `{r['command']}` in {r['seconds']:.0f} s. Rows of `{r['ablation']}`, each fine-tuned "
             "artifact exported (`edge export`: onnx.checker, ONNX Runtime against PyTorch on random and on 8 real "
             "images, tolerance max abs 1e-4 and relative L2 1e-5) and cleaned (`edge clean`, every pass verified). "
             f"Accuracy: {r['test']} ({r['test_images']} images), the cleaned graph in ONNX Runtime next to the "
             f"artifact in PyTorch. Hardware: {hw.get('cpu')}, onnx {v['onnx']}, onnxruntime {v['onnxruntime']}, "
             f"torch {v['torch']}.", "",
             "| row | replaced blocks | max abs error (random / real) | rel L2 (random / real) | nodes raw -> clean "
             "| depthwise Convs | Transposes / block | Slice, Concat / block | accuracy PyTorch | accuracy ORT |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        if "error" in row:
            lines.append(f"| `{row['row']}` | failed: {row['error']} |||||||||")
            continue
        checks = {c["inputs"]: c for c in row["export_verification"]}
        random, real = checks.get("random", {}), checks.get("real", {})
        census = row["census"]
        convs = sum(b["depthwise_convs"] for b in census["per_block"].values())
        lines.append(
            f"| `{row['row']}` | {'+'.join(map(str, row['replaced_blocks']))} "
            f"| {random.get('max_abs', float('nan')):.1e} / {real.get('max_abs', float('nan')):.1e} "
            f"| {random.get('rel_l2', float('nan')):.1e} / {real.get('rel_l2', float('nan')):.1e} "
            f"| {row['nodes_raw']} -> {row['nodes_clean']} | {convs}/{len(row['replaced_blocks'])} "
            f"| {census['max_transposes']} | {census['max_slices']}, {census['max_concats']} "
            f"| {row['accuracy_torch']:.4f} | {row['accuracy_onnx']:.4f} |")
    lines += ["", f"All rows verified: **{'yes' if r['all_verified'] else 'no'}**; largest export error "
              f"{r['max_abs_error']:.1e} (max abs), {r['max_rel_l2']:.1e} (relative L2); at most "
              f"{r['max_transposes_per_block']} layout Transposes in a replaced block after cleaning.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
