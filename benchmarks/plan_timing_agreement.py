"""Does the speedup ``edge plan`` reports for its choice agree with a user's own timing of it? (issue 33, point 4)

    python benchmarks/plan_timing_agreement.py --plan runs/plan2x --runs 2          # a plan folder made before
    python benchmarks/plan_timing_agreement.py --model fmnist-deit-tiny --budget 0.5x --out runs/plan-agree \\
        --plan-args "--table tables/cpu-b1.json --data fmnist" --runs 2                # edge plan run here first

The planner's figure: ``plan.json``'s ``timed.plans[0].speedup`` (the chosen plan, timed whole beside the
original). The independent figure, made only with the CLI, each step its own process:

1. ``python -m edge export PLAN/model`` and ``python -m edge export MODEL`` (the original, with the plan's
   ``--weights`` / ``--img-size``) at the plan's batch, then ``python -m edge clean`` of each, into ``--work``;
2. ``--runs`` times, a fresh process times the two cleaned graphs side by side with an A/A copy of the
   original (``python -m edge.profile.fresh``: :func:`edge.profile.sidebyside.side_by_side`, the library
   function of side-by-side profiling): the plan's threads and warm-up, 40 rounds in 10 session sets of 20
   calls per graph (``--rounds/--sessions/--calls``; ``--same-protocol``: the protocol ``plan.json`` records).
   A first run with the planner's own protocol (200 calls in 20 rounds, 5 session sets: 5 s per graph at
   batch 1) gave 3.17x and 2.90x in two fresh processes for one plan: too short to tell 5 % apart.

Recorded: both figures, each run's ratio planner / independent and the ratio to the median of the runs
(acceptance: within 5 %), whether the planner's timed graph and the CLI's have the same operators, the
A/A controls, the other processes' CPU share while timing, hardware and versions. Nothing is timed in
this process. Writes benchmarks/results/plan_timing_agreement.json (``--json-out``).
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import command_line  # noqa: E402 (benchmarks/ is on sys.path)

from edge.errors import EdgeError  # noqa: E402
from edge.progress import log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JSON_OUT = ROOT / "benchmarks/results/plan_timing_agreement.json"
TOLERANCE = 0.05   # the acceptance: the planner's figure within 5 % of the independent one


def edge_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "edge", *args]


def run(args: list[str]) -> subprocess.CompletedProcess:
    """``args`` in a new process (edge from this checkout); its stderr shown; an EdgeError when it fails."""
    log("$ " + shlex.join(args[1:] if args[0] == sys.executable else args))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise EdgeError(f"{shlex.join(args)} failed (exit {done.returncode})", found=done.stderr.strip()[-2000:])
    return done


def make_plan(model: str, budget: str, out: Path, plan_args: str) -> None:
    if out.exists():
        raise EdgeError(f"--out {out} exists", fix="pass --plan to measure that plan folder, or a new --out")
    run(edge_command("plan", model, "--budget", budget, "--out", str(out), *shlex.split(plan_args)))


def planner_figure(plan: Path) -> dict:
    """The planner's reported speedup of its choice, and how it was timed, from ``plan/plan.json``."""
    path = plan / "plan.json"
    if not path.is_file():
        raise EdgeError(f"{path} does not exist", expected="a folder written by edge plan",
                        fix="pass --plan DIR of an edge plan run, or --model to run edge plan first")
    record = json.loads(path.read_text())
    timed = record.get("timed")
    if not timed:
        raise EdgeError(f"{path} holds no whole-model timing", expected="a plan timed here (an ONNX Runtime table "
                        "of this machine, --measure 1 or more)", fix="plan with a table measured here")
    if len(record.get("batches") or []) > 1:
        raise EdgeError(f"{path} is a plan for several batches", expected="a plan for one batch",
                        fix="plan for one --batch to compare its figure")
    row = timed["plans"][0]
    return {"plan": row["plan"], "speedup": row["speedup"], "interval": row.get("speedup_interval"),
            "aa_ratio": timed["aa_ratio"], "original_ms": timed["original_ms"], "measured_ms": row["measured_ms"],
            "graph": row.get("graph"), "protocol": timed["protocol"], "model": record["model"],
            "batch": record["target"]["batch"], "threads": record["target"]["threads"],
            "hardware": record.get("hardware")}


def cli_graphs(plan: Path, planner: dict, work: Path) -> dict[str, Path]:
    """``edge export`` + ``edge clean`` of the original and of ``plan/model``: name -> cleaned graph."""
    work.mkdir(parents=True, exist_ok=True)
    source = planner["model"]
    options = [*(["--weights", source["weights"]] if source.get("weights") else []),
               *(["--img-size", str(source["img_size"])] if source.get("img_size") else [])]
    graphs = {}
    for name, model, extra in (("original", source["model"], options), ("plan", str(plan / "model"), [])):
        raw, clean = work / f"{name}.onnx", work / f"{name}.clean.onnx"
        run(edge_command("export", model, "--out", str(raw), "--batch", str(planner["batch"]), *extra))
        run(edge_command("clean", str(raw), "--out", str(clean)))
        graphs[name] = clean
    return graphs


def same_operators(a: Path, b: Path) -> bool:
    import onnx

    ops = [[n.op_type for n in onnx.load(str(p), load_external_data=False).graph.node] for p in (a, b)]
    return ops[0] == ops[1]


def independent_run(graphs: dict[str, Path], planner: dict, protocol: dict | None, seed: int) -> dict:
    """One fresh process timing the CLI's graphs side by side with an A/A copy: with ``protocol`` (rounds,
    sessions, calls per round; the threads and warm-up are the plan's), else the plan's own protocol."""
    if protocol is None:
        protocol = planner["protocol"]
    else:
        protocol = {**{k: planner["protocol"][k] for k in ("threads", "warmup")}, "rounds": protocol["rounds"],
                    "sessions": protocol["sessions"], "iterations": protocol["calls"] * protocol["rounds"],
                    "seed": seed}
    flags = [f"--{key}={protocol[key]}" for key in ("threads", "warmup", "iterations", "rounds", "sessions", "seed")
             if key in protocol]
    done = run([sys.executable, "-m", "edge.profile.fresh", "--reference", "original", *flags,
                *(f"{name}={path}" for name, path in graphs.items())])
    summary = json.loads(done.stdout)
    plan, original = summary["graphs"]["plan"], summary["graphs"]["original"]
    return {"speedup": plan["speedup"], "interval": [plan["low"], plan["high"]], "plan_ms": plan["median_ms"],
            "original_ms": original["median_ms"], "aa_control": summary["aa_control"], "noisy": summary["noisy"],
            "contention": summary["contention"], "seconds": summary["seconds"], "settings": summary["settings"]}


def agreement(planner: dict, runs: list[dict]) -> dict:
    speedups = [r["speedup"] for r in runs]
    median = float(np.median(speedups))
    ratio = planner["speedup"] / median
    return {"planner_speedup": planner["speedup"], "independent_speedup_median": median,
            "independent_speedups": speedups, "ratio": ratio,
            "ratios": [planner["speedup"] / s for s in speedups], "within_5pct": abs(ratio - 1) <= TOLERANCE,
            "every_run_within_5pct": all(abs(planner["speedup"] / s - 1) <= TOLERANCE for s in speedups)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--plan", type=Path, help="a plan folder (edge plan --out) timed here")
    given.add_argument("--model", help="run edge plan on this model first (with --budget, --out, --plan-args)")
    parser.add_argument("--budget", default="0.5x", help="--model: edge plan's --budget")
    parser.add_argument("--out", type=Path, help="--model: the plan folder edge plan writes")
    parser.add_argument("--plan-args", default="", help="--model: more edge plan options, one string")
    parser.add_argument("--runs", type=int, default=2, help="independent fresh-process timings")
    parser.add_argument("--rounds", type=int, default=40, help="independent timing: interleaved rounds")
    parser.add_argument("--sessions", type=int, default=10, help="independent timing: session sets")
    parser.add_argument("--calls", type=int, default=20, help="independent timing: calls per graph and round")
    parser.add_argument("--same-protocol", action="store_true",
                        help="time with the protocol plan.json records instead (rounds, sessions, calls)")
    parser.add_argument("--work", type=Path, help="where the CLI's graphs go (default: PLAN/agreement)")
    parser.add_argument("--json-out", type=Path, default=JSON_OUT)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: expected at least 1")
    if args.model and not args.out:
        parser.error("--model needs --out (the plan folder edge plan writes)")
    started, load_before = time.perf_counter(), os.getloadavg()
    try:
        plan = args.plan or args.out
        if args.model:
            make_plan(args.model, args.budget, args.out, args.plan_args)
        planner = planner_figure(plan)
        graphs = cli_graphs(plan, planner, args.work or plan / "agreement")
        runs = []
        for i in range(args.runs):
            protocol = None if args.same_protocol else {"rounds": args.rounds, "sessions": args.sessions,
                                                         "calls": args.calls}
            runs.append(independent_run(graphs, planner, protocol, seed=i))
            log(f"run {i + 1}/{args.runs}: independent {runs[-1]['speedup']:.3f}x, planner {planner['speedup']:.3f}x")
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    from edge.runtime import hardware, versions

    timed_graph = plan / planner["graph"] if planner.get("graph") else None
    record = {"plan_folder": str(plan), "planner": planner, "independent": {
                  "graphs": {name: str(path) for name, path in graphs.items()},
                  "made_by": "python -m edge export, then python -m edge clean (each its own process)",
                  "timed_by": "python -m edge.profile.fresh (a fresh process per run; side by side, A/A copy)",
                  "protocol": "the plan's (plan.json)" if args.same_protocol else
                  {"rounds": args.rounds, "sessions": args.sessions, "calls_per_round": args.calls,
                   "seed": "the run's index"},
                  "same_operators_as_planner": same_operators(timed_graph, graphs["plan"])
                  if timed_graph and timed_graph.is_file() else None,
                  "runs": runs},
              "agreement": agreement(planner, runs), "hardware": hardware(), "versions": versions(),
              "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
              "seconds": round(time.perf_counter() - started, 1),
              "command": command_line("plan_timing_agreement.py", args, parser)}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    a = record["agreement"]
    log(f"planner {a['planner_speedup']:.3f}x, independent {a['independent_speedup_median']:.3f}x (median of "
        f"{args.runs}): ratio {a['ratio']:.3f} ({'within' if a['within_5pct'] else 'outside'} 5 %); "
        f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
