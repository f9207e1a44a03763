"""``edge quantize``: the fp16 or int8 (Q/DQ) variant of a float32 ONNX graph, for strongly typed TensorRT."""

from __future__ import annotations

from edge.cli.common import add_command, add_data_option, add_field, add_out_file, emit
from edge.cli.options import ExistingFile, OutputFolder, Text

EXAMPLES = """  edge quantize runs/ref.onnx --precision fp16 --out runs/ref.fp16.onnx
  edge quantize runs/ref.onnx --precision int8 --data fmnist --samples 500 --out runs/ref.int8.onnx
  edge quantize runs/ref.onnx --precision int8 --data fmnist --samples 500 --method entropy --out runs/ref.int8.onnx
  edge quantize runs/ref.onnx --precision fp16 --keep-fp32 Gelu --out runs/ref.fp16.onnx --json
  edge quantize runs/ref.onnx --precision fp16 --data fmnist-mini --samples 64 --range-margin 4 --out runs/r.onnx
  edge quantize their.onnx --precision int8 --data fmnist --input-size 1x28x28 --mean 0.286 --std 0.353 --out q.onnx
  edge quantize runs/ref.onnx --precision int8 --placement skip --gate-images 100 --accept-loss --out runs/ref.int8.onnx"""


def register(subparsers) -> None:
    from calib.placement import PLACEMENTS
    from calib.qdq import METHODS
    from edge.precision.fp16 import Fp16Config
    from edge.precision.fp16_ranges import RangeCheck
    from edge.precision.gate import THRESHOLDS, GateConfig
    from edge.precision.int8 import Int8Config

    parser = add_command(
        subparsers, "quantize", "convert a float32 ONNX graph to fp16, or to int8 with Q/DQ nodes (for TensorRT)",
        "fp16: float16 weights and activations; LayerNormalization, reductions and the head stay float32\n"
        "(Softmax too with --softmax fp32), with Casts only where the precision changes; inputs and\n"
        "outputs stay float32. Range check: the float32 graph runs on the --data images (--samples,\n"
        "--seed) and every node whose output would pass 65504 / margin (a square, e.g. a norm's\n"
        "variance: 65504 / margin^2), and every reader of such a tensor, stays float32 too; the nodes\n"
        "and reasons are printed (--json: range_check.kept). A graph without edge export's metadata\n"
        "(input size, mean, std) gets no range check, and the output says so, unless --input-size,\n"
        "--mean and --std give it (a graph from another exporter: the written graph records them).\n"
        "int8: ONNX Runtime static quantization configured for TensorRT: symmetric int8 (zero point 0),\n"
        "per-channel weights (per output channel), per-tensor activations, Q/DQ where --placement says\n"
        "(default: the inputs of the weight GEMMs only, after SmoothQuant); calibrated on seeded,\n"
        "class-balanced training images\n"
        "(ranges cached under ~/.cache/edge/calibration or $EDGE_CACHE_DIR). What is not quantized is\n"
        "float16 with the fp16 islands above (TensorRT INT8+FP16), or float32 with --unquantized fp32.\n"
        "int8 needs the preprocessing: recorded by edge export, or --mean and --std (--input-size where the\n"
        "graph's input shape is not static).\n"
        "The result is checked (onnx.checker, ONNX Runtime on real images; seeded random inputs for a graph\n"
        "without preprocessing) before it is written.\n"
        "Accuracy gate: the graph and its float32 source run on held-out test images of fmnist-mini\n"
        "(--gate-images); per output it prints top-1 agreement with float32, max abs, mean abs and\n"
        "relative L2 error (--json: check) and records them in the graph (edge bundle carries them to the\n"
        "device). Thresholds: " + "; ".join(f"{p} top-1 agreement >= {t.min_top1_agreement:g}, rel L2 <= "
                                            f"{t.max_rel_l2:g}" for p, t in THRESHOLDS.items())
        + ".\nBelow them it writes nothing and exits 2, naming the nodes that add most error, unless\n"
          "--accept-loss.", EXAMPLES)
    parser.add_argument("model", type=ExistingFile(), help="a float32 ONNX graph (from edge export / edge clean)")
    parser.add_argument("--precision", required=True, choices=["fp16", "int8"], help="the precision to convert to")
    add_out_file(parser, "the output .onnx file", ".onnx")
    parser.add_argument("--keep-fp32", action="append", default=[], metavar="OP", type=Text(),
                        help="fp16: also keep this op type in float32 (repeatable)")
    parser.add_argument("--fp16-head", action="store_true", help="fp16: convert the head too (default: float32)")
    parser.add_argument("--softmax", default=_short(Fp16Config.softmax), choices=["fp16", "fp32"],
                        help="fp16 and the float16 part of int8: Softmax's precision")
    add_data_option(parser, None, "int8 and the fp16 range check: calibration images, the training split of a "
                                  "folder (train/ and val/), or fmnist / fmnist-mini; default: a bundled model's "
                                  "data set; any other graph needs it")
    add_field(parser, "--samples", Int8Config, help="int8 and the fp16 range check: calibration samples "
                                                    "(class-balanced)")
    add_field(parser, "--seed", Int8Config, help="int8 and the fp16 range check: seed of the calibration sample")
    add_field(parser, "--range-margin", RangeCheck, "margin",
              help="fp16: keep a node float32 when its largest value times this passes 65504")
    parser.add_argument("--no-range-check", dest="range_check", action="store_false",
                        help="fp16: keep float32 by op type and head only, without running the graph")
    parser.add_argument("--method", default=Int8Config.method, choices=METHODS, help="int8: calibration method")
    add_field(parser, "--percentile", Int8Config, help="int8 percentile method: share kept, in percent")
    parser.add_argument("--no-residual", dest="residual", action="store_false",
                        help="int8: leave residual Adds unquantized")
    parser.add_argument("--placement", default=Int8Config.placement, choices=PLACEMENTS,
                        help="int8, measured on the full Fashion-MNIST test split (docs/results/int8-placements.md): "
                             "linear-sq: SmoothQuant (alpha 0.5) folded into each LayerNorm and the qkv/fc1 weights, "
                             "then Q/DQ on the weight GEMMs only (-0.17 pt on the outlier model, -0.02 pt on the "
                             "reference); linear: the weight GEMMs only, residual stream, LayerNorm and attention "
                             "float16 (-1.55 pt on the outlier model); modelopt: also the residual Add's branch input, "
                             "the LayerNorm input and the attention MatMuls (NVIDIA ModelOpt's; 65.14 %% on the "
                             "outlier model); skip: each residual Add's skip input and the head (TensorRT's guide; "
                             "18.86 %% on the outlier model)")
    parser.add_argument("--unquantized", default=_short(Int8Config.float_precision), choices=["fp16", "fp32"],
                        help="int8: precision of everything not quantized")
    parser.add_argument("--exclude", action="append", default=[], metavar="NODE", type=Text(),
                        help="int8: leave this node unquantized (repeatable)")
    add_input_options(parser)
    parser.add_argument("--cache-dir", type=OutputFolder(), metavar="DIR",
                        help="int8: calibration cache folder (default: $EDGE_CACHE_DIR/calibration or "
                             "~/.cache/edge/calibration)")
    parser.add_argument("--no-cache", dest="cache", action="store_false", help="int8: always calibrate afresh")
    add_data_option(parser, None, "accuracy gate: the data set whose test split the graph is compared with float32 "
                                  "on; default: --data, else a bundled model's check set (fmnist-mini)",
                    flag="--gate-data")
    add_field(parser, "--gate-images", GateConfig, "images",
              help="accuracy gate: held-out test images (of --gate-data) the graph is compared with float32 on")
    parser.add_argument("--accept-loss", action="store_true",
                        help="write the graph even when it is below the accuracy gate (said on stderr, recorded "
                             "in the graph and in --json: check.accepted_loss)")
    parser.set_defaults(run=run)


def add_input_options(parser) -> None:
    """--input-size, --mean, --std: the preprocessing of a graph that does not record it (another exporter's)."""
    from edge.cli.options import Text
    from edge.graph.input_shape import parse_input_size
    from edge.precision import calibration as c

    parser.add_argument("--input-size", type=Text(parse_input_size), metavar="CxHxW", help=c.INPUT_SIZE_HELP)
    parser.add_argument("--mean", type=Text(lambda text: c.parse_channel_values(text, "--mean")), metavar="M[,M...]",
                        help=c.MEAN_HELP)
    parser.add_argument("--std", type=Text(lambda text: c.parse_channel_values(text, "--std")), metavar="S[,S...]",
                        help=c.STD_HELP)


def input_options(args):
    """The InputOptions of --input-size, --mean and --std."""
    from edge.precision.calibration import InputOptions

    return InputOptions(input_size=args.input_size, mean=args.mean, std=args.std)


def _short(precision: str) -> str:
    return {"float16": "fp16", "float32": "fp32"}[precision]


def run(args) -> int:
    import sys

    from edge.precision.fp16 import DEFAULT_BLOCK_LIST, Fp16Config
    from edge.precision.fp16_ranges import RangeCheck
    from edge.precision.gate import GateConfig
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file

    full = {"fp16": "float16", "fp32": "float32"}
    fp16 = Fp16Config(block_list=(*DEFAULT_BLOCK_LIST, *args.keep_fp32), keep_head_fp32=not args.fp16_head,
                      softmax=full[args.softmax])
    int8 = Int8Config(data=args.data, samples=args.samples, seed=args.seed, method=args.method,
                      percentile=args.percentile, quantize_residual=args.residual, exclude_nodes=tuple(args.exclude),
                      cache_dir=args.cache_dir, use_cache=args.cache, placement=args.placement,
                      float_precision=full[args.unquantized])
    ranges = RangeCheck(data=args.data, samples=args.samples, seed=args.seed, margin=args.range_margin) \
        if args.range_check else None
    result = quantize_file(args.model, args.out, args.precision, fp16=fp16, int8=int8, ranges=ranges,
                           input_options=input_options(args), check_data=args.gate_data or args.data,
                           gate=GateConfig(images=args.gate_images, accept_loss=args.accept_loss),
                           progress=lambda message: print(message, file=sys.stderr))
    check = result["check"]
    if args.precision == "fp16":
        detail = f"{result['nodes_fp16']} nodes fp16, {result['nodes_fp32']} fp32, {result['casts']} Casts"
        notes = range_lines(result["range_check"])
    else:
        calibration = result["calibration"]
        detail = (f"{result['quantize_nodes']} Q / {result['dequantize_nodes']} DQ ({args.placement} placement), "
                  f"{calibration['method']} on {calibration['samples']} samples"
                  + (" (cached ranges)" if calibration["cache_hit"] else "")
                  + f", the rest {result['float_precision']}")
        notes = scale_lines(result.get("float16_rest", {}).get("qdq_scales_fp32", []))
    if check["accepted_loss"]:
        print("\n".join(loss_lines(args.out, check)), file=sys.stderr)
    emit(result, args.json, f"wrote {args.out} ({detail})\n" + "\n".join(gate_lines(check))
                            + (f"\nnote: {check['note']}" if "note" in check else "")
                            + "".join(f"\n{line}" for line in notes))
    return 0


def gate_lines(check: dict) -> list[str]:
    """The accuracy gate's figures for people: the verdict, then one line per output."""
    from edge.precision.gate import node_line

    bounds = check["thresholds"]
    verdict = "passed" if check["passed"] else "FAILED (written anyway: --accept-loss)"
    on = (f"{check['images']} seeded random inputs (no preprocessing recorded: errors only)"
          if check.get("outputs") == "random inputs" else f"{check['images']} held-out images of {check['data']}")
    lines = [f"accuracy gate {verdict}: against float32 on {on} "
             f"(top-1 agreement >= {bounds['min_top1_agreement']:g}, rel L2 <= {bounds['max_rel_l2']:g})"]
    for name, f in check["per_output"].items():
        agreement = f"top-1 agreement {f['top1_agreement']:.3f}, " if "top1_agreement" in f else ""
        lines.append(f"  {name}: {agreement}max abs {f['max_abs']:.2e}, mean abs {f['mean_abs']:.2e}, "
                     f"rel L2 {f['rel_l2']:.2e}")
    lines += [f"  node {node_line(n)}" for n in check.get("nodes", [])]
    return lines


def loss_lines(out, check: dict) -> list[str]:
    """What --accept-loss let through, for stderr."""
    return [f"WARNING: {out} is below the accuracy gate and was written only because of --accept-loss:",
            *(f"  {line}" for line in check["failures"]),
            "  it computes measurably other outputs than its float32 graph; `edge bundle` and the device's gate "
            "carry these figures"]


def scale_lines(scales: list[dict]) -> list[str]:
    """The Q/DQ pairs kept float32 because float16 cannot hold their scale."""
    return [f"note: Q/DQ scale {s['scale']} (smallest {s['min_abs']:.3g}) is below float16's smallest normal "
            f"6.1e-5: {', '.join(s['nodes'])} kept float32, a Cast to float16 after the DQ (TensorRT 10.16 on "
            "SM 8.7 fails on int8 DequantizeLinear with float32 output, NVIDIA/TensorRT#4832)" for s in scales]


def range_lines(check: dict) -> list[str]:
    """What the fp16 range check did, for people: the nodes it kept float32 and why, or why it did not run."""
    if not check["done"]:
        return [f"note: no range check was done: {check['reason']}"]
    head = (f"range check on {check['samples']} samples of {check['data']} (margin {check['margin']:g}x; largest "
            f"|x| {check['largest']['max_abs']:.4g} in {check['largest']['tensor']}): ")
    if not check["kept"]:
        return [head + "every tensor within float16's range"]
    lines = [head + f"{len(check['kept'])} nodes beyond float16's range, {check['added']} of them kept float32 "
                    "by this check alone:"]
    lines += [f"  {k['node']} ({k['op']}){' [already float32]' if k['kept_anyway'] else ''}: {k['reason']}"
              for k in check["kept"]]
    return lines
