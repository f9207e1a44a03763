"""Make `fmnist-deit-tiny-outliers`: the reference model with the activation outliers of pretrained ViTs.

    python scripts/make_outlier_model.py --data-dir /usr/share/datasets/fashion-mnist --out runs/outliers

The recipe (plant massive activations in an early block's MLP, fine-tune by distillation from the
reference model with edge's training loop, spread the LayerNorm channels exactly) is
:mod:`edge.train.outliers`. Writes OUT/model.safetensors (float16) and OUT/card.json (the recipe, seed,
steps, wall time, hardware, torch version, float32 accuracy on the full test split, outlier statistics).
Copy them to edge/models/weights/fmnist-deit-tiny-outliers.{safetensors,json} to ship them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from edge.train.outliers import OutlierConfig, make_outlier_model

OPTIONS = ("seed", "epochs", "batch_size", "lr", "magnitude", "massive_block", "aux_weight", "device", "amp",
           "threads", "max_steps", "train_samples", "eval_samples", "stats_images", "gate_images")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="fmnist",
                        help="folder with the four Fashion-MNIST IDX .gz files (default: Debian's package)")
    parser.add_argument("--out", required=True, help="output folder")
    defaults = {f.name: f.default for f in fields(OutlierConfig)}
    for name in OPTIONS:
        kind = type(defaults[name]) if defaults[name] is not None else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=defaults[name],
                            help=f"default {defaults[name]}")
    args = parser.parse_args()
    config = OutlierConfig(data=args.data_dir, command=["python", *sys.argv],
                           **{name: getattr(args, name) for name in OPTIONS})
    card = make_outlier_model(config, args.out)
    summary = card["outlier_statistics"]["summary"]
    print(f"accuracy {card['eval']['accuracy']:.4f} ({card['eval']['samples']} images); "
          f"blocks with channel ratio >= 100: {summary['massive_blocks']}; "
          f"LayerNorms with range spread >= 20: {len(summary['spread_layernorms'])}/{summary['layernorms']}; "
          f"meets targets: {summary['meets_targets']}; wall {card['wall_time_s']} s")


if __name__ == "__main__":
    main()
