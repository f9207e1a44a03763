"""``edge finetune``: distil the source model into a compressed artifact or another model (KL on logits, AdamW,
resumable)."""

from __future__ import annotations

import sys

from edge.cli.common import add_command, add_weights_option, emit
from edge.cli.options import Data, Device, ExistingFile, Model, OutputFolder, config_type
from edge.errors import plural

EXAMPLES = """  # one epoch of distillation from fmnist-deit-tiny into its 6-block dwconv compression
  edge compress fmnist-deit-tiny --plan dwconv:auto=6:init=lsq --out runs/dw6
  edge finetune runs/dw6 --data fmnist --epochs 1 --out runs/dw6-ft

  # only the replaced modules train; hard labels mixed in; a feature loss on the pre-logits
  edge finetune runs/dw6 --train replaced --alpha 0.2 --feature-weight 1.0 --out runs/dw6-ft-replaced

  # a shortened run of the same schedule; run the same command again to continue it
  edge finetune runs/dw6 --epochs 1 --max-steps 100 --out runs/dw6-short
  edge finetune runs/dw6 --epochs 1 --out runs/dw6-short

  # dilution learning of an attention-removal artifact: 2 epochs, the removed attention faded out
  # (M 1 -> 0 over the first 75 % of the steps, then M = 0); the result is MLP-only blocks x = 2x + ...
  edge compress fmnist-deit-tiny --plan attnrm:auto=4 --out runs/rm4
  edge finetune runs/rm4 --dilute --epochs 2 --out runs/rm4-dilute
  edge finetune runs/rm4 --dilute --dilution-fraction 0.5 --dilution-schedule cosine --epochs 2 --out runs/rm4-cos

  # PIAD: a WPAC model (full widths) trained into a super-network for 3 epochs, the dropout list grown
  # to 75 % of the MACs over the first 2; then sub-networks cut from it without data
  edge compress fmnist-deit-tiny --plan wpac:keep=1 --out runs/wfull
  edge finetune runs/wfull --piad --piad-target 0.75 --epochs 3 --piad-epochs 2 --out runs/wsuper-piad
  edge compress runs/wsuper-piad --plan wpac:macs=0.5 --out runs/piad-macs50"""


def add_finetune_options(parser) -> None:
    """The recipe options beyond data, epochs and seed."""
    from edge.compress.finetune_config import DILUTION_SCHEDULES, TRAINABLE, FinetuneConfig

    d = FinetuneConfig()
    parser.add_argument("--steps", type=config_type(FinetuneConfig, "--steps"),
                        help="schedule length in steps (default: epochs x steps per epoch)")
    parser.add_argument("--max-steps", type=config_type(FinetuneConfig, "--max-steps"),
                        help="stop after this many steps of the schedule")
    parser.add_argument("--train-samples", type=config_type(FinetuneConfig, "--train-samples"),
                        help="distil on a seeded class-balanced subset")
    parser.add_argument("--batch-size", type=config_type(FinetuneConfig, "--batch-size"), default=d.batch_size,
                        help="images per step")
    parser.add_argument("--lr", type=config_type(FinetuneConfig, "--lr"), default=d.lr,
                        help="peak AdamW learning rate")
    parser.add_argument("--min-lr", type=config_type(FinetuneConfig, "--min-lr"), default=d.min_lr,
                        help="end of the cosine decay")
    parser.add_argument("--weight-decay", type=config_type(FinetuneConfig, "--weight-decay"), default=d.weight_decay,
                        help="AdamW weight decay")
    parser.add_argument("--warmup-steps", type=config_type(FinetuneConfig, "--warmup-steps"), default=d.warmup_steps,
                        help="linear warm-up steps")
    parser.add_argument("--temperature", type=config_type(FinetuneConfig, "--temperature"), default=d.temperature,
                        help="softmax temperature T")
    parser.add_argument("--alpha", type=config_type(FinetuneConfig, "--alpha"), default=d.alpha,
                        help="weight of the hard-label cross-entropy")
    parser.add_argument("--feature-weight", type=config_type(FinetuneConfig, "--feature-weight"),
                        default=d.feature_weight,
                        help="weight of the MSE between the pre-logit features of student and teacher")
    parser.add_argument("--train", choices=TRAINABLE, default=d.train,
                        help="which parameters learn: all, or only the modules the compression put in")
    parser.add_argument("--no-augment", dest="augment", action="store_false",
                        help="turn off shift/flip")
    parser.add_argument("--eval-samples", type=config_type(FinetuneConfig, "--eval-samples"),
                        help="held-out images (seeded, class-balanced subset of the test split; default: all)")
    parser.add_argument("--teacher", type=Model(),
                        help="model to distil from (default: the artifact's source model, or the named model itself)")
    parser.add_argument("--teacher-weights", type=ExistingFile(),
                        help="weights of the teacher (default: the artifact's source weights, or the bundled ones)")
    parser.add_argument("--amp", choices=["auto", "bf16", "fp16", "off"], default=d.amp,
                        help="mixed precision; auto = bf16 where the CPU/GPU runs it natively")
    parser.add_argument("--device", type=Device(), default=d.device, help="auto, cpu or cuda[:N]")
    parser.add_argument("--checkpoint-every", type=config_type(FinetuneConfig, "--checkpoint-every"),
                        default=d.checkpoint_every, help="steps between checkpoints")
    parser.add_argument("--dilute", action="store_true",
                        help="dilution learning: the attention of MLP-only blocks comes back from the teacher and "
                             "is faded out, x = M attn(x) + (2 - M) x, M set every step from 1 to 0; only the "
                             "M = 0 model (x = 2x; x = x + MLP(LN(x))) is written")
    parser.add_argument("--dilution-fraction", type=config_type(FinetuneConfig, "--dilution-fraction"),
                        default=d.dilution_fraction,
                        help="part of the steps over which M decays to 0; the rest trains at M = 0")
    parser.add_argument("--dilution-schedule", choices=DILUTION_SCHEDULES, default=d.dilution_schedule,
                        help="shape of M's decay in the step index")
    parser.add_argument("--piad", action="store_true",
                        help="progressive importance-aware dropout of a wpac artifact (keep=1 or macs=1): each step "
                             "trains a sampled sub-network, a dropout list of the least important aligned units "
                             "grows to --piad-target; the result keeps full widths and the order to cut any "
                             "sub-network from (`edge compress OUT --plan wpac:macs=F`)")
    parser.add_argument("--piad-target", type=config_type(FinetuneConfig, "--piad-target"), default=d.piad_target,
                        help="share of the MACs the dropout list grows to drop (sub-networks trained down to "
                             "1 - F of the MACs)")
    parser.add_argument("--piad-epochs", type=config_type(FinetuneConfig, "--piad-epochs"),
                        help="epochs over which the dropout list grows, once at the start of each (default: half "
                             "of --epochs, rounded up)")
    parser.add_argument("--piad-samples", type=config_type(FinetuneConfig, "--piad-samples"),
                        default=d.piad_samples, help="seeded, class-balanced training images the units are "
                                                     "ranked on (module sensitivity, Taylor importance)")


def finetune_config(args, **fixed):
    """A :class:`FinetuneConfig` from the parsed options that name its fields (plus ``fixed``)."""
    from dataclasses import fields

    from edge.compress.finetune import FinetuneConfig

    values = {f.name: getattr(args, f.name) for f in fields(FinetuneConfig) if hasattr(args, f.name)}
    return FinetuneConfig(**{**values, **fixed})


def register(subparsers) -> None:
    from edge.compress.finetune import FinetuneConfig

    d = FinetuneConfig()
    parser = add_command(subparsers, "finetune", "fine-tune a compressed model by distillation from its source model",
                         "KL divergence between the softened logits of the source model (the teacher) and the\n"
                         "compressed model, optionally mixed with hard-label cross-entropy and a feature MSE;\n"
                         "AdamW, warm-up then cosine decay; GPU if present. STUDENT is an artifact folder, or a\n"
                         "model name with --weights (a model compressed or pruned elsewhere; its shapes must be\n"
                         "those the name builds); a module of your own code goes through the Python entry point\n"
                         "edge.compress.finetune.distil. OUT is an artifact whose edge-model.json records the\n"
                         "recipe, the teacher and the held-out accuracy before and after; OUT/checkpoint.pt lets\n"
                         "the same command continue a stopped run (a finished run removes it).",
                         EXAMPLES)
    parser.add_argument("student", type=Model(),
                        help="a folder written by `edge compress`, or fmnist-deit-tiny / timm:ARCH[,key=value...] "
                             "with --weights")
    add_weights_option(parser, help="weights of a named STUDENT (.safetensors, or a weights-only torch state dict); "
                                    "its shapes must be those the name builds")
    parser.add_argument("--out", required=True, type=OutputFolder(),
                        help="output folder (an artifact, written atomically)")
    parser.add_argument("--data", type=Data(), default=d.data,
                        help="fmnist, fmnist-mini, or a folder (its train split)")
    parser.add_argument("--eval-data", type=Data(), help="data set whose test split is held out (default: --data)")
    parser.add_argument("--epochs", type=config_type(FinetuneConfig, "--epochs"), default=d.epochs,
                        help="passes over the training set")
    add_finetune_options(parser)
    parser.add_argument("--seed", type=config_type(FinetuneConfig, "--seed"), default=d.seed, help="random seed")
    parser.add_argument("--threads", type=config_type(FinetuneConfig, "--threads"),
                        help="CPU threads (default: torch's)")
    parser.add_argument("--no-resume", dest="resume", action="store_false", help="ignore an existing checkpoint")
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.compress.finetune import finetune

    config = finetune_config(args, command=["edge", *sys.argv[1:]])
    record = finetune(args.student, args.out, config, weights=args.weights, resume=args.resume)
    before, after = record["eval_before"], record["eval"]
    if record["artifact"] is None:
        emit({**record, "out": args.out}, args.json,
             f"stopped {record['stopped']}: no artifact written (only the final structure is), only "
             f"{args.out}/checkpoint.pt; run the same command without --max-steps to continue")
        return 0
    emit({**record, "out": args.out}, args.json,
         f"{after['data']} accuracy {before['accuracy']:.4f} -> {after['accuracy']:.4f} after "
         f"{plural(record['steps'], 'step')} ({record['epochs']:g} epochs, {record['wall_time_s'] / 60:.1f} min)\n"
         f"wrote {args.out}")
    return 0
