"""``edge analyze``: block-by-block similarity (CKA, cosine, Block Redundancy) with heatmaps."""

from __future__ import annotations

from edge.cli.common import add_calibration_options, add_command, add_field, add_model_options, add_out_folder, emit

EXAMPLES = """  edge analyze fmnist-deit-tiny --data fmnist --samples 500 --out runs/analysis
  edge analyze timm:deit_small_patch16_224 --data fmnist-mini --samples 200 --out runs/deit-s --json
  edge analyze runs/ref-linear-9-10 --data fmnist --out runs/analysis-compressed
  edge analyze fmnist-deit-tiny --data fmnist --samples 500 --attention --out runs/analysis   # + Sigma scores"""


def register(subparsers) -> None:
    from edge.analysis.analyze import AnalysisConfig

    parser = add_command(subparsers, "analyze", "similarity of every pair of blocks on calibration images",
                         "Streams float64 statistics over N seeded, class-balanced samples of the training split\n"
                         "and writes OUT/analysis.json (cka, cosine, mse, block_redundancy; all tokens and [CLS])\n"
                         "and heatmaps OUT/*.png. Index 0 ('emb') is the embedding output, block -1 in plans.\n"
                         "--attention also writes OUT/attention.json: per head the summed pointwise std of its\n"
                         "attention map (Sigma_h, Welford, float64) and per block their mean (Sigma_b), the\n"
                         "scores `edge compress --plan dwconv:auto=K` selects by, and OUT/attention_std.png.",
                         EXAMPLES)
    add_model_options(parser)
    add_calibration_options(parser, AnalysisConfig)
    add_field(parser, "--batch-size", AnalysisConfig, help="images per forward pass")
    parser.add_argument("--attention", action="store_true",
                        help="also score every head's attention-map variation (Sigma_h, Sigma_b)")
    add_out_folder(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.analysis.analyze import analyze
    from edge.compress.load import load_model
    from edge.data import InputSpec, calibration_set
    from edge.models import data_config
    from edge.runtime import set_threads

    set_threads(args.threads)
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    calibration = calibration_set(args.data, args.samples, args.seed)
    result = analyze(model, args.model, calibration, InputSpec.from_data_config(data_config(model)), args.out,
                     batch_size=args.batch_size)
    attention_line = ""
    if args.attention:
        from edge.analysis.attention import analyze_attention

        result["attention"] = analyze_attention(model, args.model, calibration,
                                                InputSpec.from_data_config(data_config(model)), args.out,
                                                batch_size=args.batch_size)
        sigma = result["attention"]["sigma_block"]
        order = sorted(range(len(sigma)), key=sigma.__getitem__)
        attention_line = (f"\nblocks by Sigma_b, lowest first (dwconv candidates): "
                          f"{' '.join(str(result['attention']['blocks'][i]) for i in order)}"
                          f"\nwrote {args.out}/attention.json and attention_std.png")
    br = result["block_redundancy"]
    most = max(range(len(br)), key=br.__getitem__)
    emit(result, args.json, f"analyzed {result['num_blocks']} blocks of {args.model} on {result['samples']} samples "
                            f"in {result['seconds']:.1f} s\nmost redundant block (highest BR): {most}\n"
                            f"wrote {args.out}/analysis.json and {len(result['pictures'])} heatmaps{attention_line}")
    return 0
