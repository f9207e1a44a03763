"""What the main job's wall time would be with recipe keys changed: the built-in recipe and one changed copy,
run alternately, each from nothing.

    python benchmarks/recipe_walltime.py --set precision.variants=[planned] --set evaluate.subset=1000 \\
        --set profile.rounds=20 --set bundle.variants=[planned] --repeats 2 --work /tmp/recipe-walltime

Each ``--set KEY=VALUE`` replaces one key of the built-in recipe (``edge pipeline --print-recipe``; the value is
YAML). The two recipes run ``--repeats`` times each, alternated (built-in first), every run ``edge pipeline``
into a new folder with its own edge cache (``EDGE_CACHE_DIR``), so nothing is shared; the CPU time others took
meanwhile is recorded as benchmarks/main_job.py does. It says what a change of the recipe would buy on this
machine, not whether the change is wanted: the keys are the product's (what the main job shows), and the
figures are the evidence for choosing them. Nothing else may run meanwhile.

Writes benchmarks/results/recipe_walltime.json and docs/results/recipe-walltime.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import provenance, write_results  # noqa: E402
from main_job import graph_rows, step_seconds, timed  # noqa: E402

from edge.errors import EdgeError  # noqa: E402
from edge.pipeline.recipe import default_recipe_text, parse_recipe  # noqa: E402


def changed_recipe(text: str, changes: list[str]) -> tuple[dict, dict]:
    """(the recipe ``text`` with every ``KEY=VALUE`` of ``changes`` applied, {key: (before, after)})."""
    document = yaml.safe_load(text)
    applied = {}
    for change in changes:
        key, sep, value = change.partition("=")
        path = key.split(".")
        if not sep or not all(path):
            raise SystemExit(f"recipe_walltime: --set {change!r}: expected KEY=VALUE, e.g. evaluate.subset=1000")
        section = document
        for part in path[:-1]:
            section = section.get(part) if isinstance(section, dict) else None
        if not isinstance(section, dict) or path[-1] not in section:
            raise SystemExit(f"recipe_walltime: --set {change!r}: the built-in recipe has no key {key!r} "
                             "(`edge pipeline --print-recipe` lists them)")
        before, section[path[-1]] = section[path[-1]], yaml.safe_load(value)
        applied[key] = (before, section[path[-1]])
    try:   # checked as edge pipeline will check it, before any run: a bad value fails now, not after the first run
        parse_recipe(document, source="the changed recipe")
    except EdgeError as e:
        raise SystemExit(f"recipe_walltime: --set {' --set '.join(changes)}: {e}") from e
    return document, applied


def run_once(name: str, recipe: Path, folder: Path) -> dict:
    folder.mkdir(parents=True)
    others: dict = {}
    code, seconds = timed([sys.executable, "-m", "edge", "pipeline", "--recipe", str(recipe), "--out",
                           str(folder / "run")], ROOT, {"EDGE_CACHE_DIR": str(folder / "cache")}, folder / "log",
                          others)
    row = {"recipe": name, "folder": str(folder), "exit": code, "wall_s": round(seconds, 1), "contention": others}
    if code == 0:
        report = json.loads((folder / "run" / "report.json").read_text())
        row |= {"steps": step_seconds(report), "plan": report["plan"]["chosen"]["plan"] if report.get("plan") else None,
                "graphs": {n: {"accuracy": g["accuracy"], "images": g["images"], "speedup": g["speedup"],
                               "noisy": g["noisy"]} for n, g in graph_rows(report).items()}}
    print(f"{name}: exit {code}, {seconds:.1f} s, others took {others.get('other_cpu_share')} of the CPUs",
          file=sys.stderr)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", dest="changes", action="append", default=[], metavar="KEY=VALUE", required=True,
                        help="a key of the built-in recipe and its new value (YAML); repeatable")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each recipe, alternated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/edge-recipe-walltime"), help="a new folder")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/recipe_walltime.json"))
    parser.add_argument("--md-out", default=str(ROOT / "docs/results/recipe-walltime.md"))
    args = parser.parse_args()
    if args.work.exists():
        raise SystemExit(f"recipe_walltime: {args.work} exists; pass a new --work folder (runs share nothing)")
    text = default_recipe_text()
    document, applied = changed_recipe(text, args.changes)
    started, load_before = time.perf_counter(), os.getloadavg()
    args.work.mkdir(parents=True)
    recipes = {"built-in": args.work / "built-in.yaml", "changed": args.work / "changed.yaml"}
    recipes["built-in"].write_text(text)
    recipes["changed"].write_text(yaml.safe_dump(document, sort_keys=False))
    runs = [run_once(name, path, args.work / f"{name}-{i}") for i in range(1, args.repeats + 1)
            for name, path in recipes.items()]
    record = {"benchmark": "recipe_walltime", "changes": {k: {"built-in": b, "changed": a} for k, (b, a) in
                                                          applied.items()},
              "repeats": args.repeats, "runs": runs,
              **provenance("recipe_walltime.py", args, parser, started=started, load_before=load_before,
                           skip=("out", "md_out", "changes"))}
    # each change is its own --set (command_line would give one flag for the list)
    record["command"] = shlex.join([*shlex.split(record["command"])[:2],
                                    *(part for change in args.changes for part in ("--set", change)),
                                    *shlex.split(record["command"])[2:]])
    write_results(record, args.out, args.md_out, markdown)
    return 0 if all(r["exit"] == 0 for r in runs) else 1


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{100 * share:.1f} %"


def markdown(r: dict) -> str:
    hw = r["hardware"]
    changes = ", ".join(f"`{k}` {json.dumps(v['built-in'])} -> {json.dumps(v['changed'])}"
                        for k, v in r["changes"].items())
    lines = ["# The main job's wall time with recipe keys changed", "",
             f"Generated by `{r['command']}`. Machine: {hw.get('cpu')}, {hw.get('cpu_count')} CPUs; ONNX Runtime "
             f"{r['versions'].get('onnxruntime')}, torch {r['versions'].get('torch')}. Each run `edge pipeline` "
             "from nothing (its own folder and edge cache), the two recipes alternated; nothing else running.", "",
             f"Changed: {changes}.", "",
             "| run | recipe | exit | wall s | others' CPU share (host steal) | plan chosen | evaluate | plan search "
             "| profile | quantize |", "|---|---|---|---|---|---|---|---|---|---|"]
    for i, run in enumerate(r["runs"], 1):
        c, steps = run.get("contention") or {}, run.get("steps", {})
        share = f"{_pct(c.get('other_cpu_share'))} ({_pct(c.get('stolen_cpu_share'))})"
        lines.append(f"| {i} | {run['recipe']} | {run['exit']} | {run['wall_s']:.0f} | {share} | "
                     f"`{run.get('plan') or '-'}` | "
                     + " | ".join(f"{steps.get(k, 0):.0f} s" for k in ("evaluate", "plan", "profile", "quantize"))
                     + " |")
    for name in ("built-in", "changed"):
        walls = [run["wall_s"] for run in r["runs"] if run["recipe"] == name]
        lines.append(f"\n- {name}: {', '.join(f'{w:.0f} s' for w in walls)}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
