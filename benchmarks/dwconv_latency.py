"""Drop-in depthwise convolution: latency of the original vs attention replaced, side by side.

    python benchmarks/dwconv_latency.py                       # vit_base_patch16_224, 224 and 336, 6/12 blocks
    python benchmarks/dwconv_latency.py --torch-device cuda   # also PyTorch on the GPU (eager, fp32)
    python benchmarks/dwconv_latency.py --model vit_tiny_patch16_224 --sizes 224 --warmup 2 --rounds 2 \\
        --sessions 1 --iterations 3 --out /tmp/dwconv_latency.json --md-out /tmp/dwconv_latency.md   # a quick look

Random weights (nothing is downloaded; latency does not depend on the weights' values). For each
input size: the original model and the model with ``--blocks`` attention blocks replaced
(``dwconv:blocks=...:init=gaussian``; ``prefix=pool`` reads 4 fmnist-mini images) are exported with
``edge export`` (verified against PyTorch) and cleaned with ``edge clean`` (verified against the raw
export), then timed in ONNX Runtime (CPU, ORT_ENABLE_ALL, fixed intra-op threads, batch 1),
interleaved: every round runs ``--iterations`` calls of each graph, the order rotating each round,
in ``--sessions`` session sets created afresh in rotated order. An A/A control, ``original-copy``
(a byte-identical copy of the original graph in its own session), is timed with them: its
difference from ``original`` is the resolution of the comparison.

Reported per size: median/p90 latency, the measured speedup ``t_orig / t_dw`` (medians), the
FLOPs-ideal speedup ``F_orig / F_dw`` (matrix products, convolutions and attention, counted by
``FlopCounterMode`` and checked against the analytic count) and the realisation
``(1 - t_dw / t_orig) / (1 - F_dw / F_orig)``: the share of the FLOP saving that shows up as time
(1.0 = all of it; above 1 when the removed softmax and reshapes, which FLOPs do not count, cost
time too); also the realisation from each round's medians (median, min, max). The graph ONNX
Runtime actually runs is inspected too: how many layout nodes (Transpose, ReorderInput/Output)
surround each depthwise Conv after its own optimisations.

With ``--torch-device`` the same two PyTorch models are also timed eagerly on that device
(``torch.cuda.synchronize`` after each call on a GPU), interleaved the same way.

Do not run it while other heavy work shares the CPU; the record keeps the CPU share other
processes used while timing. Writes benchmarks/results/dwconv_latency.json and
docs/results/dwconv-latency.md.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from _results import (  # benchmarks/ is on sys.path: run as python benchmarks/NAME.py
    provenance,
    realisation,
    write_results,
)
from peers import interleave, measure_interleaved

from edge.compress.cost import analytic_flops, measured_flops
from edge.compress.methods.dwconv.build import build_dwconv, place_dwconv
from edge.compress.plan import parse_plan
from edge.data import InputSpec, calibration_set
from edge.export import ExportConfig, export
from edge.graph.clean import clean_file
from edge.models import create_model, data_config
from edge.profile import TorchBackend
from edge.profile.contention import CpuContention
from edge.progress import log
from edge.runtime import set_threads

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.9
LAYOUT_OPS = ("Transpose", "ReorderInput", "ReorderOutput", "Reshape")


def build(arch: str, size: int, blocks: tuple[int, ...] | None, variant: str, prefix: str, seed: int = 0):
    torch.manual_seed(seed)
    model = create_model(f"timm:{arch}", img_size=size)
    plan = None
    if blocks:
        plan = f"dwconv:blocks={'+'.join(map(str, blocks))}:init=gaussian:variant={variant}:prefix={prefix}"
        # prefix=pool reads mean attention rows: 4 images are enough for a graph of the right shape
        images = calibration_set("fmnist-mini", 4) if prefix == "pool" else None
        steps, modules, _ = build_dwconv(model, parse_plan(plan).steps_of("dwconv"), images,
                                         InputSpec.from_data_config(data_config(model)))
        place_dwconv(model, modules)
    return model.eval(), plan


def export_clean(model, plan: str | None, source: str, folder: Path, name: str) -> Path:
    raw, clean = folder / f"{name}.raw.onnx", folder / f"{name}.onnx"
    export(model, raw, source=source, plan=plan, data_config=data_config(model), config=ExportConfig())
    clean_file(raw, clean)
    raw.unlink()
    return clean


def ort_layout(path: Path, threads: int) -> dict:
    """The layout nodes next to each grouped Conv in the graph ONNX Runtime runs (ORT_ENABLE_ALL)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edge-ort-") as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(options.optimized_model_filepath).graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    around = []
    for node in graph.node:
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type != "Conv" or groups == 1:
            continue
        before, n = [], producer.get(node.input[0])
        while n is not None and n.op_type in LAYOUT_OPS:
            before.append(n.op_type)
            n = producer.get(n.input[0])
        after, n = [], consumers[node.output[0]]
        while len(n) == 1 and n[0].op_type in LAYOUT_OPS:
            after.append(n[0].op_type)
            n = consumers[n[0].output[0]]
        around.append({"before": before[::-1], "after": after})
    ops = collections.Counter(n.op_type for n in graph.node)
    return {"depthwise_convs": len(around), "layout_around_each": around,
            "transposes_next_to_convs": sum(x["before"].count("Transpose") + x["after"].count("Transpose")
                                            for x in around),
            "ops": dict(sorted(ops.items()))}


def compare(latency: dict, flops: dict) -> dict:
    """Speedup and realisation of ``dwconv`` against ``original`` (medians), per round too, plus the A/A."""
    orig, dw = latency["original"], latency["dwconv"]
    out = {"measured_speedup": orig["median_ms"] / dw["median_ms"],
           "realisation": realisation(dw["median_ms"], orig["median_ms"], flops["dwconv"], flops["original"])}
    per_round = [realisation(d, o, flops["dwconv"], flops["original"])
                 for d, o in zip(dw["round_medians_ms"], orig["round_medians_ms"], strict=True)]
    out["realisation_rounds"] = {"median": float(np.median(per_round)), "min": float(np.min(per_round)),
                                 "max": float(np.max(per_round))}
    if "original-copy" in latency:
        out["aa_difference"] = latency["original-copy"]["median_ms"] / orig["median_ms"] - 1
    out["meets_target"] = out["realisation"] >= TARGET
    return out


def measure_size(args, size: int, blocks: tuple[int, ...], work: Path) -> dict:
    log(f"{args.model} at {size}: build, export + clean (original, dwconv:blocks={args.blocks})")
    original, _ = build(args.model, size, None, args.variant, args.prefix)
    replaced, plan = build(args.model, size, blocks, args.variant, args.prefix)
    flops = {"original": measured_flops(original, (3, size, size)),
             "dwconv": measured_flops(replaced, (3, size, size))}
    if flops["dwconv"] != analytic_flops(replaced) or flops["original"] != analytic_flops(original):
        raise RuntimeError("measured FLOPs differ from the analytic count")
    ideal = flops["original"] / flops["dwconv"]
    paths = {"original": export_clean(original, None, args.model, work, f"orig{size}"),
             "dwconv": export_clean(replaced, plan, args.model, work, f"dw{size}")}
    paths["original-copy"] = work / f"orig{size}-copy.onnx"
    shutil.copyfile(paths["original"], paths["original-copy"])
    graphs = {name: {"nodes": len(onnx.load(str(paths[name])).graph.node),
                     "ort": ort_layout(paths[name], args.threads)} for name in ("original", "dwconv")}
    log(f"{args.model} at {size}: ONNX Runtime, {args.rounds} rounds x {args.iterations} calls of each graph")
    with CpuContention() as contention:
        latency = measure_interleaved(paths, threads=args.threads, warmup=args.warmup, rounds=args.rounds,
                                      iterations=args.iterations, sessions=args.sessions)
    row = {"size": size, "tokens": (size // 16) ** 2 + 1, "plan": plan, "flops": flops, "flops_ideal_speedup": ideal,
           "onnxruntime": {"latency": latency, **compare(latency, flops), "contention": contention.result()},
           "graphs": graphs}
    ort_row = row["onnxruntime"]
    log(f"  ORT median {latency['original']['median_ms']:.2f} -> {latency['dwconv']['median_ms']:.2f} ms: "
        f"speedup {ort_row['measured_speedup']:.3f} (FLOPs-ideal {ideal:.3f}), realisation "
        f"{ort_row['realisation']:.2f}; A/A {100 * ort_row['aa_difference']:+.1f} %")
    if args.torch_device:
        device = torch.device(args.torch_device)
        models = {"original": original, "dwconv": replaced, "original-copy": copy.deepcopy(original)}
        factories = {name: functools.partial(TorchBackend, m, (3, size, size), batch=args.torch_batch,
                                             device=device, threads=args.threads) for name, m in models.items()}
        with CpuContention() as contention:
            latency = interleave(factories, warmup=args.warmup, rounds=args.rounds, iterations=args.iterations)
        row["torch"] = {"device": str(device), "batch": args.torch_batch, "latency": latency,
                        **compare(latency, flops), "contention": contention.result(),
                        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
        log(f"  torch {device} batch {args.torch_batch}: speedup {row['torch']['measured_speedup']:.3f}, "
            f"realisation {row['torch']['realisation']:.2f}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 336])
    parser.add_argument("--blocks", default="0+2+4+6+8+10", help="replaced blocks (6 of 12 by default)")
    parser.add_argument("--variant", default="unensembled", choices=("unensembled", "ensembled", "full"))
    parser.add_argument("--prefix", default="pool", choices=("mean", "pool", "attend", "drop"))
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (fixed, recorded)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=5,
                        help="ONNX Runtime session sets, created afresh in rotated order")
    parser.add_argument("--iterations", type=int, default=10, help="timed calls of each graph per round")
    parser.add_argument("--torch-device", help="also time the PyTorch models on this device (e.g. cuda)")
    parser.add_argument("--torch-batch", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dwconv_latency.json")
    parser.add_argument("--md-out", type=Path, default=ROOT / "docs" / "results" / "dwconv-latency.md")
    args = parser.parse_args()
    set_threads(args.threads)
    blocks = tuple(int(b) for b in args.blocks.split("+"))
    started, load_before = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dwconv-latency.") as tmp:
        rows = [measure_size(args, size, blocks, Path(tmp)) for size in args.sizes]
    record = {
        "benchmark": "dwconv_latency", "model": args.model, "weights": "random (torch seed 0)",
        "replaced_blocks": list(blocks), "variant": args.variant, "prefix": args.prefix, "target": TARGET,
        "settings": {"threads": args.threads, "warmup": args.warmup, "rounds": args.rounds,
                     "iterations_per_round": args.iterations, "timed_iterations": args.rounds * args.iterations,
                     "session_sets": args.sessions, "order": "interleaved, rotating each round",
                     "ort_optimization": "ORT_ENABLE_ALL", "provider": "CPUExecutionProvider", "batch": 1,
                     "graphs": "edge export (opset 17, verified) + edge clean (verified)",
                     "flops": "edge.compress.cost.measured_flops (= analytic count), batch 1"},
        "rows": rows,
        **provenance("dwconv_latency.py", args, parser, started=started, load_before=load_before,
                     skip=("out", "md_out")),
    }
    write_results(record, args.out, args.md_out, markdown)


def markdown(r: dict) -> str:
    s, v, hw = r["settings"], r["versions"], r["hardware"]
    lines = [
        "# Drop-in depthwise convolution: latency, original vs replaced",
        "",
        f"Generated by `{r['command']}` ({r['seconds'] / 60:.1f} min). `{r['model']}` with {r['weights']} weights; "
        f"attention of blocks {'+'.join(map(str, r['replaced_blocks']))} ({len(r['replaced_blocks'])} of 12) "
        "replaced by "
        f"a 3x3 depthwise convolution over V (variant `{r['variant']}`, prefix `{r['prefix']}`). Graphs: "
        f"{s['graphs']}.",
        "",
        f"Hardware: {hw['cpu']} ({hw['cpu_count']} logical CPUs). ONNX Runtime {v['onnxruntime']} (CPU, "
        f"{s['ort_optimization']}), {s['threads']} intra-op threads, fp32, batch 1. {s['warmup']} warm-up calls per "
        f"graph, then {s['rounds']} rounds x {s['iterations_per_round']} timed calls of each graph, interleaved "
        f"with the order rotating, in {s['session_sets']} session sets created in rotated order. "
        "`original-copy` is an A/A control: a byte-identical copy of the original graph.",
        "",
        f"realisation = (1 - t_dw / t_orig) / (1 - FLOPs_dw / FLOPs_orig) on medians; target >= {r['target']}.",
        "",
        "| size | tokens | FLOPs-ideal speedup | original ms | replaced ms | A/A ms | measured speedup | realisation "
        "| per round [min, max] | A/A diff | other CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        o = row["onnxruntime"]
        lat = o["latency"]
        rr = o["realisation_rounds"]
        busy = " (busy)" if o["contention"]["busy"] else ""
        lines.append(
            f"| {row['size']} | {row['tokens']} | {row['flops_ideal_speedup']:.3f} "
            f"| {lat['original']['median_ms']:.1f} "
            f"| {lat['dwconv']['median_ms']:.1f} | {lat['original-copy']['median_ms']:.1f} "
            f"| {o['measured_speedup']:.3f} | **{o['realisation']:.2f}**{'' if o['meets_target'] else ' (below)'} "
            f"| {rr['median']:.2f} [{rr['min']:.2f}, {rr['max']:.2f}] | {100 * o['aa_difference']:+.1f} % "
            f"| {100 * o['contention']['other_cpu_share']:.1f} %{busy} |")
    lines += ["", "Layout nodes next to each depthwise Conv in the graph ONNX Runtime runs (after its own "
              "optimisations; `ReorderInput/Output` with `channels_last` take the NHWC<->NCHW Transposes in):", ""]
    for row in r["rows"]:
        around = row["graphs"]["dwconv"]["ort"]["layout_around_each"]
        if around:
            lines.append(f"- {row['size']}: {' -> '.join(around[0]['before'])} -> Conv -> "
                         f"{' -> '.join(around[0]['after'])} (x{len(around)}); standalone Transposes next to the "
                         f"convolutions: {row['graphs']['dwconv']['ort']['transposes_next_to_convs']}")
    torch_rows = [row for row in r["rows"] if "torch" in row]
    if torch_rows:
        lines += ["", "## PyTorch (eager, fp32)", "",
                  "| size | device | batch | original ms | replaced ms | measured speedup | realisation | A/A diff |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in torch_rows:
            t = row["torch"]
            lat = t["latency"]
            lines.append(f"| {row['size']} | {t['gpu'] or t['device']} | {t['batch']} "
                         f"| {lat['original']['median_ms']:.2f} | {lat['dwconv']['median_ms']:.2f} "
                         f"| {t['measured_speedup']:.3f} | {t['realisation']:.2f} "
                         f"| {100 * t['aa_difference']:+.1f} % |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
