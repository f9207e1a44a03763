"""``edge clean``: run the graph cleaning passes to a fixed point and verify the result."""

from __future__ import annotations

from edge.cli.common import add_command, add_out_file, emit
from edge.cli.options import ExistingFile

EXAMPLES = """  edge clean runs/ref.onnx --out runs/ref.clean.onnx
  edge clean runs/linear-9-10.onnx --out runs/linear-9-10.clean.onnx --json
  edge clean runs/ref.onnx --out runs/ref.clean.onnx --skip-pass linear-to-gemm
  edge clean runs/dw3.onnx --out runs/dw3.plugins.onnx --plugins
  edge clean hf_vit.onnx --input-size 3x224x224 --out runs/hf_vit.clean.onnx   # pixel_values all dynamic"""


def register(subparsers) -> None:
    from edge.cli.options import Text
    from edge.graph.input_shape import parse_input_size
    from edge.graph.passes import PASSES, PLUGIN_PASSES

    listing = "\n".join(f"  {p.name:<20} {p.summary}" for p in PASSES)
    plugin_listing = "\n".join(f"  {p.name:<20} {p.summary}" for p in PLUGIN_PASSES)
    parser = add_command(subparsers, "clean", "clean an ONNX graph with onnx-graphsurgeon passes, then verify it",
                         "Passes (one per file in edge/graph/passes/), in the order each round runs them:\n"
                         f"{listing}\n"
                         "Rounds run to a fixed point, each change checked in ONNX Runtime against the input\n"
                         "graph, on all its outputs. The output is written only if onnx.checker passes and its\n"
                         "outputs match the input graph's (max abs <= 1e-4, relative L2 <= 1e-5).\n"
                         "A graph below opset 17 is first upgraded to 17 with onnx.version_converter, checked\n"
                         "the same way (the output says so). Inputs: random values of the declared shapes\n"
                         "(dynamic dimensions: 2), and the sample inputs stored next to the model as\n"
                         "test_data_set_N/input_K.pb (the ONNX model zoo layout); non-float inputs need those.\n"
                         "--input-size first declares the image input's C, H and W (Hugging Face exporters leave\n"
                         "them dynamic, and a ViT refuses 2 x 2 random images); the batch stays as it is.\n"
                         "With --plugins (off by default: the graph then needs edge's TensorRT plugins, plugins/;\n"
                         "ONNX Runtime runs them here as their numpy references), after those in each round:\n"
                         f"{plugin_listing}",
                         EXAMPLES)
    parser.add_argument("model", type=ExistingFile(),
                        help="an ONNX file (from edge export, torch.onnx, a Hugging Face exporter, the ONNX model zoo)")
    add_out_file(parser, "the cleaned ONNX file", ".onnx")
    parser.add_argument("--input-size", type=Text(parse_input_size), metavar="CxHxW",
                        help="declare the image input's C, H and W (CxHxW, or HxW with a static C) where they are "
                             "dynamic; default: the shape as declared")
    parser.add_argument("--skip-pass", action="append", default=[], choices=PASSES.names(), metavar="PASS",
                        help="leave out a pass (repeatable; one of the passes listed above)")
    parser.add_argument("--plugins", action="store_true",
                        help="also replace patterns by edge's TensorRT plugin ops (each dwconv mixer -> one "
                             "TokenDepthwiseConv node); patterns a plugin does not cover are left with a note")
    parser.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from edge.graph.clean import clean_file
    from edge.graph.passes import select_passes

    result = clean_file(Path(args.model), Path(args.out), select_passes(args.skip_pass, plugins=args.plugins),
                        input_size=args.input_size)
    rep = result["report"]
    lines = [f"{rep['nodes_before']} -> {rep['nodes_after']} nodes in {rep['rounds']} rounds; wrote {args.out}"]
    if rep["upgraded"]:
        up = rep["upgraded"]
        lines.insert(0, f"note: upgraded from opset {up['from']} to {up['to']} with {up['by']} first "
                        f"(checked in ONNX Runtime against {up['checked']}, like every pass)")
    lines += [f"  {name:<20} changed {s['changes']}x, removed {s['nodes_removed']} nodes" for name, s in
              rep["passes"].items()]
    lines += [f"  verified ({v['inputs']}): max abs {v['max_abs']:.1e}, rel L2 {v['rel_l2']:.1e}"
              for v in result["verification"]]
    lines += [f"note: {note}" for note in rep["notes"]]
    emit(result, args.json, "\n".join(lines))
    return 0
