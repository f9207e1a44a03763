"""Scale of `edge analyze`: timm deit_small_patch16_224 (random weights), 224x224, all 12 blocks.

    python benchmarks/analysis_scale.py            # 500 samples of Fashion-MNIST, resized to 224x224 RGB

Reports wall time and peak resident memory of the whole analysis (statistics for every pair
of the 13 representations in float64, three token views, heatmaps) in
benchmarks/results/analysis_scale.json. Target: within 5 minutes and 6 GB on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from edge.analysis.analyze import analyze
from edge.compress.load import load_model
from edge.data import InputSpec, calibration_set
from edge.models import data_config
from edge.runtime import hardware, set_threads

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="timm:deit_small_patch16_224")
    parser.add_argument("--data", default="fmnist")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/analysis_scale.json"))
    args = parser.parse_args()
    threads = set_threads(args.threads)
    start = time.perf_counter()
    model = load_model(args.model)
    calibration = calibration_set(args.data, args.samples)
    with tempfile.TemporaryDirectory() as out:
        result = analyze(model, args.model, calibration, InputSpec.from_data_config(data_config(model)), out)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = {"model": args.model, "samples": result["samples"], "num_blocks": result["num_blocks"],
              "tokens_per_sample": result["tokens_per_sample"], "seconds_total": round(seconds, 1),
              "seconds_analysis": result["seconds"], "peak_rss_mb": round(peak_mb), "threads": threads,
              "targets": {"seconds": 300, "peak_rss_mb": 6144}, "hardware": hardware(),
              "command": "python benchmarks/analysis_scale.py"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
