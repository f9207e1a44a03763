"""``python3 -m jetson run``: benchmark a bundle on this device (run from inside the bundle folder, or
pass ``--bundle``). The formats of its results and its exit codes: jetson.runner."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jetson.bundle import MANIFEST
from jetson.cuda import BINDINGS
from jetson.engine import BUILDERS
from jetson.errors import JetsonError
from jetson.runner import BACKENDS, ENERGY, EXIT_USAGE, RunOptions, run

EXAMPLES = """examples (in the bundle folder):
  python3 -m jetson run                                  # TensorRT, the bundle's protocol, results/ here
  python3 -m jetson run --backend ort --iterations 50    # ONNX Runtime where TensorRT is absent
  sudo python3 -m jetson run --power-mode 15W --lock-clocks --duration 30
  python3 -m jetson run --variant baseline.fp16 --out /tmp/results --force
  python3 -m jetson run --builder trtexec                # engines built by JetPack's trtexec"""


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
                        help="TensorRT: who builds the engines: python (TensorRT's Python API, default) or trtexec "
                             "(its output in results/logs/ID.trtexec.log); each has engines of its own in the cache")
    runner.add_argument("--trtexec", metavar="PATH", help="the trtexec to build with (default: trtexec on PATH, "
                                                          "else /usr/src/tensorrt/bin/trtexec)")
    runner.add_argument("--warmup", type=_positive_int, help="untimed inferences first (default: the bundle's)")
    runner.add_argument("--iterations", type=_positive_int, help="timed inferences (at least)")
    runner.add_argument("--duration", dest="duration_s", type=float, help="time for at least this many seconds")
    runner.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", default=None,
                        help="TensorRT: enqueue each inference instead of replaying a CUDA graph")
    runner.add_argument("--idle", dest="idle_s", type=float, help="seconds of idle power sampled before the timing")
    runner.add_argument("--energy", choices=ENERGY, default="auto",
                        help="sample tegrastats for energy per inference (auto: when tegrastats is on PATH)")
    runner.add_argument("--power-mode", help="nvpmodel mode by name (e.g. 15W, MAXN_SUPER) for the run, put back after")
    runner.add_argument("--lock-clocks", action="store_true", help="jetson_clocks for the run, restored after")
    runner.add_argument("--nvpmodel-conf", type=Path, default=RunOptions.nvpmodel_conf,
                        help="the nvpmodel configuration that maps mode names to ids")
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
    return parser


def default_bundle() -> Path:
    """The bundle this package was copied into, else the current folder."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / MANIFEST).is_file() else Path.cwd()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = RunOptions(
            bundle=args.bundle or default_bundle(), out=args.out, backend=args.backend, warmup=args.warmup,
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
