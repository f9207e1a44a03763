#!/usr/bin/env bash
# The main job on the bundled default: set up, then evaluate the bundled reference model
# fmnist-deit-tiny on the full Fashion-MNIST test split (the shipped subset if the full set
# cannot be installed). Extra arguments go to `edge eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
data=fmnist
[ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || [ -n "${EDGE_FMNIST_DIR:-}" ] || {
  echo "main: full Fashion-MNIST missing, evaluating the shipped fmnist-mini subset" >&2; data=fmnist-mini; }
exec .venv/bin/edge eval fmnist-deit-tiny --data "$data" "$@"
