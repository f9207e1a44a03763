"""Where the time goes, by ONNX operator type: the original against sub-networks cut from a super-network.

    python benchmarks/op_shares.py                       # runs/subnetworks/wpac-ranked at 25/50/75 %, batch 32
    python benchmarks/op_shares.py --supernet runs/wsuper --fractions 0.5 --batch 1 --iterations 20

Realisation (benchmarks/subnetworks.py) says how much of a MAC cut shows up as time; this says why.
Every model is exported (static batch) and cleaned as benchmarks/realisation.py does, then run
``--iterations`` times in one ONNX Runtime session (CPU, ``--threads`` intra-op threads, after
``--warmup`` calls left out) with ONNX Runtime's own profiler on. Each node's kernel time is summed per
operator type and per call; the table gives the median call's time per type. The models are run
one after the other, not interleaved: the shares are what this measures, not the speed-ups (those
come from the side-by-side runs of subnetworks.py). Operators whose work width compression shrinks
(MatMul, Gemm and the element-wise work on the narrowed MLP hidden units) are told apart from the
rest only by how their time moves between the original and the sub-networks: the script shows it.

Writes benchmarks/results/op_shares.json and docs/results/op-shares.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import provenance, read_results, write_results  # noqa: E402
from realisation import export_clean  # noqa: E402

from edge.check.compare import ort_session, run_ort  # noqa: E402
from edge.compress.compressor import costs  # noqa: E402
from edge.compress.derive import derive_model  # noqa: E402
from edge.compress.load import load_model  # noqa: E402
from edge.progress import log  # noqa: E402
from edge.runtime import set_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def profile(path: Path, threads: int, warmup: int, iterations: int, seed: int) -> dict:
    """Median per-call kernel time (ms) of each operator type, and the median call's wall time."""
    session = ort_session(str(path), threads, profile_prefix=str(path.with_suffix("")))
    shape = session.get_inputs()[0].shape
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    walls = []
    for _ in range(warmup + iterations):
        start = time.perf_counter()
        run_ort(session, x)
        walls.append((time.perf_counter() - start) * 1e3)
    events = json.loads(Path(session.end_profiling()).read_text())
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    per_run: list[dict[str, float]] = [defaultdict(float) for _ in starts]
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            run = bisect.bisect_right(starts, e["ts"]) - 1     # the call this kernel ran in
            if run >= 0:
                per_run[run][e["args"]["op_name"]] += e["dur"] / 1e3
    measured = per_run[warmup:]            # the warm-up calls are left out
    types = sorted({t for run in measured for t in run})
    return {"ops_ms": {t: float(np.median([run.get(t, 0.0) for run in measured])) for t in types},
            "kernels_ms": float(np.median([sum(run.values()) for run in measured])),
            "wall_ms": float(np.median(walls[warmup:])), "calls": len(measured)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="fmnist-deit-tiny")
    parser.add_argument("--supernet", type=Path, default=ROOT / "runs" / "subnetworks" / "wpac-ranked",
                        help="a super-network artifact (benchmarks/subnetworks.py makes runs/subnetworks/*)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "op_shares.json")
    parser.add_argument("--md-out", type=Path, default=ROOT / "docs" / "results" / "op-shares.md")
    parser.add_argument("--render", action="store_true", help="only write --md-out again from --out's figures")
    args = parser.parse_args()
    if args.render:
        write_results(read_results(parser, args.out), args.out, args.md_out, markdown)
        return
    set_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    base = load_model(args.model)
    variants = {"original": (base, costs(base)["flops"])}
    for fraction in args.fractions:
        model, manifest = derive_model(args.supernet, f"wpac:macs={fraction}")
        variants[f"{int(round(100 * fraction))} % of the MACs"] = (model, manifest["after"]["flops"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="edge-op-shares-") as tmp:
        for name, (model, flops) in variants.items():
            path, graph = export_clean(model, name.replace(" ", "_").replace("%", "pc"), None, args.batch, Path(tmp),
                                       args.model)
            result = profile(path, args.threads, args.warmup, args.iterations, args.seed)
            log(f"{name}: {result['kernels_ms']:.2f} ms in kernels, {result['wall_ms']:.2f} ms a call")
            rows.append({"variant": name, "flops": flops, "nodes": graph["nodes"], **result})
    record = {"benchmark": "op_shares", "model": args.model, "supernet": str(args.supernet), "batch": args.batch,
              "threads": args.threads, "warmup": args.warmup, "iterations": args.iterations, "rows": rows,
              "provider": "CPUExecutionProvider", "ort_optimization": "ORT_ENABLE_ALL",
              **provenance("op_shares.py", args, parser, started=started, load_before=load_before,
                           skip=("out", "md_out"))}
    write_results(record, args.out, args.md_out, markdown)


def markdown(r: dict) -> str:
    rows = r["rows"]
    original = rows[0]
    types = sorted({t for row in rows for t in row["ops_ms"]}, key=lambda t: -original["ops_ms"].get(t, 0.0))
    hw = r["hardware"]
    lines = ["# Where the time goes: ONNX operator types, original vs sub-networks", "",
             f"Generated by `{r['command']}`. Model `{r['model']}`; sub-networks cut from `{r['supernet']}` by "
             f"`wpac:macs=F`. ONNX Runtime {r['versions'].get('onnxruntime')} ({r['provider']}, "
             f"{r['ort_optimization']}), {r['threads']} threads, batch {r['batch']}, fp32, ONNX Runtime's profiler "
             f"on; {r['warmup']} warm-up calls, then the median of {r['iterations']} calls per operator type. "
             f"Models run one after the other (shares, not speed-ups). Hardware: {hw.get('cpu')} "
             f"({hw.get('cpu_count')} cores); load average before/after {r['load_average']['before'][0]:.2f} / "
             f"{r['load_average']['after'][0]:.2f}.", "",
             "| operator | " + " | ".join(row["variant"] for row in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for t in types:
        cells = []
        for row in rows:
            ms = row["ops_ms"].get(t, 0.0)
            ratio = f" ({ms / original['ops_ms'][t]:.2f}x)" if row is not original and original["ops_ms"].get(t) else ""
            cells.append(f"{ms:.2f} ms{ratio}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append("| **all kernels** | " + " | ".join(f"{row['kernels_ms']:.2f} ms" for row in rows) + " |")
    lines.append("| call (wall) | " + " | ".join(f"{row['wall_ms']:.2f} ms" for row in rows) + " |")
    lines.append("| MACs kept | " + " | ".join(f"{row['flops'] / original['flops']:.3f}" for row in rows) + " |")
    fixed = {t for t in types if all(row["ops_ms"].get(t, 0.0) >= 0.8 * original["ops_ms"].get(t, 0.0)
                                     for row in rows[1:])}
    share = sum(original["ops_ms"][t] for t in fixed) / original["kernels_ms"]
    lines += ["", f"Operator types whose time stays at >= 0.8x of the original's in every sub-network: "
                  f"{', '.join(sorted(fixed)) or 'none'}; they take **{100 * share:.1f} %** of the original's "
                  "kernel time. The others shrink, not all in proportion to the MACs (those whose time falls "
                  "by less than the MACs do hold a fixed part)."]
    macs = np.array([row["flops"] / original["flops"] for row in rows])
    kernels = np.array([row["kernels_ms"] for row in rows])
    if len(rows) > 2:
        slope, intercept = np.polyfit(macs, kernels, 1)
        lines += ["", f"A straight line through the kernel times (least squares against the MACs kept): "
                      f"{intercept:.1f} ms that does not shrink, {slope:.1f} ms that does: "
                      f"**{100 * intercept / (intercept + slope):.1f} %** fixed, so a realisation of about "
                      f"{slope / (intercept + slope):.2f} at any size."]
    realised = [f"{row['variant']} {(1 - row['wall_ms'] / original['wall_ms']) / (1 - m):.2f}"
                for row, m in zip(rows[1:], macs[1:]) if m < 1]
    if realised:
        lines += ["", "Realisation from this run's call times (models one after the other under the profiler, not "
                      "side by side: indicative only): " + ", ".join(realised) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
