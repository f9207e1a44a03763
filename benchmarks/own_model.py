"""A user's own model at 224 px on an image folder: how long `edge plan` takes, how fast `edge finetune` trains.

    python benchmarks/own_model.py --work /tmp/own            # both parts (about 40 minutes on 2 cores)
    python benchmarks/own_model.py --work /tmp/own --part finetune --workers 1 2

* **plan**: ``edge plan timm:deit_small_patch16_224 --weights W --data DIR --backend estimate --budget 0.5x``
  with every other setting at its default, in a new process: wall time, the time of each phase (from the
  time-stamped lines it prints: set-up with the reference and calibration passes, the latency table, the
  search rounds, writing), and the process's peak resident memory.
* **finetune**: ``edge finetune`` of a dwconv-compressed deit_tiny at 224 px on the same folder for a fixed
  number of steps, once per ``--workers`` (``EDGE_DATA_WORKERS``): images per second of training and the share
  of the steps' time spent waiting for a batch (``data_wait_s`` of the fine-tune's record).

The weights are random (no hub here) and the folder is generated (tests/rgb_folder.py: 10 classes of RGB JPEGs,
``--size`` px, resized to 224 by timm's transforms). Nothing else may run meanwhile. Results:
benchmarks/results/own_model.json and docs/results/own-model.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import provenance, write_results  # noqa: E402

PLAN_MODEL = "timm:deit_small_patch16_224"
TUNE_MODEL = "timm:deit_tiny_patch16_224,num_classes=10"
PHASES = (("loading the model", r"estimating the latency table"),
          ("latency table (Orin Nano estimate); calibration and held-out images; the original's outputs",
           r"candidates keep|^budget "),
          ("the original and the fastest plan measured (block statistics: a pass over the calibration images)",
           r"^budget "),
          ("search round 1 (every move measured)", r"^round 1:"),
          ("search rounds 2 to the last (a few moves each)", r"^chose "),
          ("writing the plan", None))


def _timed_lines(command: list[str], env: dict,
                 limit_s: float | None = None) -> tuple[int, list[tuple[float, str]], float, float, str]:
    """Run ``command``; its exit status, each stderr line with its time since the start, the wall time, the
    peak resident memory of the child (MiB, from getrusage of the children) and its stdout. Past ``limit_s``
    the child is stopped (SIGTERM): its lines so far still come back, its status is then -15."""
    import tempfile
    import threading

    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:   # a file, not a pipe: a large --json must not block the child
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True)
        timer = threading.Timer(limit_s, process.terminate) if limit_s else None
        if timer:
            timer.start()
        lines = []
        assert process.stderr is not None
        for line in process.stderr:
            lines.append((round(time.perf_counter() - start, 2), line.rstrip()))
            print(f"[{lines[-1][0]:8.1f}s] {line.rstrip()}", file=sys.stderr, flush=True)
        process.wait()
        if timer:
            timer.cancel()
        out.seek(0)
        stdout = out.read()
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return process.returncode, lines, wall, peak, stdout


def _phases(lines: list[tuple[float, str]], wall: float) -> list[dict]:
    """The phases' seconds: each ends at the first line matching the next phase's start."""
    out, begun = [], 0.0
    for name, ends_at in PHASES:
        end = wall if ends_at is None else next((t for t, text in lines if re.search(ends_at, text)), None)
        if end is None:
            out.append({"phase": name, "seconds": None})
            continue
        out.append({"phase": name, "seconds": round(end - begun, 1)})
        begun = end
    return out


def _files(work: Path, size: int, train: int, val: int) -> tuple[Path, Path, Path]:
    import torch

    import edge._compat  # noqa: F401 - before timm
    from edge.models import create_model
    from edge.models.weights_io import save_safetensors
    from tests.rgb_folder import make_rgb_folder

    images = work / "images"
    if not images.is_dir():
        make_rgb_folder(images, train=train, val=val, size=size)
    small, tiny = work / "deit_small.safetensors", work / "deit_tiny.safetensors"
    for path, spec in ((small, PLAN_MODEL), (tiny, TUNE_MODEL)):
        if not path.is_file():
            torch.manual_seed(0)
            save_safetensors(create_model(spec).state_dict(), path)
    return images, small, tiny


def plan_part(work: Path, images: Path, weights: Path, budget: str, threads: int, limit_min: float) -> dict:
    out = work / "plan"
    command = [sys.executable, "-m", "edge", "plan", PLAN_MODEL, "--weights", str(weights), "--data", str(images),
               "--backend", "estimate", "--budget", budget, "--threads", str(threads), "--out", str(out), "--json"]
    env = {**os.environ, "EDGE_NO_PROGRESS": "1"}
    code, lines, wall, peak, stdout = _timed_lines(command, env, limit_min * 60 if limit_min else None)
    record = {"command": " ".join(command[1:]), "returncode": code, "wall_s": round(wall, 1),
              "stopped_at_limit_min": limit_min if code == -15 else None,
              "peak_rss_mib": round(peak), "phases": _phases(lines, wall),
              "rounds": sum(1 for _, text in lines if text.startswith("round ")), "lines": lines[-40:]}
    if code == 0:
        chosen = json.loads(stdout)["result"]["chosen"]
        record["chosen"] = {k: chosen.get(k) for k in ("plan", "predicted_ms", "agreement")}
    return record


def finetune_part(work: Path, images: Path, weights: Path, workers: list[int], steps: int, batch: int,
                  threads: int) -> list[dict]:
    artifact = work / "dw"
    env = {**os.environ, "EDGE_NO_PROGRESS": "1"}
    if not artifact.is_dir():
        subprocess.run([sys.executable, "-m", "edge", "compress", TUNE_MODEL, "--weights", str(weights), "--data",
                        str(images), "--plan", "dwconv:blocks=10+11", "--samples", "64", "--out", str(artifact)],
                       cwd=ROOT, env=env, check=True, stdin=subprocess.DEVNULL)
    rows = []
    for count in workers:
        out = work / f"tuned-w{count}"
        command = [sys.executable, "-m", "edge", "finetune", str(artifact), "--data", str(images), "--max-steps",
                   str(steps), "--batch-size", str(batch), "--eval-samples", "20", "--threads", str(threads),
                   "--device", "cpu", "--no-resume", "--out", str(out), "--json"]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env={**env, "EDGE_DATA_WORKERS": str(count)}, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        row = {"workers": count, "returncode": done.returncode, "wall_s": round(wall, 1)}
        if done.returncode == 0:
            record = json.loads(done.stdout)
            train_s = record["wall_time_s"]
            row.update(steps=record["steps"], batch=batch, train_s=train_s, data_wait_s=record["data_wait_s"],
                       images_per_s=round(record["steps"] * batch / train_s, 2),
                       data_share=round(record["data_wait_s"] / train_s, 3))
        else:
            row["stderr"] = done.stderr[-2000:]
        rows.append(row)
    return rows


def markdown(r: dict) -> str:
    hw, v = r["hardware"], r["versions"]
    def folder(f: dict) -> str:
        return (f"a generated RGB JPEG folder ({f['train']} training and {f['val']} validation images per class, "
                f"10 classes, {f['size']} px files)")

    lines = ["# Your own model at 224 px: plan time and fine-tune throughput", "",
             f"Machine: {hw['cpu']}, {hw['cpu_count']} CPUs, torch {v.get('torch')}, timm {v.get('timm')}; nothing "
             "else running. Random weights (no hub here).", ""]
    plan = r.get("plan")
    if plan:
        stopped = (f" (stopped at the benchmark's limit of {plan['stopped_at_limit_min']:g} min: not finished)"
                   if plan.get("stopped_at_limit_min") else "")
        lines += ["## `edge plan` of deit_small at 224 px, default settings", "",
                  f"Generated by `{plan.get('generated_by', r['command'])}` on "
                  f"{folder(plan.get('folder', r['folder']))}.", "",
                  f"`{plan['command']}`: exit {plan['returncode']}{stopped}, **{plan['wall_s'] / 60:.1f} min** wall, "
                  f"peak resident memory {plan['peak_rss_mib']} MiB, {plan['rounds']} search rounds.", "",
                  "| phase | seconds |", "|---|---|"]
        lines += [f"| {p['phase']} | {p['seconds'] if p['seconds'] is not None else 'n/a'} |" for p in plan["phases"]]
        if plan.get("chosen"):
            lines += ["", f"Chosen: `{plan['chosen']['plan']}` ({plan['chosen']['predicted_ms']:.4g} ms predicted)."]
        lines.append("")
    if r.get("finetune"):
        f = r.get("finetune_folder", r["folder"])
        lines += ["## `edge finetune` on the folder (deit_tiny at 224 px, dwconv on blocks 10-11)", "",
                  f"Generated by `{r.get('finetune_generated_by', r['command'])}` on {folder(f)}.", "",
                  "| data workers | steps x batch | training s | images/s | waiting for data | share of the time |",
                  "|---|---|---|---|---|---|"]
        for row in r["finetune"]:
            if row["returncode"]:
                lines.append(f"| {row['workers']} | failed (exit {row['returncode']}) | | | | |")
                continue
            lines.append(f"| {row['workers']} | {row['steps']} x {row['batch']} | {row['train_s']} | "
                         f"{row['images_per_s']} | {row['data_wait_s']} s | {row['data_share']:.1%} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the generated files and runs")
    parser.add_argument("--part", choices=["plan", "finetune", "both"], default="both")
    parser.add_argument("--budget", default="0.5x")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit-min", type=float, default=0,
                        help="stop the plan after this many minutes (its phases so far are still reported; 0: none)")
    parser.add_argument("--size", type=int, default=256, help="side of the generated JPEGs, px")
    parser.add_argument("--train", type=int, default=110, help="training images per class (the plan's default "
                        "calibration and held-out images, 512 each, are then distinct images)")
    parser.add_argument("--val", type=int, default=10, help="validation images per class")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "own_model.json"))
    parser.add_argument("--md", default=str(ROOT / "docs" / "results" / "own-model.md"))
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    images, small, tiny = _files(work, args.size, args.train, args.val)
    record: dict = {"folder": {"train": args.train, "val": args.val, "size": args.size}}
    if args.part != "both" and Path(args.out).is_file():   # one part run again: the other part's figures stay
        kept = json.loads(Path(args.out).read_text())
        record.update({k: kept[k] for k in ("plan", "finetune", "finetune_generated_by") if k in kept})
        record["finetune_folder"] = kept.get("finetune_folder", kept.get("folder"))
        record.setdefault("finetune_generated_by", kept.get("command"))
    if args.part in ("plan", "both"):
        record["plan"] = plan_part(work, images, small, args.budget, args.threads, args.limit_min)
        record["plan"]["folder"] = record["folder"]
        record["plan"]["generated_by"] = "python benchmarks/own_model.py " + " ".join(sys.argv[1:])
    if args.part in ("finetune", "both"):
        record["finetune"] = finetune_part(work, images, tiny, args.workers, args.steps, args.batch_size, args.threads)
        record["finetune_folder"] = record["folder"]
        record["finetune_generated_by"] = "python benchmarks/own_model.py " + " ".join(sys.argv[1:])
    record.update(provenance("own_model.py", args, parser, started=started, load_before=load))
    write_results(record, args.out, args.md, markdown)


if __name__ == "__main__":
    main()
