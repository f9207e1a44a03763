"""Graphs timed side by side with an A/A control in a fresh Python process: the figure a user reproduces.

``edge plan`` used to time its front in its own process, after the search's PyTorch work: there the
chosen plan measured 2.19x where the same plan, exported and cleaned by the CLI and timed in a new
process, measured 1.87-1.91x. A process that has run a search differs from the one a user times in
(PyTorch's OpenMP pool and allocator state, ONNX Runtime sessions of a whole latency table created and
dropped before, a large and fragmented heap); none of it is the user's. :func:`time_fresh` starts a new
interpreter on this module, which imports no model and runs no PyTorch, creates the ONNX Runtime sessions
and times them interleaved (:func:`edge.profile.sidebyside.side_by_side`: session sets created afresh in
rotated order, seeded random turn order per round, the reference created twice as its A/A control) and
prints the summary as JSON::

    python -m edge.profile.fresh --reference original original=timed/original.onnx plan0=timed/plan0.onnx

A speedup is the median over rounds of the per-round ratio of medians (reference / graph), with its
seeded bootstrap interval; the same protocol (:func:`edge.profile.graphs.side_by_side_config`) as a
latency table's.

A process's own state moves every graph it times a little, and a new process draws it again: ``edge
pipeline`` splits its session sets between several new processes (:func:`time_fresh_settings` with
``processes``; each runs ``--sets FIRST:COUNT`` and prints its raw timings) and pools them. Timing one main-job
run's eleven graphs again five times (benchmarks/profile_repeatability.py) moved a speedup by up to 12.5 % with
all five sets in one process and by up to 7.5 % with one set per process (each time one slow repeat), for
a few seconds more (77 s against 74 s a repeat).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import typing
from dataclasses import asdict
from pathlib import Path

from edge.config import bounds, checked_value
from edge.errors import EdgeError
from edge.profile.backends import OrtBackend
from edge.profile.graphs import TimingConfig, ort_factories, side_by_side_config
from edge.profile.sidebyside import AA_SUFFIX, SideBySideConfig

MODULE = "edge.profile.fresh"
STDERR_TAIL = 2000   # characters of the child's stderr an error carries


def command(graphs: dict[str, Path], reference: str, timing: TimingConfig, batch: int | None = None) -> list[str]:
    """The command line :func:`time_fresh` runs (``sys.executable -m edge.profile.fresh ...``)."""
    args = [sys.executable, "-m", MODULE, "--reference", reference, "--threads", str(timing.threads),
            "--warmup", str(timing.warmup), "--iterations", str(timing.iterations), "--rounds", str(timing.rounds),
            "--sessions", str(timing.sessions), "--seed", str(timing.seed)]
    if batch is not None:
        args += ["--batch", str(batch)]
    return args + [f"{name}={path}" for name, path in graphs.items()]


def time_fresh(graphs: dict[str, Path], reference: str, timing: TimingConfig, batch: int | None = None) -> dict:
    """Time ``graphs`` (name -> ONNX file) side by side with an A/A control of ``reference``, in a new process.

    Returns :func:`compact` of the summary, with the command that ran it (``process``).
    """
    return _in_child(graphs, reference, command({n: Path(p) for n, p in graphs.items()}, reference, timing, batch))


def time_fresh_settings(graphs: dict[str, Path], reference: str, settings: SideBySideConfig, threads: int,
                        seed: int = 0, processes: int = 1) -> dict:
    """:func:`time_fresh` with every setting of the interleaving given (``edge pipeline``'s profile step): the
    whole summary of :func:`edge.profile.sidebyside.side_by_side` (every graph's timed calls' statistics), with
    ``process``. ``seed``: the random input's (the interleaving's own is ``settings.seed``).

    ``processes`` > 1: the session sets are split between that many new processes, one after the other (each
    runs its sets as one process would: the same creation orders and turn orders), and their timings pooled
    into one summary. A process's own state (its heap, its thread pools, where its memory landed) moves every
    graph it times a little; one process gives one draw of it, several average it out. The count of timed
    calls per round of each graph (``settings.iterations`` None: from the first process's warm-up, ``--counts``) is
    the same in all.
    """
    from edge.profile.sidebyside import finish

    if not 1 <= processes <= settings.sessions:
        raise EdgeError(f"{processes} processes for {settings.sessions} session sets",
                        expected="from 1 to the number of session sets", fix="lower the processes or raise sessions")
    base = [sys.executable, "-m", MODULE, "--reference", reference, "--threads", str(threads), "--seed", str(seed)]
    named = [f"{name}={path}" for name, path in graphs.items()]
    if processes == 1:
        return _in_child(graphs, reference, base + ["--settings", json.dumps(asdict(settings), sort_keys=True)] + named)
    parts: list[dict] = []
    commands: list[list[str]] = []
    for chunk in _chunks(settings.sessions, processes):
        args = base + ["--settings", json.dumps(asdict(settings), sort_keys=True), "--sets",
                       f"{chunk.start}:{len(chunk)}"] + named
        if parts:   # every process times each graph as often as the first one did
            args += ["--counts", json.dumps(parts[0]["timed"]["iterations"], sort_keys=True)]
        parts.append(_in_child(graphs, reference, args))
        commands.append(args[1:])
    return {**finish(parts, reference, settings),
            "process": {"command": commands[0], "commands": commands, "python": sys.executable, "fresh": True,
                        "processes": processes}}


def _chunks(sessions: int, processes: int) -> list[range]:
    """``range(sessions)`` cut into ``processes`` consecutive parts, their sizes within one of each other."""
    edges = [i * sessions // processes for i in range(processes + 1)]
    return [range(a, b) for a, b in zip(edges, edges[1:])]


def _in_child(graphs: dict[str, Path], reference: str, args: list[str]) -> dict:
    """Run ``args`` (this module in a new interpreter) after checking ``graphs``; its JSON summary."""
    if reference not in graphs:
        raise EdgeError(f"the reference {reference!r} is not among the graphs {sorted(graphs)}",
                        fix="name the reference graph as one of the graphs timed")
    for name, path in graphs.items():
        if not Path(path).is_file():
            raise EdgeError(f"graph {name}: {path} does not exist", expected="an ONNX file",
                            fix="export it first (edge export, then edge clean)")
        if "=" in name or name.endswith(")"):
            raise EdgeError(f"graph name {name!r}", expected="a name without '=' that does not end in ')'")
    root = str(Path(__file__).resolve().parents[2])          # the folder holding edge/ and jetson/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise EdgeError(f"timing {', '.join(map(str, graphs.values()))} in a fresh process failed "
                        f"(exit {done.returncode})", found=done.stderr.strip()[-STDERR_TAIL:] or "no message",
                        fix="run the command shown to see it whole: " + " ".join(args))
    try:
        summary = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise EdgeError("the fresh-process timing printed no JSON summary", found=done.stdout[-STDERR_TAIL:],
                        fix="report this as a bug") from e
    return {**summary, "process": {"command": args[1:], "python": sys.executable, "fresh": True}}


def compact(summary: dict) -> dict:
    """What a record keeps of :func:`edge.profile.sidebyside.side_by_side`'s summary."""
    graphs = {name: {"median_ms": v["latency"]["median_ms"], "p90_ms": v["latency"]["p90_ms"],
                     "iterations": v["latency"]["iterations"], "round_medians_ms": v["latency"]["round_medians_ms"],
                     "speedup": v["speedup"]["speedup"], "low": v["speedup"]["low"], "high": v["speedup"]["high"],
                     "verdict": v["speedup"]["verdict"], "model": v["backend"]["model"],
                     "onnxruntime": v["backend"].get("onnxruntime")}
              for name, v in summary["variants"].items()}
    return {"reference": summary["reference"], "graphs": graphs, "aa_control": summary["aa_control"],
            "noisy": summary["noisy"], "method": summary["method"], "settings": summary["settings"],
            "iterations_per_round": summary["iterations_per_round"], "creation_orders": summary["creation_orders"],
            "contention": summary["contention"], "seconds": summary["seconds"], "hardware": summary["hardware"]}


def _check_graph(name: str, path: Path) -> None:
    """A readable ONNX file, or an EdgeError naming it."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        onnx.checker.check_model(onnx.load(str(path), load_external_data=False))
    except (OSError, DecodeError, onnx.checker.ValidationError) as e:
        raise EdgeError(f"graph {name}: {path} is not a valid ONNX model", found=str(e)[:300],
                        fix="export it again (edge export, then edge clean)") from e


def _graph(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PATH")
    return name, Path(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", nargs="+", type=_graph, metavar="NAME=PATH", help="the graphs timed")
    parser.add_argument("--reference", required=True, help="the graph speedups are against (timed twice: A/A)")
    parser.add_argument("--batch", type=int, help="the batch of a graph with a dynamic batch (default: its own)")
    for name, value in asdict(TimingConfig()).items():
        parser.add_argument(f"--{name}", type=int, default=value)
    parser.add_argument("--settings", type=json.loads, help="every setting of the interleaving as JSON (the fields "
                        "of edge.profile.sidebyside.SideBySideConfig; --warmup, --iterations, --rounds and --sessions "
                        "are then unused, --seed seeds the random input): prints the whole summary")
    parser.add_argument("--sets", type=_sets, metavar="FIRST:COUNT", help="with --settings: run only these session "
                        "sets and print their raw timings (what time_fresh_settings pools from several processes)")
    parser.add_argument("--counts", type=_counts, metavar="JSON", help="with --sets: each graph's timed calls per "
                        "round, as {name: count} (the first process's, so that every process times alike)")
    return parser


def _sets(text: str) -> range:
    first, sep, count = text.partition(":")
    if not sep or not first.isdigit() or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIRST:COUNT, e.g. 0:2 (whole numbers, COUNT >= 1)")
    return range(int(first), int(first) + int(count))


def _counts(text: str) -> dict[str, int]:
    try:
        counts = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: not JSON ({e})") from e
    if not isinstance(counts, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                               for v in counts.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a JSON object of whole numbers >= 1, e.g. "
                                         '{"original": 12}')
    return counts


def _settings(given) -> SideBySideConfig:
    """``--settings``: a JSON object of :class:`SideBySideConfig` fields, each checked (name, type, range)."""
    fields = {f.name: f for f in dataclasses.fields(SideBySideConfig)}
    hints = typing.get_type_hints(SideBySideConfig)
    if not isinstance(given, dict):
        raise EdgeError("--settings is not a JSON object", expected=f"{{name: value}} with names among "
                        f"{', '.join(fields)}", found=json.dumps(given))
    for key in given:
        if key not in fields:
            raise EdgeError(f"--settings: unknown setting {key!r}", expected=f"one of {', '.join(fields)}",
                            fix="remove or rename it")
    return SideBySideConfig(**{key: checked_value(value, hints[key], f"--settings: {key}", key, bounds(fields[key]),
                                                  error=EdgeError) for key, value in given.items()})


def run(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, check the graphs, time them side by side: :func:`compact` of the summary."""
    from edge.profile.sidebyside import side_by_side, time_sets

    args = _parser().parse_args(argv)
    graphs = dict(args.graphs)
    if args.reference not in graphs:
        raise EdgeError(f"--reference {args.reference}", expected=f"one of the graphs' names ({', '.join(graphs)})")
    for name, path in graphs.items():
        _check_graph(name, path)
    if args.sets is not None and args.settings is None:
        raise EdgeError("--sets without --settings", fix="give every setting with --settings as well")
    if args.counts is not None and args.sets is None:
        raise EdgeError("--counts without --sets", fix="give the session sets with --sets as well")
    if args.settings is not None:
        settings = _settings(args.settings)
        factories = {name: functools.partial(OrtBackend, path, batch=args.batch, threads=args.threads, seed=args.seed,
                                             spinning=settings.spinning) for name, path in graphs.items()}
        if args.sets is None:
            return side_by_side(factories, args.reference, settings)
        if args.sets.stop > settings.sessions:
            raise EdgeError(f"--sets {args.sets.start}:{len(args.sets)}",
                            expected=f"session sets among 0 to {settings.sessions - 1} (settings: sessions = "
                                     f"{settings.sessions})")
        counts = args.counts
        if counts is not None:
            wanted = {*graphs, args.reference + AA_SUFFIX}
            if set(counts) != wanted:
                raise EdgeError("--counts names other graphs than those timed", expected=", ".join(sorted(wanted)),
                                found=", ".join(sorted(counts)))
        return time_sets(factories, args.reference, settings, args.sets, counts)
    timing = TimingConfig(threads=args.threads, warmup=args.warmup, iterations=args.iterations,
                          rounds=args.rounds, sessions=args.sessions, seed=args.seed)
    return compact(side_by_side(ort_factories(graphs, timing, args.batch), args.reference,
                                side_by_side_config(timing)))


def main(argv: list[str] | None = None) -> int:
    try:
        summary = run(argv)
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
