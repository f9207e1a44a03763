"""``edge analyze``: block-by-block similarity (CKA, cosine, Block Redundancy) with heatmaps."""

from __future__ import annotations

from edge.cli.common import (
    add_calibration_options,
    add_command,
    add_device_option,
    add_field,
    add_model_options,
    add_number,
    add_out_folder,
    emit,
)

EXAMPLES = """  edge analyze fmnist-deit-tiny --data fmnist --samples 500 --out runs/analysis
  edge analyze timm:deit_small_patch16_224 --data fmnist-mini --samples 200 --out runs/deit-s --json
  edge analyze runs/ref-linear-9-10 --data fmnist --out runs/analysis-compressed
  edge analyze fmnist-deit-tiny --data fmnist --samples 500 --attention --out runs/analysis   # + Sigma scores
  edge analyze fmnist-deit-tiny --data fmnist --samples 500 --entropy --nose 4 --out runs/analysis  # + NOSE"""


def register(subparsers) -> None:
    from edge.analysis.analyze import AnalysisConfig

    parser = add_command(subparsers, "analyze", "similarity of every pair of blocks on calibration images",
                         "Streams float64 statistics over N seeded, class-balanced samples of the training split\n"
                         "and writes OUT/analysis.json (cka, cosine, mse, block_redundancy; all tokens and [CLS])\n"
                         "and heatmaps OUT/*.png. Index 0 ('emb') is the embedding output, block -1 in plans.\n"
                         "--attention also writes OUT/attention.json: per head the summed pointwise std of its\n"
                         "attention map (Sigma_h, Welford, float64) and per block their mean (Sigma_b), the\n"
                         "scores `edge compress --plan dwconv:auto=K` selects by, and OUT/attention_std.png.\n"
                         "--entropy also writes OUT/entropy.json: per block the entropy H = sum_j log std_j (float64,\n"
                         "population std over images x patch tokens) of the attention sub-layer output\n"
                         "ls1(attn(norm1(x))) and of the MLP sub-layer output ls2(mlp(norm2(x))), before the residual\n"
                         "add, and of the pre-logits features; OUT/entropy.png plots them per block.\n"
                         "--nose K also writes OUT/nose.json and OUT/nose.png: the greedy NOSE search of the K\n"
                         "attention layers whose removal (residual only) changes the pre-logits entropy least\n"
                         "(transfer entropy, |TE|), every candidate's TE at every step; `attnrm:auto=K` selects by it.",
                         EXAMPLES)
    add_model_options(parser)
    add_calibration_options(parser, AnalysisConfig)
    add_field(parser, "--batch-size", AnalysisConfig, help="images per forward pass")
    add_device_option(parser, "the passes over the images")
    parser.add_argument("--attention", action="store_true",
                        help="also score every head's attention-map variation (Sigma_h, Sigma_b)")
    parser.add_argument("--entropy", action="store_true",
                        help="also the entropy of every attention and MLP sub-layer output (the paper's Fig. 1(a))")
    parser.add_argument("--entropy-tokens", choices=("patch", "all"), default="patch",
                        help="rows of the entropy: patch tokens only (default) or with the class/register tokens")
    add_number(parser, "--nose", int, metavar="K", minimum=1, maximum=10_000,
               help="also the NOSE trajectory selecting K attention layers (transfer entropy per step)")
    add_out_folder(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.analysis.analyze import analyze
    from edge.compress.load import load_model
    from edge.data import InputSpec, calibration_set
    from edge.models import data_config, data_for
    from edge.runtime import resolve_device, set_threads

    set_threads(args.threads)
    args.device = resolve_device(args.device)
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    if args.nose is not None:
        from edge.analysis.nose import nose_candidates

        nose_candidates(model, args.nose)   # refuse an impossible K before anything is written
    calibration = calibration_set(data_for(args.data, args.model), args.samples, args.seed)
    result = analyze(model, args.model, calibration, InputSpec.from_data_config(data_config(model)), args.out,
                     batch_size=args.batch_size, device=args.device)
    attention_line = ""
    if args.attention:
        from edge.analysis.attention import analyze_attention

        result["attention"] = analyze_attention(model, args.model, calibration,
                                                InputSpec.from_data_config(data_config(model)), args.out,
                                                batch_size=args.batch_size, device=args.device)
        sigma = result["attention"]["sigma_block"]
        order = sorted(range(len(sigma)), key=sigma.__getitem__)
        attention_line = (f"\nblocks by Sigma_b, lowest first (dwconv candidates): "
                          f"{' '.join(str(result['attention']['blocks'][i]) for i in order)}"
                          f"\nwrote {args.out}/attention.json and attention_std.png")
    entropy_line = _entropy(args, model, calibration, result)
    br = result["block_redundancy"]
    most = max(range(len(br)), key=br.__getitem__)
    emit(result, args.json, f"analyzed {result['num_blocks']} blocks of {args.model} on {result['samples']} samples "
                            f"in {result['seconds']:.1f} s\nmost redundant block (highest BR): {most}\n"
                            f"wrote {args.out}/analysis.json and {len(result['pictures'])} heatmaps"
                            f"{attention_line}{entropy_line}")
    return 0


def _entropy(args, model, calibration, result: dict) -> str:
    """Run --entropy / --nose into ``result``; the human lines they add."""
    from edge.analysis.entropy import analyze_entropy
    from edge.analysis.nose import analyze_nose
    from edge.data import InputSpec
    from edge.models import data_config

    spec = InputSpec.from_data_config(data_config(model))
    lines = ""
    if args.entropy:
        entropy = result["entropy"] = analyze_entropy(model, args.model, calibration, spec, args.out,
                                                      tokens=args.entropy_tokens, batch_size=args.batch_size,
                                                      device=args.device)
        table = "  ".join(f"{row['blocks'][0]}:{_number(row['attention'])}/{_number(row['mlp'])}"
                          for row in entropy["blocks"])
        lines += (f"\nentropy attention/MLP per block ({args.entropy_tokens} tokens): {table}"
                  f"\nwrote {args.out}/entropy.json and entropy.png")
    if args.nose is not None:
        nose = result["nose"] = analyze_nose(model, args.model, calibration, spec, args.out, args.nose,
                                             batch_size=args.batch_size, device=args.device)
        lines += (f"\nNOSE chose {nose['chosen']} (greedy order, min |TE| to the pre-logits features) in "
                  f"{nose['seconds']:.1f} s\nwrote {args.out}/nose.json and nose.png")
    return lines


def _number(value) -> str:
    return "-inf" if value is None else f"{value:.1f}"
