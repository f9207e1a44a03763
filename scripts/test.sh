#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; slow, GPU and TensorRT tests are skipped or
# deselected with their reason). Extra arguments go to pytest, e.g. `-m slow` for the long ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export EDGE_NO_PROGRESS=1
bash scripts/mypy.sh  # the TensorRT-facing modules against tensorrt-stubs (mypy.ini; a few seconds)
.venv/bin/lint-imports --no-cache --no-logo  # the layers and no import cycles (.importlinter; a second or two)
# pytest-xdist: whole work units (a test file, or one guide of tests/test_readme.py) to each of up to 4 workers,
# longest first (tests/conftest.py's scheduler). The suite is mostly one-thread work (subprocesses, Python, small
# graphs): 2 workers keep 2 cores 99 % busy, and a third does not help (docs/contributing.md has the times).
# Each worker's OpenMP pool and ONNX Runtime sessions (edge.check.compare.default_threads) get one thread unless
# OMP_NUM_THREADS says otherwise: two pools of two on two cores fight (ONNX Runtime's threads spin between
# operators: tests/edge/precision's two files took 131 s with one thread a session, 179 s with ONNX Runtime's
# default of two, one run each). A later -n wins: `bash scripts/test.sh -n 0` runs in this one process (pdb,
# -x ordering).
workers=$(nproc)
(( workers > 4 )) && workers=4
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -n "$workers" "$@"
