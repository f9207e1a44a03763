"""``edge train``: train a ViT (by default the reference model) with the documented recipe."""

from __future__ import annotations

import sys

from edge.cli.common import add_command, emit

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
    parser.add_argument("model", nargs="?", default=d.model, help="model to train from random initialisation")
    parser.add_argument("--init-weights", help="start from these weights instead of random initialisation "
                                               "(a fine-tuning stage with its own schedule)")
    parser.add_argument("--data", default=d.data, help="fmnist, fmnist-mini, or a folder")
    parser.add_argument("--eval-data", help="data set whose test split is evaluated (default: --data)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--min-lr", type=float, default=d.min_lr)
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    parser.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip)
    parser.add_argument("--no-augment", dest="augment", action="store_false", help="turn off shift/flip")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--amp", choices=["auto", "bf16", "fp16", "off"], default=d.amp,
                        help="mixed precision; auto = bf16 where the CPU/GPU runs it natively")
    parser.add_argument("--device", default=d.device, help="auto, cpu or cuda[:N]")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--max-steps", type=int, help="stop after this many steps of the full schedule")
    parser.add_argument("--train-samples", type=int, help="train on a seeded class-balanced subset")
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps")
    parser.add_argument("--save-dtype", choices=["float16", "float32"], default=d.save_dtype)
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
                          f"{ev['data']} after {card['steps']} steps ({card['wall_time_s'] / 60:.1f} min)\n"
                          f"wrote {args.out}/model.safetensors and {args.out}/card.json")
    return 0
