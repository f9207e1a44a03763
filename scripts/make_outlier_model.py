"""Make `fmnist-deit-tiny-outliers`: the reference model with the activation outliers of pretrained ViTs.

    python scripts/make_outlier_model.py --data-dir /usr/share/datasets/fashion-mnist --out runs/outliers

The recipe (plant massive activations in an early block's MLP, fine-tune by distillation from the
reference model with edge's training loop, spread the LayerNorm channels exactly) is
:mod:`edge.train.outliers`; this script runs it and adds the model's outlier statistics
(:mod:`edge.analysis.outliers`, on --stats-images test images) to the model card. Writes
OUT/model.safetensors (float16) and OUT/card.json (the recipe, seed, steps, wall time, hardware, torch
version, float32 accuracy on the full test split, outlier statistics). Copy them to
edge/models/weights/fmnist-deit-tiny-outliers.{safetensors,json} to ship them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from edge.analysis.outliers import outlier_statistics
from edge.data import ArrayPreprocess, InputSpec, load_dataset
from edge.fileio import write_text_atomic
from edge.models import create_model, data_config
from edge.runtime import resolve_device
from edge.train.outliers import TEACHER, OutlierConfig, make_outlier_model, subset

OPTIONS = ("seed", "epochs", "batch_size", "lr", "magnitude", "massive_block", "aux_weight", "device", "amp",
           "threads", "max_steps", "train_samples", "eval_samples", "gate_images")


def add_statistics(card: dict, out: Path, config: OutlierConfig, images: int) -> dict:
    """The saved model's outlier statistics on ``images`` seeded test images, added to ``out/card.json``."""
    model = create_model(TEACHER, weights=out / "model.safetensors")
    data = subset(load_dataset(config.data, "test"), images, config.seed)
    preprocess = ArrayPreprocess(InputSpec.from_data_config(data_config(model)))
    stats = outlier_statistics(model, data.batches(250, preprocess), resolve_device(config.device))
    card = {**card, "outlier_statistics": {"data": data.name, **stats}}
    write_text_atomic(json.dumps(card, indent=2) + "\n", out / "card.json")
    return card


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="fmnist",
                        help="folder with the four Fashion-MNIST IDX .gz files (default: Debian's package)")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--stats-images", type=int, default=2000, help="test images the statistics read (2000)")
    defaults = {f.name: f.default for f in fields(OutlierConfig)}
    for name in OPTIONS:
        kind = type(defaults[name]) if defaults[name] is not None else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=defaults[name],
                            help=f"default {defaults[name]}")
    args = parser.parse_args()
    config = OutlierConfig(data=args.data_dir, command=["python", *sys.argv],
                           **{name: getattr(args, name) for name in OPTIONS})
    card = add_statistics(make_outlier_model(config, args.out), args.out, config, args.stats_images)
    summary = card["outlier_statistics"]["summary"]
    print(f"accuracy {card['eval']['accuracy']:.4f} ({card['eval']['samples']} images); "
          f"blocks with channel ratio >= 100: {summary['massive_blocks']}; "
          f"LayerNorms with range spread >= 20: {len(summary['spread_layernorms'])}/{summary['layernorms']}; "
          f"meets targets: {summary['meets_targets']}; wall {card['wall_time_s']} s")


if __name__ == "__main__":
    main()
