#!/usr/bin/env bash
# The main job on the bundled default: set up, then run `edge pipeline` with its built-in recipe
# (`edge pipeline --print-recipe` shows it) on the bundled reference model fmnist-deit-tiny: a plan to
# 0.5x of the original's latency on a Jetson Orin Nano (edge plan on the Orin estimator), one
# training-free variant per method (block approximation, depthwise attention, attention removal,
# WPAC), FP16 and INT8 of the planned model and of the original, each exported, cleaned, verified and
# evaluated with ONNX Runtime on the full Fashion-MNIST test split (the shipped subset, with a notice,
# if the full set cannot be installed); all timed side by side in one run with an A/A control, each
# with its speedup against the original, a 95 % interval and its Orin Nano estimate; a bundle for
# `edge deploy` in OUT/bundle and, last, the commands that take it to a Jetson. The report goes to
# runs/pipeline (EDGE_PIPELINE_OUT overrides); running again redoes only what changed (--redo
# profile times all graphs again). Extra arguments go to `edge pipeline`, e.g. --recipe spans (the
# three-span recipe of earlier releases) or --recipe FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${EDGE_PIPELINE_OUT:-runs/pipeline}
echo "main: the report goes to $out/report.html (the story, table and charts), report.md and report.json;" \
     "the next commands are the last lines below" >&2
.venv/bin/edge pipeline --out "$out" "$@"
