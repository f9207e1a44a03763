#!/usr/bin/env bash
# The main job on the bundled default: set up, then run `edge pipeline` with its built-in recipe
# (`edge pipeline --print-recipe` shows it) on the bundled reference model fmnist-deit-tiny: the
# original and three block-approximation plans, each compressed, exported, cleaned, verified and
# evaluated with ONNX Runtime on the full Fashion-MNIST test split (the shipped subset, with a
# notice, if the full set cannot be installed); then all four timed side by side in one run with an
# A/A control, each with its speedup against the original and a 95 % interval. The report goes to
# runs/pipeline (EDGE_PIPELINE_OUT overrides); running again redoes only what changed (--redo
# profile times all variants again). Extra arguments go to `edge pipeline`, e.g. --recipe FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${EDGE_PIPELINE_OUT:-runs/pipeline}
.venv/bin/edge pipeline --out "$out" "$@"
echo "main: report in $out/report.html (table and charts), $out/report.md and $out/report.json" >&2
