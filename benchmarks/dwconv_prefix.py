"""Drop-in depthwise convolution on the bundled reference model, training-free: prefix handling, init, order.

    python benchmarks/dwconv_prefix.py                    # ~12 min on 2 loaded cores
    python benchmarks/dwconv_prefix.py --every 50         # quick look (200 test images)

The model is ``fmnist-deit-tiny`` (12 blocks, 3 heads, 7x7 patch grid + [CLS]). Every plan is
fitted on the same 500 seeded, class-balanced training images (``edge compress`` defaults) and
scored by top-1 accuracy on every ``--every``-th image of the Fashion-MNIST test split with the
model's own head, beside params and FLOPs. No fine-tuning (the paper fine-tunes; see the issue).
Writes benchmarks/results/dwconv_prefix.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from _results import provenance  # benchmarks/ is on sys.path: run as python benchmarks/NAME.py

from edge.check.accuracy import evaluate
from edge.compress import CompressConfig, compress
from edge.compress.load import load_model
from edge.data import InputSpec, load_dataset
from edge.fileio import write_json_atomic
from edge.models import data_config
from edge.progress import log
from edge.runtime import set_threads

ROOT = Path(__file__).resolve().parents[1]
PLANS = [f"dwconv:auto={k}:prefix={p}" for k in (3, 6) for p in ("mean", "pool", "attend", "drop")] + [
    "dwconv:auto=3:prefix=pool:init=gaussian", "dwconv:auto=3:prefix=pool:init=mean",
    "dwconv:auto=3:prefix=pool:order=highest", "dwconv:auto=3:prefix=pool:variant=ensembled",
    "dwconv:auto=3:prefix=pool:variant=full", "dwconv:heads=auto=9:prefix=pool"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="fmnist-deit-tiny")
    parser.add_argument("--data", default="fmnist")
    parser.add_argument("--every", type=int, default=5, help="score every N-th test image")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plans", nargs="+", default=PLANS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dwconv_prefix.json")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), os.getloadavg()
    set_threads(args.threads)
    test = load_dataset(args.data, "test")
    test = test.subset(torch.arange(0, len(test), args.every), f"{test.name}-every-{args.every}")
    base = load_model(args.model)
    spec = InputSpec.from_data_config(data_config(base))
    rows = [{"plan": None, "accuracy": evaluate(base, test, spec, show_progress=False)["accuracy"]}]
    log(f"original: {rows[0]['accuracy']:.4f}")
    for plan in args.plans:
        start = time.perf_counter()
        model, manifest = compress(load_model(args.model), {"model": args.model},
                                   CompressConfig(plan=plan, data=args.data, samples=args.samples))
        accuracy = evaluate(model, test, spec, show_progress=False)["accuracy"]
        rows.append({"plan": plan, "resolved": manifest["plan"], "accuracy": accuracy,
                     "params": manifest["after"]["params"], "flops": manifest["after"]["flops"],
                     "flops_before": manifest["before"]["flops"], "seconds": round(time.perf_counter() - start, 1)})
        log(f"{plan}: {accuracy:.4f} ({manifest['plan']}, FLOPs {manifest['after']['flops']:,})")
    result = {"benchmark": "dwconv_prefix", "model": args.model, "test": test.name, "test_images": len(test),
              "calibration": {"data": args.data, "samples": args.samples, "seed": 0}, "training": "none",
              "rows": rows,
              **provenance("dwconv_prefix.py", args, parser, started=started, load_before=load_before)}
    write_json_atomic(result, args.out)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
