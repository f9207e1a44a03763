"""``python3 -m jetson run``: benchmark a bundle on this device (run from inside the bundle folder, or
pass ``--bundle``). The formats of its results: jetson.run_results; its exit codes: jetson.run_options.
``python3 -m jetson check``: is this device ready (jetson.check)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jetson.bundle import MANIFEST
from jetson.check import MIN_AVAILABLE_MIB, MIN_DISK_MIB, CheckOptions, report, run_checks, table
from jetson.cuda import BINDINGS
from jetson.engine import BUILDERS
from jetson.errors import JetsonError
from jetson.run_options import BACKENDS, ENERGY, EXIT_USAGE, RunOptions
from jetson.runner import run

EXAMPLES = """examples (in the bundle folder):
  python3 -m jetson run                                  # TensorRT, the bundle's protocol, results/ here
  python3 -m jetson run --backend ort --iterations 50    # ONNX Runtime where TensorRT is absent
  python3 -m jetson run --power-mode 15W --lock-clocks --duration 30   # never under sudo: see below
  python3 -m jetson run --variant baseline.fp16 --out /tmp/results --force
  python3 -m jetson run --builder trtexec                # engines built by JetPack's trtexec

--power-mode and --lock-clocks call nvpmodel and jetson_clocks through `sudo -n`; the login user
needs this one sudoers line (sudo visudo -f /etc/sudoers.d/edge-jetson), else the run is refused
before anything is built:
  USER ALL=(root) NOPASSWD: /usr/sbin/nvpmodel, /usr/bin/jetson_clocks"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m jetson", description="The device side of edge: build "
                                     "and benchmark the engines of a bundle made by `edge bundle`.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    runner = commands.add_parser("run", help="check the bundle, build each engine, benchmark it, write results",
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_argument("--bundle", type=Path, help="the bundle folder (default: the one this package is in, "
                                                    "else the current folder)")
    runner.add_argument("--out", type=Path, help="results folder (default: BUNDLE/results)")
    runner.add_argument("--backend", choices=BACKENDS, default="tensorrt",
                        help="tensorrt (default) or ort: the same protocol on ONNX Runtime, labelled as such")
    runner.add_argument("--builder", choices=BUILDERS, default="python",
                        help="TensorRT: who builds the engines: python (TensorRT's Python API, default: applies the "
                             "bundle's tactic-DRAM cap) or trtexec (its output in results/logs/ID.trtexec.log; it has "
                             "no tactic-DRAM pool, so the cap is not applied); each has engines of its own in the "
                             "cache")
    runner.add_argument("--trtexec", metavar="PATH", help="the trtexec to build with (default: trtexec on PATH, "
                                                          "else /usr/src/tensorrt/bin/trtexec)")
    runner.add_argument("--warmup", type=_positive_int, help="untimed calls first, at least (default: the bundle's)")
    runner.add_argument("--warmup-time", dest="warmup_s", type=float,
                        help="untimed seconds first, at least (default: the bundle's; trtexec's 0.2)")
    runner.add_argument("--iterations", type=_positive_int, help="timed calls, at least; alone (without --duration) "
                                                                 "it is the whole timed window")
    runner.add_argument("--duration", dest="duration_s", type=float,
                        help="time for at least this many seconds, also with energy (default: the bundle's, "
                             "trtexec's 3 s, 10 s with energy)")
    runner.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", default=None,
                        help="TensorRT: enqueue each inference instead of replaying a CUDA graph")
    runner.add_argument("--idle", dest="idle_s", type=float, help="seconds of idle power sampled before the timing")
    runner.add_argument("--energy", choices=ENERGY, default="auto",
                        help="sample tegrastats for energy per call and per image (auto: when tegrastats is on PATH)")
    runner.add_argument("--power-mode", help="nvpmodel mode by name (e.g. 15W, MAXN_SUPER) for the run, put back after")
    runner.add_argument("--lock-clocks", action="store_true", help="jetson_clocks for the run, restored after")
    runner.add_argument("--nvpmodel-conf", type=Path, default=RunOptions.nvpmodel_conf,
                        help="the nvpmodel configuration that maps mode names to ids (default: the one nvpmodel "
                             "reads, as `nvpmodel -q --verbose` names it; else /etc/nvpmodel.conf)")
    runner.add_argument("--variant", dest="variants", action="append", default=[], metavar="ID",
                        help="only this variant (NAME or NAME.PRECISION; repeatable)")
    runner.add_argument("--cache-dir", type=Path, help="engine cache (default: ~/.cache/edge-jetson or "
                                                       "$EDGE_JETSON_CACHE)")
    runner.add_argument("--cuda", choices=BINDINGS,
                        help="CUDA binding (default: the first, in this order, that answers a trivial call)")
    runner.add_argument("--threads", type=int, help="ONNX Runtime: intra-op threads")
    runner.add_argument("--layer-runs", type=_positive_int, default=20,
                        help="TensorRT: extra runs with per-layer profiling (0: none)")
    runner.add_argument("--force", action="store_true", help="recompute variants whose results exist")
    add_check_parser(commands)
    return parser


def add_check_parser(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser("check", help="is this device ready? Python, L4T, TensorRT, CUDA, sudo rights, "
                                              "tegrastats, power modes, memory, swap, disk, CMA",
                                description="Each check ok, warn, fail (with its fix) or skip; exit 1 when one "
                                            "fails. Nothing is built or written.")
    check.add_argument("--backend", choices=BACKENDS, default="tensorrt")
    check.add_argument("--cuda", choices=BINDINGS, help="check only this CUDA binding")
    check.add_argument("--power-mode", help="the power mode the run will ask for (checks it and the sudo rights)")
    check.add_argument("--lock-clocks", action="store_true", help="the run will lock the clocks (checks sudo rights)")
    check.add_argument("--nvpmodel-conf", type=Path, help="the nvpmodel configuration (default: the one nvpmodel "
                                                          "reads, else /etc/nvpmodel.conf)")
    check.add_argument("--energy", choices=ENERGY, default="auto", help="off: tegrastats is not needed")
    check.add_argument("--min-memory-mib", type=_positive_int, default=MIN_AVAILABLE_MIB,
                       help="memory that must be available (default: the 2 GiB builder workspace)")
    check.add_argument("--min-disk-mib", type=_positive_int, default=MIN_DISK_MIB,
                       help="free disk in the current folder")
    check.add_argument("--json", action="store_true", help="the report as JSON on stdout")


def check_main(args: argparse.Namespace) -> int:
    import json

    options = CheckOptions(backend=args.backend, cuda=args.cuda, power_mode=args.power_mode,
                           lock_clocks=args.lock_clocks, nvpmodel_conf=args.nvpmodel_conf, energy=args.energy,
                           min_available_mib=args.min_memory_mib, min_disk_mib=args.min_disk_mib)
    result = report(run_checks(options))
    print(json.dumps(result, indent=1) if args.json else table(result["checks"]))
    return 0 if result["ok"] else 1


def default_bundle() -> Path:
    """The bundle this package was copied into, else the current folder."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / MANIFEST).is_file() else Path.cwd()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        return check_main(args)
    try:
        options = RunOptions(
            bundle=args.bundle or default_bundle(), out=args.out, backend=args.backend, warmup=args.warmup,
            warmup_s=args.warmup_s,
            iterations=args.iterations, duration_s=args.duration_s, cuda_graph=args.cuda_graph, idle_s=args.idle_s,
            energy=args.energy, power_mode=args.power_mode, lock_clocks=args.lock_clocks,
            variants=tuple(args.variants), cache_dir=args.cache_dir, cuda=args.cuda, threads=args.threads,
            layer_runs=args.layer_runs, force=args.force, nvpmodel_conf=args.nvpmodel_conf, builder=args.builder,
            trtexec=args.trtexec)
    except JetsonError as e:
        print(f"jetson run: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
