"""A real OpenSSH server on 127.0.0.1 for the deploy tests: a fresh host key, a user key in its own
authorized_keys, and one listening port per "device". Each port is a device of its own: sshd's
``Match LocalPort`` gives it a home folder (the remote commands start there, through a
ForceCommand that runs the original command in it), the named fakes of tegrastats, nvpmodel and
jetson_clocks on PATH (tests/jetson/fakes.py, with the device's own call log and power-mode state),
an engine cache and any faults asked for (tests/edge/deploy/fake_device_python.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from edge.deploy import Host, SshOptions
from tests.jetson.fakes import FakeJetson, install_fakes

SSHD = Path("/usr/sbin/sshd")
FAKE_PYTHON = Path(__file__).parent / "fake_device_python.py"
DEVICE_SHELL = """#!/bin/sh
# FAKE device login for the deploy tests: the original command, run in this device's home folder.
cd "$FAKE_DEVICE_HOME" || exit 1
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""


def why_no_sshd() -> str | None:
    if not SSHD.is_file():
        return f"OpenSSH's sshd is not installed ({SSHD}; scripts/setup.sh installs openssh-server as root)"
    if os.geteuid() != 0:
        return "sshd needs root here to accept a key login (the tests log in as root on 127.0.0.1)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


@dataclass
class Device:
    """One port of the test sshd: a device with its home, fakes and environment."""

    port: int
    home: Path
    fakes: FakeJetson
    env: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> Host:
        return Host("127.0.0.1", "root", self.port)

    @property
    def cache(self) -> Path:
        return self.home / "engine-cache"


@dataclass
class SshServer:
    root: Path
    process: subprocess.Popen
    devices: list[Device]
    user_key: Path
    known_hosts: Path
    python: Path            # the devices' Python (--remote-python): the FAKE device python

    def options(self, **changes) -> SshOptions:
        return SshOptions(**{"identity": self.user_key, "known_hosts": self.known_hosts, "connect_timeout_s": 5,
                             **changes})

    def log(self) -> str:
        return (self.root / "sshd.log").read_text()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start_sshd(root: Path, faults: list[dict[str, str]]) -> SshServer:
    """sshd with one device per entry of ``faults`` (that device's extra environment)."""
    root.mkdir(parents=True, exist_ok=True)
    host_key, user_key = keygen(root / "host_key"), keygen(root / "user_key")
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    shell = root / "device-shell"
    shell.write_text(DEVICE_SHELL)
    shell.chmod(0o755)
    python = root / "device-python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_PYTHON}" "$@"\n')
    python.chmod(0o755)
    public_host_key = " ".join((root / "host_key.pub").read_text().split()[:2])
    devices, blocks, known = [], [], []
    for n, extra in enumerate(faults):
        port, home = free_port(), root / f"device{n}"
        fakes = install_fakes(home / "jetson")
        env = {**fakes.variables(), "PATH": f"{fakes.bin_dir}:/usr/local/bin:/usr/bin:/bin",
               "FAKE_DEVICE_HOME": str(home), "EDGE_JETSON_CACHE": str(home / "engine-cache"), **extra}
        devices.append(Device(port, home, fakes, env))
        blocks.append(f"Match LocalPort {port}\n  SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())
                      + f"\n  ForceCommand {shell}\n")
        known.append(f"[127.0.0.1]:{port} {public_host_key}")
    known_hosts = root / "known_hosts"
    known_hosts.write_text("\n".join(known) + "\n")
    config = root / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", *(f"Port {d.port}" for d in devices), f"HostKey {host_key}", "PidFile none",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "StrictModes no",  # the keys live in a test folder under /tmp, not in a home with strict modes
        "", *blocks]))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    log = open(root / "sshd.log", "wb")
    process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    server = SshServer(root, process, devices, user_key, known_hosts, python)
    deadline = time.monotonic() + 20
    for device in devices:
        while True:
            try:
                socket.create_connection(("127.0.0.1", device.port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    server.stop() if process.poll() is None else None
                    raise RuntimeError(f"sshd did not start: {server.log()}") from None
                time.sleep(0.05)
    return server
