#!/usr/bin/env bash
# Set up edge on a fresh Debian machine: the Fashion-MNIST package, a virtual environment in
# .venv with the pinned CPU stack, and edge itself (editable). Safe to run again: each step is
# skipped when already done (the environment is rebuilt when setup.py changes).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGE_VENV:-$PWD/.venv}
PYTHON=${PYTHON:-python3}
FMNIST=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz

apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    [ -n "${EDGE_APT_UPDATED:-}" ] || { apt-get update -qq; EDGE_APT_UPDATED=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "setup: cannot install $* (needs root and apt-get); install it yourself" >&2
    return 1
  fi
}

if [ ! -e "$FMNIST" ]; then
  echo "setup: installing Fashion-MNIST (Debian package dataset-fashion-mnist)" >&2
  apt_install dataset-fashion-mnist || echo "setup: continuing without the full data set; --data fmnist-mini works" >&2
fi

if [ ! -x /usr/sbin/sshd ]; then  # the deploy tests start a real sshd on 127.0.0.1
  echo "setup: installing openssh-server" >&2
  apt_install openssh-server || echo "setup: continuing without sshd; the deploy tests will be skipped" >&2
fi

if [ ! -x /usr/bin/sudo ]; then  # the loopback device's non-root user sets power modes through `sudo -n`
  echo "setup: installing sudo" >&2
  apt_install sudo || echo "setup: continuing without sudo; the deploy tests will be skipped" >&2
fi

if ! "$PYTHON" -c "import venv, ensurepip" 2>/dev/null; then
  echo "setup: installing python3-venv" >&2
  apt_install python3-venv python3-pip
fi

stamp="$VENV/.edge-setup-$(sha256sum < setup.py | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "setup: creating $VENV (torch 2.13.0 CPU, timm, onnx, onnxruntime, ...)" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # torch is pinned in the same resolve so that timm's torchvision cannot pull a newer torch.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[test]"
  rm -f "$VENV"/.edge-setup-*
  touch "$stamp"
fi
