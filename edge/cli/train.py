"""``edge train``: train a ViT (by default the reference model) with the documented recipe."""

from __future__ import annotations

import sys

from edge.cli.common import (
    add_command,
    add_data_option,
    add_field,
    add_out_folder,
    add_seed_option,
    add_threads_option,
    add_weights_option,
    emit,
)
from edge.cli.options import Device, Model
from edge.errors import plural

EXAMPLES = """  # the recipe of the bundled reference model (resumable: run it again to continue)
  edge train fmnist-deit-tiny --data fmnist --epochs 10 --seed 0 --out runs/fmnist-deit-tiny

  # a shortened run of the same schedule (first 200 steps)
  edge train fmnist-deit-tiny --data fmnist --max-steps 200 --out runs/short"""


def register(subparsers) -> None:
    from edge.train import TrainConfig

    d = TrainConfig()
    parser = add_command(subparsers, "train", "train a ViT on an image data set (seeded, resumable, GPU if present)",
                         "Writes OUT/model.safetensors, OUT/card.json (recipe, accuracy, wall time, hardware) and\n"
                         "OUT/checkpoint.pt; an interrupted run continues from its checkpoint when run again.",
                         EXAMPLES)
    parser.add_argument("model", nargs="?", type=Model(), default=d.model,
                        help="model to train from random initialisation")
    add_weights_option(parser, "--init-weights", help="start from these weights instead of random initialisation "
                                                      "(a fine-tuning stage with its own schedule)")
    add_data_option(parser, d.data, "fmnist, fmnist-mini, or a folder")
    add_data_option(parser, None, "data set whose test split is evaluated (default: --data)", flag="--eval-data")
    add_out_folder(parser)
    add_field(parser, "--epochs", TrainConfig, help="passes over the training set")
    add_field(parser, "--batch-size", TrainConfig, help="images per step")
    add_field(parser, "--lr", TrainConfig, help="peak AdamW learning rate")
    add_field(parser, "--min-lr", TrainConfig, help="end of the cosine decay")
    add_field(parser, "--weight-decay", TrainConfig, help="AdamW weight decay")
    add_field(parser, "--warmup-steps", TrainConfig, help="linear warm-up steps")
    add_field(parser, "--label-smoothing", TrainConfig, help="label smoothing of the cross-entropy")
    add_field(parser, "--grad-clip", TrainConfig, help="gradient norm clipping (0: none)")
    parser.add_argument("--no-augment", dest="augment", action="store_false", help="turn off shift/flip")
    add_seed_option(parser, TrainConfig)
    parser.add_argument("--amp", choices=["auto", "bf16", "fp16", "off"], default=d.amp,
                        help="mixed precision; auto = bf16 where the CPU/GPU runs it natively")
    parser.add_argument("--device", type=Device(), default=d.device, help="auto, cpu or cuda[:N]")
    add_threads_option(parser, config=TrainConfig)
    add_field(parser, "--max-steps", TrainConfig, help="stop after this many steps of the full schedule")
    add_field(parser, "--train-samples", TrainConfig, help="train on a seeded class-balanced subset")
    add_field(parser, "--checkpoint-every", TrainConfig, help="steps between checkpoints")
    parser.add_argument("--save-dtype", choices=["float16", "float32"], default=d.save_dtype,
                        help="dtype of the saved weights")
    parser.add_argument("--no-resume", dest="resume", action="store_false", help="ignore an existing checkpoint")
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.train import TrainConfig, train

    config = TrainConfig(model=args.model, init_weights=args.init_weights, data=args.data,
                         eval_data=args.eval_data, epochs=args.epochs,
                         batch_size=args.batch_size, lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                         warmup_steps=args.warmup_steps, label_smoothing=args.label_smoothing,
                         grad_clip=args.grad_clip, augment=args.augment, seed=args.seed, amp=args.amp,
                         device=args.device, threads=args.threads, max_steps=args.max_steps,
                         train_samples=args.train_samples, checkpoint_every=args.checkpoint_every,
                         save_dtype=args.save_dtype, command=["edge", *sys.argv[1:]])
    card = train(config, args.out, resume=args.resume)
    ev = card["eval"]
    emit(card, args.json, f"{card['model']}: accuracy {ev['accuracy']:.4f} on {ev['samples']} images of "
                          f"{ev['data']} after {plural(card['steps'], 'step')} ({card['wall_time_s'] / 60:.1f} min)\n"
                          f"wrote {args.out}/model.safetensors and {args.out}/card.json")
    return 0
