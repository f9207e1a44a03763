"""``edge check``: what TensorRT's ONNX parser will accept, checked on the graph here, without TensorRT."""

from __future__ import annotations

from edge.cli.common import add_command, emit
from edge.cli.options import ExistingFile

EXAMPLES = """  edge check runs/ref.onnx                                  # TensorRT 10.3 (JetPack 6)
  edge check runs/ref.fp16.onnx runs/ref.int8.onnx --trt 10.16 --json   # JetPack 7.2"""


def register(subparsers) -> None:
    from edge.check.tensorrt_rules import RULES
    from edge.check.tensorrt_support import DEFAULT_TENSORRT, PARSERS

    parser = add_command(
        subparsers, "check", "check ONNX graphs against what TensorRT's ONNX parser accepts (no TensorRT needed)",
        "Rules (edge/check/tensorrt_rules.py): " + ", ".join(RULES) + ".\n"
        "Operators, opsets and input types come from onnx-tensorrt's support table of the TensorRT\n"
        "release asked for; Q/DQ must be symmetric int8 with scales > 0 in their stored type, per\n"
        "tensor or per output channel of a weight (axis written); Gemm alpha = beta = 1. Each attention\n"
        "block is reported (information) as fusable into TensorRT's attention kernel or not, and why.\n"
        "Exit status 0 when every graph passes, 2 when one breaks a rule (the findings name the rule,\n"
        "the node and the fix).", EXAMPLES)
    parser.add_argument("graphs", nargs="+", metavar="GRAPH", type=ExistingFile(), help="ONNX files")
    parser.add_argument("--trt", choices=sorted(PARSERS), default=DEFAULT_TENSORRT,
                        help="the TensorRT release whose ONNX parser is checked against (10.3: JetPack 6.1/6.2, "
                             "10.16: JetPack 7.2)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from edge.check.tensorrt_rules import check_files

    result = check_files(args.graphs, args.trt)
    lines = []
    for report in result["graphs"]:
        verdict = "passes" if report["passed"] else f"BREAKS {report['errors']} rule(s)"
        lines.append(f"{report['graph']}: {verdict} for TensorRT {args.trt}")
        lines += [f"  {'error' if f['severity'] == 'error' else 'note '} [{f['rule']}] {f['node']}: {f['what']}"
                  + (f" (fix: {f['fix']})" if f["severity"] == "error" else "") for f in report["findings"]]
    emit(result, args.json, "\n".join(lines))
    if not result["passed"]:
        failing = [r["graph"] for r in result["graphs"] if not r["passed"]]
        print(f"edge check: {', '.join(failing)} break(s) the rules of TensorRT {args.trt}'s ONNX parser",
              file=sys.stderr)
        return 2
    return 0
