#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; slow, GPU and TensorRT tests are skipped or
# deselected with their reason). Extra arguments go to pytest, e.g. `-m slow` for the long ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export EDGE_NO_PROGRESS=1
bash scripts/mypy.sh  # the TensorRT-facing modules against tensorrt-stubs (mypy.ini; a few seconds)
.venv/bin/lint-imports --no-cache --no-logo  # the layers and no import cycles (.importlinter; a second or two)
exec .venv/bin/python -m pytest "$@"
