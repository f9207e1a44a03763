#!/usr/bin/env bash
# Torch-Pruning for benchmarks/plan_peers.py, kept out of the project's .venv.
#
# pip --target installs the pinned peer (benchmarks/requirements-peers.txt) into a folder of its own,
# .venv-peers-site/, without dependencies: torch-pruning needs only torch and numpy, which .venv already
# pins (torch==2.13.0 CPU; a plain `pip install torch-pruning` into another environment would pull a
# newer, CUDA torch). Only the benchmark process puts the folder on sys.path. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
SITE=${EDGE_PEERS_SITE:-$PWD/.venv-peers-site}
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$SITE" \
  -r benchmarks/requirements-peers.txt
echo "peers installed in $SITE" >&2
