"""``edge compress``: apply a compression plan and save a restorable artifact."""

from __future__ import annotations

import sys

from edge.cli.common import (
    add_calibration_options,
    add_command,
    add_device_option,
    add_field,
    add_model_options,
    add_out_folder,
    emit,
)
from edge.cli.options import Text

EXAMPLES = """  # replace block 10 by a closed-form linear map from block 9's output (no training)
  edge compress fmnist-deit-tiny --plan linear:9-10 --data fmnist --samples 500 --out runs/ref-linear-9-10

  # two spans; the second replaces blocks 10 and 11 with one affine map
  edge compress fmnist-deit-tiny --plan "linear:2-3,affine:9-11:ridge=1e-4" --out runs/two-spans

  # let the planner choose 3 blocks by held-out fidelity (prints its candidate table)
  edge compress fmnist-deit-tiny --plan auto-linear:3 --out runs/auto3

  edge eval runs/auto3 --data fmnist      # artifacts load wherever a model name is accepted

  # attention of the 6 blocks with the most input-invariant maps -> 3x3 depthwise conv over V
  edge compress fmnist-deit-tiny --plan dwconv:auto=6:init=lsq:k=3 --out runs/dw6
  edge compress fmnist-deit-tiny --plan "linear:9-10,dwconv:blocks=2+5+7:variant=ensembled" --out runs/mixed

  # attention removed (MLP-only blocks): listed blocks, or K chosen by NOSE / the first-K baseline;
  # init=affine puts a closed-form affine map of the attention input in its place (training-free)
  edge compress fmnist-deit-tiny --plan attnrm:blocks=0+1+3+4 --out runs/attnrm4
  edge compress fmnist-deit-tiny --plan "attnrm:auto=4:select=first:init=affine" --out runs/attnrm4-affine

  # narrower attention heads and MLPs (WPAC: Taylor-weighted PCA per head, training-free); per part;
  # the paper's Table 3 baselines order the dims by criterion=taylor|magnitude|random instead
  edge compress fmnist-deit-tiny --plan wpac:keep=0.5 --out runs/w50
  edge compress fmnist-deit-tiny --plan "wpac:qk=0.5:v=0.75:mlp=1:blocks=0+1+2+3" --out runs/w-heads

  # a super-network: WPAC order ranked on the images (or trained by `edge finetune --piad`), then
  # sub-networks cut from it at a share of the MACs in seconds, with no data
  edge compress fmnist-deit-tiny --plan wpac:macs=1 --out runs/wsuper
  edge compress runs/wsuper --plan wpac:macs=0.5 --out runs/w-macs50

  # compress, then one epoch of distillation from the original (see `edge finetune` for the recipe)
  edge compress fmnist-deit-tiny --plan dwconv:auto=6 --finetune-epochs 1 --out runs/dw6-tuned"""

def register(subparsers) -> None:
    from edge.compress import CompressConfig
    from edge.compress.finetune import FinetuneConfig
    from edge.compress.plan import parse_plan, plan_grammar

    parser = add_command(subparsers, "compress", "compress a model by a plan; save plan, maps and statistics",
                         "Fits every span on N seeded, class-balanced calibration samples of the training split.\n"
                         "OUT/edge-model.json holds the plan, source model, fit statistics, params and FLOPs;\n"
                         "OUT/model.safetensors the weights. OUT is accepted by eval, analyze and export.",
                         EXAMPLES)
    add_model_options(parser)
    parser.add_argument("--plan", required=True, type=Text(parse_plan, keep_text=True), help=plan_grammar())
    add_calibration_options(parser, CompressConfig, samples_default=_samples_default())
    add_field(parser, "--holdout", CompressConfig, help="share of samples the planner scores on")
    add_device_option(parser, "the passes over the calibration images and the fine-tune", CompressConfig.device)
    add_out_folder(parser, "output folder (written atomically)")
    add_field(parser, "--finetune-epochs", FinetuneConfig, "epochs", default=None,
              help="then distil the source model into the compressed one for N epochs of --data "
                   "(`edge finetune`'s default recipe; resumable; default: none)")
    parser.add_argument("--finetune-train", choices=["all", "replaced"], default=FinetuneConfig.train,
                        help="which parameters the fine-tune trains")
    parser.add_argument("--no-resume", dest="resume", action="store_false",
                        help="with --finetune-epochs: ignore the fine-tune's checkpoint in --out, start over")
    parser.set_defaults(run=run)


def _samples_default() -> str:
    """What ``--samples`` defaults to, from the registered methods' own calibration sizes."""
    from edge.compress.method import Method
    from edge.compress.registry import methods

    base = Method.calibration_samples
    own = ", ".join(f"{m.keywords[0]} {m.calibration_samples}" for m in methods() if m.calibration_samples != base)
    return f"{base}" + (f"; plans with {own}" if own else "") + ", at most the training split"


def _table(rows: list[dict]) -> str:
    """The planners' candidate rows, whatever their method's columns (the chosen ones marked ``<``)."""
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "chosen"))

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.5g}"
        return "" if value is None else str(value)

    table = [keys, *([cell(r.get(k)) for k in keys] for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(keys))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in table]
    return "\n".join(line + (" <" if i and rows[i - 1].get("chosen") else "") for i, line in enumerate(lines))


def _finetune(model, manifest: dict, args) -> dict:
    """Save the training-free artifact beside --out (temporarily), distil into --out; the tuned manifest."""
    import tempfile
    from pathlib import Path

    from edge.compress import save_artifact
    from edge.compress.artifact import read_manifest
    from edge.compress.finetune import FinetuneConfig, finetune

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = FinetuneConfig(data=args.data, epochs=args.finetune_epochs, train=args.finetune_train, seed=args.seed,
                            threads=args.threads, device=args.device, command=["edge", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.untuned.", dir=out.parent) as tmp:
        finetune(save_artifact(model, Path(tmp) / "artifact", manifest), out, config, resume=args.resume,
                 student_name=f"{args.model} --plan {args.plan} (training-free, not kept)")
    return read_manifest(out)


def _latency_predictor(step) -> dict:
    """``predict``/``predictor`` for a ``wpac:latency-ms=X:table=FILE`` cut: the table's prediction of a model."""
    if getattr(step, "latency_ms", None) is None:
        return {}
    from edge.latency import LatencyTable, predict_model

    table = LatencyTable.load(step.options["table"])
    return {"predict": lambda model: predict_model(model, table).total_ms,
            "predictor": {"table": step.options["table"], "target": table.target.describe(),
                          "overhead_ms": table.overhead_ms}}


def run(args) -> int:
    from pathlib import Path

    from edge import distributed
    from edge.compress import CompressConfig, compress, is_artifact, save_artifact
    from edge.compress.derive import derivation_step, derive_model
    from edge.compress.load import load_model
    from edge.runtime import set_threads

    set_threads(args.threads)
    step = derivation_step(args.plan)
    if is_artifact(args.model) and step is not None:   # a sub-network of a super-network
        model, manifest = derive_model(args.model, args.plan, **_latency_predictor(step))
    else:
        model = load_model(args.model, weights=args.weights, img_size=args.img_size)
        # the weights by absolute path: a later verb (finetune's teacher) may run in another folder
        source = {"model": args.model, "weights": str(Path(args.weights).resolve()) if args.weights else None,
                  "img_size": args.img_size}
        config = CompressConfig(plan=args.plan, data=args.data, samples=args.samples, seed=args.seed,
                                holdout=args.holdout, device=args.device)
        model, manifest = compress(model, source, config)
    if manifest["planner"] and distributed.is_main():
        print(_table(manifest["planner"]), file=sys.stderr)
    if args.finetune_epochs:
        manifest = _finetune(model, manifest, args)
    elif distributed.is_main():   # under torchrun the statistics are everyone's, the file the main process's
        save_artifact(model, args.out, manifest)
    b, a = manifest["before"], manifest["after"]
    human = (f"plan {manifest['plan']}\nparams {b['params']:,} -> {a['params']:,} "
             f"({100 * (1 - a['params'] / b['params']):.1f}% fewer)\n"
             f"FLOPs  {b['flops']:,} -> {a['flops']:,} ({100 * (1 - a['flops'] / b['flops']):.1f}% fewer)\n"
             f"wrote {args.out}")
    if manifest.get("finetune"):
        tuned = manifest["finetune"][-1]
        human += (f"\nfine-tuned {tuned['steps']} steps: {tuned['eval']['data']} accuracy "
                  f"{tuned['eval_before']['accuracy']:.4f} -> {tuned['eval']['accuracy']:.4f}")
    emit({**manifest, "out": args.out}, args.json, human)
    return 0
