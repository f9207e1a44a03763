"""``edge clean``: run the graph cleaning passes to a fixed point and verify the result."""

from __future__ import annotations

from edge.cli.common import add_command, emit

EXAMPLES = """  edge clean runs/ref.onnx --out runs/ref.clean.onnx
  edge clean runs/linear-9-10.onnx --out runs/linear-9-10.clean.onnx --json"""


def register(subparsers) -> None:
    parser = add_command(subparsers, "clean", "clean an ONNX graph with onnx-graphsurgeon passes, then verify it",
                         "Passes (one per file): fold-constants, remove-noops, cancel-transposes, linear-to-gemm,\n"
                         "merge-reshapes, fold-linear-chains, fold-scalar-scales, fold-channel-scales; run to a\n"
                         "fixed point, each change checked in ONNX Runtime against the input graph. The output\n"
                         "is written only if onnx.checker passes and its outputs match the input graph\n"
                         "(max abs <= 1e-4, relative L2 <= 1e-5).", EXAMPLES)
    parser.add_argument("model", help="an ONNX file (e.g. from edge export)")
    parser.add_argument("--out", required=True, help="the cleaned ONNX file")
    parser.add_argument("--skip-pass", action="append", default=[], help="leave out a pass (repeatable)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from edge.errors import EdgeError
    from edge.graph.clean import clean_file
    from edge.graph.passes import DEFAULT_PASSES

    names = {p.name for p in DEFAULT_PASSES}
    unknown = [s for s in args.skip_pass if s not in names]
    if unknown:
        raise EdgeError(f"unknown pass {unknown[0]!r}", expected=f"one of {', '.join(sorted(names))}")
    passes = tuple(p for p in DEFAULT_PASSES if p.name not in args.skip_pass)
    result = clean_file(Path(args.model), Path(args.out), passes)
    rep = result["report"]
    lines = [f"{rep['nodes_before']} -> {rep['nodes_after']} nodes in {rep['rounds']} rounds; wrote {args.out}"]
    lines += [f"  {name:<20} changed {s['changes']}x, removed {s['nodes_removed']} nodes" for name, s in
              rep["passes"].items()]
    lines += [f"  verified ({v['inputs']}): max abs {v['max_abs']:.1e}, rel L2 {v['rel_l2']:.1e}"
              for v in result["verification"]]
    emit(result, args.json, "\n".join(lines))
    return 0
