"""How fast are plans found by ``edge plan``, timed the way a user times them? (issue 33)

    python benchmarks/plan_speed.py --plans runs/p3/b1 runs/p3/b32 --batches 1 32 --runs 2 \\
        --json-out benchmarks/results/plan_speed_0.33x.json --md-out docs/results/plan-speed-0.33x.md

For each plan folder (``edge plan --out``) and the original: ``python -m edge export`` at each batch (static,
verified against PyTorch) and ``python -m edge clean``, each its own process; then, per batch and ``--runs``
times, a fresh process (``python -m edge.profile.fresh``) times every graph of that batch side by side with an
A/A copy of the original (:func:`edge.profile.sidebyside.side_by_side`: session sets created afresh in rotated
order, a seeded random order each round; a speedup is the median over rounds of the per-round ratio of
medians, with its 95 % bootstrap interval). Nothing is timed in this process and nothing else may run on the
machine. Beside each measured speedup: what the planner predicted from its table and, where it timed its
choice, what it measured (plan.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import write_results  # noqa: E402


def run(args: list[str]) -> str:
    print("$ " + shlex.join(args), file=sys.stderr)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def graphs_at(batch: int, plans: dict[str, Path], model: str, work: Path) -> dict[str, Path]:
    """name -> cleaned static-batch graph of the original and of every plan's OUT/model."""
    made = {}
    for name, source in {"original": model, **{n: str(p / "model") for n, p in plans.items()}}.items():
        raw, clean = work / f"{name}.b{batch}.onnx", work / f"{name}.b{batch}.clean.onnx"
        if not clean.is_file():
            run([sys.executable, "-m", "edge", "export", source, "--out", str(raw), "--batch", str(batch)])
            run([sys.executable, "-m", "edge", "clean", str(raw), "--out", str(clean)])
        made[name] = clean
    return made


def planner_figures(folder: Path, batch: int) -> dict:
    record = json.loads((folder / "plan.json").read_text())
    result = record["result"]
    chosen, original = result["chosen"], result["original"]
    by_batch = {int(b): ms for b, ms in (chosen.get("batch_ms") or {}).items()}
    ob = {int(b): ms for b, ms in (original.get("batch_ms") or {}).items()}
    predicted = (ob[batch] / by_batch[batch]) if batch in by_batch and batch in ob else (
        original["predicted_ms"] / chosen["predicted_ms"] if record["target"]["batch"] == batch else None)
    timed = (record.get("timed") or {}).get("plans") or []
    return {"plan": chosen["plan"], "agreement": chosen["agreement"], "kl": chosen["kl"],
            "planned_batch": record["target"]["batch"], "budget": record["budget"], "predicted_speedup": predicted,
            "planner_measured_speedup": timed[0]["speedup"] if timed and record["target"]["batch"] == batch else None,
            "search_seconds": result["seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", nargs="+", type=Path, required=True, help="edge plan output folders")
    parser.add_argument("--model", default="fmnist-deit-tiny")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--runs", type=int, default=2, help="separate fresh-process timings per batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, nargs="+", default=[20, 3],
                        help="timed calls per graph and round, one per --batches entry (about 100 ms of the original)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edge-plan-speed"))
    parser.add_argument("--json-out", type=Path, default=ROOT / "benchmarks/results/plan_speed.json")
    parser.add_argument("--md-out", type=Path, default=ROOT / "docs/results/plan-speed.md")
    args = parser.parse_args()
    started = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    plans = {f"plan-b{json.loads((p / 'plan.json').read_text())['target']['batch']}": p for p in args.plans}
    if len(plans) != len(args.plans):
        plans = {p.name: p for p in args.plans}
    rows = []
    if len(args.calls) != len(args.batches):
        raise SystemExit("--calls: one number per --batches entry")
    for batch, calls in zip(args.batches, args.calls):
        graphs = graphs_at(batch, plans, args.model, args.work)
        for attempt in range(1, args.runs + 1):
            out = run([sys.executable, "-m", "edge.profile.fresh", "--reference", "original", "--threads",
                       str(args.threads), "--warmup", str(args.warmup), "--iterations", str(calls * args.rounds),
                       "--rounds", str(args.rounds), "--sessions", str(args.sessions), "--seed", str(attempt - 1),
                       *(f"{n}={p}" for n, p in graphs.items())])
            summary = json.loads(out)
            rows.append({"batch": batch, "run": attempt, "calls_per_round": summary["iterations_per_round"], "aa_control": summary["aa_control"],
                         "contention": summary["contention"],
                         "graphs": {n: {k: g[k] for k in ("median_ms", "p90_ms", "speedup", "low", "high")}
                                    for n, g in summary["graphs"].items()}, "hardware": summary["hardware"]})
    import onnxruntime

    record = {"command": " ".join(["python", "benchmarks/plan_speed.py", *sys.argv[1:]]),
              "plans": {n: {"folder": str(p), **{f"b{b}": planner_figures(p, b) for b in args.batches}}
                        for n, p in plans.items()},
              "settings": {k: getattr(args, k) for k in ("threads", "calls", "rounds", "sessions", "warmup",
                                                         "runs", "batches")},
              "runs": rows, "versions": {"onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0]},
              "load_average": os.getloadavg(), "seconds": round(time.perf_counter() - started, 1)}
    write_results(record, args.json_out, args.md_out, markdown)
    return 0


def markdown(record: dict) -> str:
    hw = record["runs"][0]["hardware"]
    s = record["settings"]
    lines = ["# Plans timed as a user times them: fresh processes, side by side, A/A control", "",
             f"Generated by `{record['command']}` ({record['seconds'] / 60:.1f} min). {hw['cpu']}, {hw['cpu_count']} "
             f"CPUs, ONNX Runtime {record['versions']['onnxruntime']} (CPU, {s['threads']} threads, fp32, static batch, "
             f"graphs from `edge export` + `edge clean`); each run a fresh process: {s['rounds']} rounds in "
             f"{s['sessions']} session sets, {' / '.join(map(str, s['calls']))} calls per graph and round at batch "
             f"{' / '.join(map(str, s['batches']))}, {s['warmup']} warm-up calls.",
             ""]
    for name, plan in record["plans"].items():
        first = plan[f"b{s['batches'][0]}"]
        lines.append(f"- `{name}` ({plan['folder']}, planned at batch {first['planned_batch']}, budget "
                     f"{first['budget']}x): `{first['plan']}`; held-out agreement {first['agreement']:.4f}, KL "
                     f"{first['kl']:.4g}; search {first['search_seconds']:.0f} s.")
    lines += ["", "| batch | run | A/A | " + " | ".join(f"{n} speedup [95 %]" for n in record["plans"]) + " |",
              "|---|---|---|" + "---|" * len(record["plans"])]
    for row in record["runs"]:
        aa = row["aa_control"]
        cells = [f"{row['graphs'][n]['speedup']:.3f}x [{row['graphs'][n]['low']:.3f}, {row['graphs'][n]['high']:.3f}]"
                 for n in record["plans"]]
        lines.append(f"| {row['batch']} | {row['run']} | {aa['speedup']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "Predicted by the planner from its latency table (and measured by its own whole-model check, "
              "at the batch it planned for):", "", "| plan | batch | predicted | planner measured |",
              "|---|---|---|---|"]
    for name, plan in record["plans"].items():
        for b in s["batches"]:
            f = plan[f"b{b}"]
            pred = f"{f['predicted_speedup']:.3f}x" if f["predicted_speedup"] else "-"
            meas = f"{f['planner_measured_speedup']:.3f}x" if f["planner_measured_speedup"] else "-"
            lines.append(f"| {name} | {b} | {pred} | {meas} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
