"""``edge export``: a model or compressed artifact as a verified ONNX graph."""

from __future__ import annotations

from edge.cli.common import add_command, add_data_option, add_field, add_model_options, add_out_file, emit

EXAMPLES = """  edge export fmnist-deit-tiny --out runs/ref.onnx
  edge export runs/linear-9-10 --out runs/linear-9-10.onnx --json
  edge export timm:deit_small_patch16_224 --batch 8 --out deit_s_b8.onnx
  edge export fmnist-deit-tiny --dynamic-batch --out runs/ref.dyn.onnx"""


def register(subparsers) -> None:
    from edge.export import ExportConfig

    parser = add_command(subparsers, "export", "export a model (or compressed artifact) to ONNX, checked and verified",
                         "Opset 17+, fused attention off, input 'input', output 'logits'; metadata_props carry the\n"
                         "source model, plan, edge version, input size and normalisation. The graph is checked with\n"
                         "onnx.checker and compared with PyTorch in ONNX Runtime (random and real images) before it\n"
                         "is written; nothing is written when a check fails.", EXAMPLES)
    add_model_options(parser)
    add_out_file(parser, "output .onnx file", ".onnx")
    add_field(parser, "--batch", ExportConfig, help="static batch size")
    parser.add_argument("--dynamic-batch", action="store_true", help="symbolic batch dimension")
    add_field(parser, "--opset", ExportConfig, help="ONNX opset")
    add_data_option(parser, None, "real images for the verification: the first 8 of the test split (a folder, "
                    "fmnist, fmnist-mini); default: a bundled model's check set (fmnist-mini); any other model "
                    "without it is verified on random inputs only, and says so")
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip the ONNX Runtime comparison")
    parser.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from edge.compress.load import load_model
    from edge.data import InputSpec, load_dataset
    from edge.export import REAL_IMAGES, ExportConfig, export
    from edge.models import bundled_source, data_config, data_for
    from edge.progress import log

    plan = None
    if Path(args.model).exists():
        from edge.compress.artifact import is_artifact, read_manifest

        if is_artifact(args.model):
            plan = read_manifest(args.model)["plan"]
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    config = data_config(model)
    real = None
    if args.verify and (args.data or bundled_source(args.model)):
        real = load_dataset(data_for(args.data, args.model, check=True), "test").inputs(
            InputSpec.from_data_config(config), REAL_IMAGES)
    elif args.verify:
        log(f"note: no --data for {args.model}: verified on random inputs only (pass --data DIR to add real images)")
    report = export(model, args.out, source=args.model, plan=plan, data_config=config,
                    config=ExportConfig(args.batch, args.dynamic_batch, args.opset, args.verify), real_inputs=real)
    checks = ", ".join(f"{v['inputs']}: max abs {v['max_abs']:.1e}, rel L2 {v['rel_l2']:.1e}"
                       for v in report.get("verification", []))
    human = (f"wrote {args.out} ({report['nodes']} nodes, {report['bytes'] / 1e6:.1f} MB, opset {report['opset']}, "
             f"batch {report['batch']})" + (f"\nverified: {checks}" if checks else ""))
    emit(report, args.json, human)
    return 0
