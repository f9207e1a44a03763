"""``edge verify A B``: do two models or graphs compute the same function (within tolerance)?"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.cli.common import (
    add_command,
    add_data_option,
    add_field,
    add_img_size_option,
    add_number,
    add_seed_option,
    add_threads_option,
    add_weights_option,
    emit,
)
from edge.cli.options import Model
from edge.config import MAX_BATCH

if TYPE_CHECKING:
    from edge.check.verify import Side
    from edge.models import ImgSize
    from edge.precision.calibration import InputOptions

EXAMPLES = """  edge verify fmnist-deit-tiny runs/ref.onnx                 # PyTorch against its export
  edge verify runs/ref.onnx runs/ref.clean.onnx --json        # raw export against the cleaned graph
  edge verify runs/linear-9-10 runs/linear-9-10.clean.onnx --data fmnist --batch 32
  edge verify fmnist-deit-tiny runs/linear-9-10 --max-abs 2 --rel-l2 0.3   # how far a compression moved it
  edge verify their.onnx their.clean.onnx --input-size 1x28x28 --mean 0.286 --std 0.353   # another exporter's"""


def register(subparsers) -> None:
    from edge.check.compare import Tolerance
    from edge.cli.quantize import add_input_options

    parser = add_command(subparsers, "verify", "compare the outputs of two models or ONNX graphs",
                         "Each side is a model name, a compressed artifact or an .onnx file (run with ONNX\n"
                         "Runtime). Both run on seeded random inputs and on real test images; the result gives the\n"
                         "max absolute and relative L2 error of B against A and the top-1 agreement. Exit status 0\n"
                         "when every comparison is within tolerance, 1 when not, 2 for bad input. Two graphs from\n"
                         "another exporter (torch.onnx, Hugging Face), which record no preprocessing, need\n"
                         "--input-size, --mean and --std; given, they apply to every .onnx side.", EXAMPLES)
    parser.add_argument("a", type=Model(), help="the reference: model, artifact or .onnx file")
    parser.add_argument("b", type=Model(), help="the candidate: model, artifact or .onnx file")
    add_weights_option(parser, help="weights for a model named by A (and B when B is a model too)")
    add_img_size_option(parser)
    add_data_option(parser, None, "real images (test split): a folder, fmnist, fmnist-mini; default: a bundled "
                    "model's check set (fmnist-mini); else random inputs only")
    add_number(parser, "--batch", int, default=8, help="images per comparison", minimum=1, maximum=MAX_BATCH)
    add_seed_option(parser, help="seed of the random inputs")
    add_field(parser, "--max-abs", Tolerance, help="tolerance: max absolute error")
    add_field(parser, "--rel-l2", Tolerance, help="tolerance: relative L2 error")
    add_threads_option(parser)
    add_input_options(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from edge.check.compare import Tolerance
    from edge.check.verify import verify_pair
    from edge.cli.eval import onnx_input_spec
    from edge.cli.quantize import input_options
    from edge.data import load_dataset
    from edge.errors import EdgeError
    from edge.runtime import set_threads

    options = input_options(args)
    if options.given() and not any(s.endswith(".onnx") for s in (args.a, args.b)):
        raise EdgeError(f"--input-size, --mean and --std for {args.a} and {args.b}", expected="an .onnx side (the "
                        "preprocessing of a graph from another exporter)", found="two models, whose preprocessing "
                        "is their own timm data config", fix="leave --input-size, --mean and --std out")
    set_threads(args.threads)
    a = load_side(args.a, args.weights, args.img_size, args.threads, options)
    b = load_side(args.b, args.weights, args.img_size, args.threads, options)
    if a.data_config is None and b.data_config is None:   # two graphs that record nothing and no options:
        onnx_input_spec(args.a, options)                   # raises, naming the options the graphs need
    from edge.models import bundled_source, data_for

    source = next((side for side in (args.a, args.b) if bundled_source(side)), args.a)   # a bundled model's images
    data = load_dataset(data_for(args.data, source, check=True), "test") \
        if args.data or bundled_source(source) else None
    if data is None:
        print(f"edge verify: note: no --data for {args.a}: compared on random inputs only (pass --data DIR to add "
              "real images)", file=sys.stderr)
    result = verify_pair(a, b, real=data, batch=args.batch, seed=args.seed,
                         tolerance=Tolerance(args.max_abs, args.rel_l2), classes=data.num_classes if data else None,
                         data=data.name if data else "random inputs")
    if "note" in result:
        print(f"edge verify: note: {result['note']}", file=sys.stderr)
    lines = [f"{args.b} ({b.kind}) against {args.a} ({a.kind}), batch {args.batch}:"]
    for c in result["comparisons"]:
        agree = result["top1_agreement"].get(c["inputs"])
        lines.append(f"  {c['inputs']:<7} max abs {c['max_abs']:.2e}  rel L2 {c['rel_l2']:.2e}"
                     + (f"  top-1 agreement {agree:.0%}" if agree is not None else "")
                     + ("  ok" if c["passed"] else "  BEYOND TOLERANCE"))
    verdict = "PASS" if result["passed"] else "FAIL"
    lines.append(f"{verdict} (max abs <= {args.max_abs:g}, rel L2 <= {args.rel_l2:g})")
    emit(result, args.json, "\n".join(lines))
    if not result["passed"]:
        print(f"edge verify: {args.b} differs from {args.a} beyond tolerance", file=sys.stderr)
        return 1
    return 0


def load_side(spec: str, weights: str | None, img_size: ImgSize | None, threads: int | None,
              options: InputOptions) -> Side:
    """One side of ``edge verify``: an .onnx file run with ONNX Runtime (its input from ``options`` where given,
    checked against the graph, else what it records), or a model (name or artifact) loaded here."""
    from edge.check.verify import onnx_side, torch_side

    if spec.endswith(".onnx"):
        from dataclasses import replace

        from edge.cli.eval import onnx_input_spec

        side = onnx_side(spec, threads)   # first: a file that is no ONNX model is said as such
        return replace(side, data_config=onnx_input_spec(spec, options).as_dict()) if options.given() else side
    from edge.compress.load import load_model

    return torch_side(spec, load_model(spec, weights=weights, img_size=img_size))
