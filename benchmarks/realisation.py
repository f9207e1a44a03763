"""Realisation: how much of the FLOPs saved by block approximation shows up as ONNX Runtime latency saved.

    python benchmarks/realisation.py                                 # final settings, batch 1 and 32
    python benchmarks/realisation.py --rounds 2 --iterations 3       # quick look
    # attention removal (issue 15): NOSE's 4 blocks, target 0.9
    python benchmarks/realisation.py --plans attnrm:auto=4 --data fmnist --samples 500 --target 0.9 \
        --json-out benchmarks/results/attnrm_realisation.json --md-out docs/results/attnrm-realisation.md

The bundled reference model (``fmnist-deit-tiny``, 28x28, 12 blocks) and three variants with
1, 2 and 3 blocks replaced by one fitted linear map each (``linear:6-7``, ``linear:6-8``,
``linear:6-9``; the last is the planner's ``auto-linear:3`` choice), calibrated with
``edge compress`` on seeded, class-balanced training images. Every variant is exported
(``edge export``, static batch) and cleaned (``edge clean``'s passes, verified).

FLOPs come from ``edge/compress/cost.py`` (measured by torch's FLOP counter; they agree with the
analytic count). Latency: ONNX Runtime on the CPU, all four graphs of one batch size measured
side by side, interleaved (rounds of ``--iterations`` calls of each graph, order rotating).

    realisation = (1 - latency_c / latency_o) / (1 - flops_c / flops_o)      (medians; target >= 0.8)

It is also computed from each round's medians; the JSON keeps those, the table gives their
median and range. An A/A control times a byte-identical copy of the original graph as one more
variant: its ratio to the original says how far two equal graphs drift apart in this run.
At batch 1 a 28x28 model is dominated by fixed per-call and per-node costs that FLOPs do not
count, so a larger batch is measured too.

Writes benchmarks/results/realisation.json and docs/results/realisation.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import provenance, realisation, write_results  # noqa: E402
from peers import measure_interleaved  # noqa: E402

from edge.compress import CompressConfig, compress  # noqa: E402
from edge.compress.compressor import costs  # noqa: E402
from edge.compress.load import load_model  # noqa: E402
from edge.export import ExportConfig, export  # noqa: E402
from edge.graph.clean import clean_file  # noqa: E402
from edge.models import data_config  # noqa: E402
from edge.profile import sidebyside  # noqa: E402
from edge.profile.contention import CpuContention  # noqa: E402
from edge.progress import log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLANS = ("linear:6-7", "linear:6-8", "linear:6-9")
TARGET = 0.8


def build_variants(args) -> dict[str, tuple[torch.nn.Module, str | None, dict]]:
    """name -> (model, plan, record) for the original and every plan."""
    original = load_model(args.model)
    variants = {"original": (original, None, {"blocks_approximated": 0, **costs(original)})}
    for plan in args.plans:
        model, manifest = compress(load_model(args.model), {"model": args.model},
                                   CompressConfig(plan=plan, data=args.data, samples=args.samples, seed=args.seed))
        blocks = sum(len(span.blocks) for span in _spans(manifest["plan"]))
        removed = sum(len(step.blocks) for step in _steps(manifest["plan"], "attnrm"))
        variants[plan] = (model, plan, {"blocks_approximated": blocks, "attention_removed": removed, **costs(model),
                                        "calibration": manifest["calibration"]})
    return variants


def _spans(plan: str):
    return _steps(plan, "block-approximation")


def _steps(plan: str, method: str):
    from edge.compress import parse_plan
    from edge.compress.registry import method_named

    try:
        method_named(method)
    except KeyError:
        return ()
    return parse_plan(plan).steps_of(method)


AA = "original (A/A copy)"


def export_clean(model, name: str, plan: str | None, batch: int, work: Path, source: str) -> tuple[Path, dict]:
    raw = work / f"{name.replace(':', '_').replace(',', '+')}-b{batch}.raw.onnx"
    clean = raw.with_name(raw.name.replace(".raw.", ".clean."))
    export(model, raw, source=source, plan=plan, data_config=data_config(model), config=ExportConfig(batch=batch))
    result = clean_file(raw, clean)
    return clean, {"nodes": len(onnx.load(str(clean)).graph.node), "nodes_raw": result["report"]["nodes_before"],
                   "verification": result["verification"]}


def measure_batch(variants: dict, batch: int, args, work: Path) -> dict:
    paths, graphs = {}, {}
    for name, (model, plan, _) in variants.items():
        paths[name], graphs[name] = export_clean(model, name, plan, batch, work, args.model)
    paths[AA] = paths["original"].with_name(f"aa-{paths['original'].name}")   # byte-identical: the A/A control
    paths[AA].write_bytes(paths["original"].read_bytes())
    latency = measure_interleaved(paths, threads=args.threads, warmup=args.warmup, rounds=args.rounds,
                                  sessions=args.sessions,
                                  iterations=args.iterations)
    flops_o = variants["original"][2]["flops"]
    lat_o = latency["original"]
    rows = []
    for name, (_, plan, record) in variants.items():
        lat = latency[name]
        row = {"variant": name, **{k: v for k, v in record.items() if k != "calibration"}, "graph": graphs[name],
               "latency": lat}
        if plan is not None:
            flops_c = record["flops"]
            row["flops_reduction"] = 1.0 - flops_c / flops_o
            row["latency_reduction"] = 1.0 - lat["median_ms"] / lat_o["median_ms"]
            row["realisation"] = realisation(lat["median_ms"], lat_o["median_ms"], flops_c, flops_o)
            per_round = [realisation(c, o, flops_c, flops_o)
                         for c, o in zip(lat["round_medians_ms"], lat_o["round_medians_ms"], strict=True)]
            row["realisation_rounds"] = {"median": float(np.median(per_round)), "min": float(np.min(per_round)),
                                         "max": float(np.max(per_round)), "values": per_round}
            row["meets_target"] = row["realisation"] >= args.target
        rows.append(row)
        log(f"batch {batch} {name}: median {lat['median_ms']:.3f} ms (CV {100 * lat['cv']:.1f} %)"
            + (f", realisation {row['realisation']:.2f}" if plan else ""))
    aa = latency[AA]
    control = {"ratio": aa["median_ms"] / lat_o["median_ms"],
               "interval": sidebyside.speedup_interval(lat_o["round_medians_ms"], aa["round_medians_ms"],
                                                       lat_o["round_sets"], seed=args.seed),
               "latency": aa}
    log(f"batch {batch} A/A control: copy / original = {control['ratio']:.3f}")
    return {"batch": batch, "rows": rows, "aa_control": control}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="fmnist-deit-tiny")
    parser.add_argument("--plans", nargs="+", default=list(PLANS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--data", default="fmnist-mini", help="calibration data")
    parser.add_argument("--samples", type=int, default=300, help="calibration images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (fixed, recorded)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sessions", type=int, default=5,
                        help="session sets, created afresh in rotated order (rounds are split between them)")
    parser.add_argument("--iterations", type=int, default=20, help="timed calls of each graph per round")
    parser.add_argument("--target", type=float, default=TARGET, help="realisation each plan should reach")
    parser.add_argument("--json-out", default=str(ROOT / "benchmarks/results/realisation.json"))
    parser.add_argument("--md-out", default=str(ROOT / "docs/results/realisation.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    variants = build_variants(args)
    with tempfile.TemporaryDirectory(prefix="edge-realisation-") as tmp, CpuContention() as contention:
        batches = [measure_batch(variants, b, args, Path(tmp)) for b in args.batches]
    record = {
        "model": args.model, "target": args.target,
        "calibration": next(v[2]["calibration"] for v in variants.values() if "calibration" in v[2]),
        "batches": batches,
        "settings": {"threads": args.threads, "warmup": args.warmup, "rounds": args.rounds,
                     "iterations_per_round": args.iterations, "timed_iterations": args.rounds * args.iterations,
                     "order": "interleaved, rotating each round", "session_sets": args.sessions,
                     "creation_order": "rotated between session sets", "ort_optimization": "ORT_ENABLE_ALL",
                     "provider": "CPUExecutionProvider", "flops": "edge.compress.cost.measured_flops, batch 1"},
        "contention": contention.result(),
        **provenance("realisation.py", args, parser, started=started, load_before=load_before,
                     skip=("json_out", "md_out")),
    }
    write_results(record, args.json_out, args.md_out, markdown)


def markdown(r: dict) -> str:
    s, v, hw = r["settings"], r["versions"], r["hardware"]
    cal = r["calibration"]
    load = r["load_average"]
    lines = [
        "# Realisation: latency saved per FLOP saved",
        "",
        f"Generated by `{r['command']}` ({r['seconds'] / 60:.1f} min). Model `{r['model']}` (28x28, 12 blocks); "
        f"plans applied by `edge compress` on {cal['samples']} class-balanced `{cal['data']}` images (seed "
        f"{cal['seed']}); every graph exported (opset 17, static batch) and cleaned by `edge clean`'s passes.",
        "",
        f"Hardware: {hw['cpu']} ({hw['cpu_count']} logical CPUs), load average before/after "
        f"{load['before'][0]:.2f} / {load['after'][0]:.2f} (its own threads included); other processes used "
        f"{100 * r['contention']['other_cpu_share']:.1f} % of the CPUs while timing"
        + (" (**busy: not clean figures**)" if r["contention"]["busy"] else "")
        + f". ONNX Runtime {v['onnxruntime']} (CPU, "
        f"{s['ort_optimization']}), {s['threads']} intra-op threads, fp32. Latency: {s['warmup']} warm-up calls per "
        f"graph, then {s['rounds']} rounds x {s['iterations_per_round']} timed calls of each graph "
        f"({s['timed_iterations']} per graph), interleaved with the order rotating each round, in "
        f"{s.get('session_sets', 1)} session set(s) created afresh in rotated order. FLOPs: "
        f"{s['flops']}.",
        "",
        f"realisation = (1 - latency_c / latency_o) / (1 - FLOPs_c / FLOPs_o) on medians; target >= {r['target']}. "
        "`per round` is the same ratio from each round's medians: median [min, max] over rounds.",
        "",
    ]
    for b in r["batches"]:
        lines += [f"## Batch {b['batch']}", "",
                  "| variant | blocks approx. | attention removed | MFLOPs | nodes | median ms | p90 ms | CV "
                  "| FLOPs saved | latency saved | realisation | per round |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in b["rows"]:
            lat = row["latency"]
            cells = [f"`{row['variant']}`", str(row["blocks_approximated"]), str(row.get("attention_removed", 0)),
                     f"{row['flops'] / 1e6:.1f}",
                     str(row["graph"]["nodes"]), f"{lat['median_ms']:.3f}", f"{lat['p90_ms']:.3f}",
                     f"{100 * lat['cv']:.1f} %"]
            if "realisation" in row:
                rr = row["realisation_rounds"]
                mark = "" if row["meets_target"] else " (below target)"
                cells += [f"{100 * row['flops_reduction']:.1f} %", f"{100 * row['latency_reduction']:.1f} %",
                          f"**{row['realisation']:.2f}**{mark}",
                          f"{rr['median']:.2f} [{rr['min']:.2f}, {rr['max']:.2f}]"]
            else:
                cells += ["", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
        if "aa_control" in b:
            c = b["aa_control"]
            lines += ["", f"A/A control: a byte-identical copy of `original` timed as one more variant: copy / "
                          f"original = **{c['ratio']:.3f}** (per-round speedup {c['interval']['speedup']:.3f}, 95 % "
                          f"interval [{c['interval']['low']:.3f}, {c['interval']['high']:.3f}])."]
        lines.append("")
    met = [(b["batch"], row["variant"]) for b in r["batches"] for row in b["rows"] if row.get("meets_target")]
    missed = [(b["batch"], row["variant"]) for b in r["batches"] for row in b["rows"]
              if "meets_target" in row and not row["meets_target"]]
    lines += ["## Verdict", "",
              f"- Target met (>= {r['target']}): " + (", ".join(f"batch {b} `{p}`" for b, p in met) or "none") + ".",
              "- Target not met: " + (", ".join(f"batch {b} `{p}`" for b, p in missed) or "none") + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
