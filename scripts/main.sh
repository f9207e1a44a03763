#!/usr/bin/env bash
# The main job on the bundled default: set up, then run `edge pipeline` with its built-in recipe
# (`edge pipeline --print-recipe` shows it) on the bundled reference model fmnist-deit-tiny: the
# original and three block-approximation plans, each compressed, exported, cleaned, verified,
# evaluated with ONNX Runtime on the full Fashion-MNIST test split (the shipped subset, with a
# notice, if the full set cannot be installed) and profiled. The report goes to runs/pipeline
# (EDGE_PIPELINE_OUT overrides); running again redoes only what changed. Extra arguments go to
# `edge pipeline`, e.g. --recipe FILE or --redo profile.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${EDGE_PIPELINE_OUT:-runs/pipeline}
.venv/bin/edge pipeline --out "$out" "$@"
echo "main: report in $out/report.html (table and charts), $out/report.md and $out/report.json" >&2
