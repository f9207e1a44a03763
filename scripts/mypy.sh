#!/usr/bin/env bash
# Type-check the TensorRT-facing modules (mypy.ini) against tensorrt-stubs, which stand in for
# TensorRT where it cannot be installed. The stubs go to .venv/tensorrt-stubs without their
# dependencies (`tensorrt` itself cannot install here) so they never shadow a real `import tensorrt`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGE_VENV:-$PWD/.venv}
STUBS_VERSION=10.13.0.35.1
STUBS=.venv/tensorrt-stubs
if [ ! -e "$STUBS/.edge-$STUBS_VERSION" ]; then
  echo "mypy: installing mypy and tensorrt-stubs $STUBS_VERSION into $STUBS" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "mypy>=1.10"
  rm -rf "$STUBS"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$STUBS" \
    "tensorrt-stubs==$STUBS_VERSION"
  # the 10.13 stubs do not parse as they are: plugin parameters named `in` (a keyword), and one
  # parameter without a default after defaulted ones (add_scale_nd)
  sed -i -E -e 's/([(,] ?(self(: [A-Za-z0-9]+)?, )?)in: /\1in_: /' \
    -e 's/power: Weights = None, channel_axis: int\)/power: Weights = None, channel_axis: int = ...)/' \
    "$STUBS/tensorrt_bindings/tensorrt.pyi"
  touch "$STUBS/.edge-$STUBS_VERSION"
fi
exec "$VENV/bin/python" -m mypy --config-file mypy.ini "$@"
