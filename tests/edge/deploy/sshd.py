"""A real OpenSSH server on 127.0.0.1 for the deploy tests: a fresh host key, a user key in its own
authorized_keys, and one listening port per "device". Each port is a device of its own: sshd's
``Match LocalPort`` gives it a home folder (the remote commands start there, through a
ForceCommand that runs the original command in it), the named fakes of tegrastats, nvpmodel and
jetson_clocks on PATH (tests/jetson/fakes.py, with the device's own call log and power-mode state),
an engine cache and any faults asked for (tests/edge/deploy/fake_device_python.py).

The devices log in as a NON-ROOT user, :data:`DEVICE_USER` (created here once, idempotently), as on
a Jetson: the fakes of nvpmodel and jetson_clocks refuse that user as the real ones do, and a
sudoers rule (one file per server in /etc/sudoers.d, removed when it stops) lets it run exactly
those two fakes of each device as root through ``sudo -n``; a device started with
``{NO_SUDOERS_RULE: "1"}`` has no rule, one with ``{NO_TEGRASTATS: "1"}`` no tegrastats. The fakes
and their folder belong to root (a tool the user could rewrite would be a way to root); the
device's home belongs to the user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from edge.deploy import Host, SshOptions
from tests.jetson.fakes import FakeJetson, install_fakes

SSHD = Path("/usr/sbin/sshd")
FAKE_PYTHON = Path(__file__).parent / "fake_device_python.py"
DEVICE_USER = "edge-device"
NO_SUDOERS_RULE = "NO_SUDOERS_RULE"  # a device option (not an environment variable): no sudoers rule for it
NO_TEGRASTATS = "NO_TEGRASTATS"      # a device option: no tegrastats on its PATH
SUDOERS_DIR = Path("/etc/sudoers.d")
DEVICE_SHELL = """#!/bin/sh
# FAKE device login for the deploy tests: the original command, run in this device's home folder.
cd "$FAKE_DEVICE_HOME" || exit 1
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""


def why_no_sshd() -> str | None:
    """Why the loopback devices cannot run here (None when they can)."""
    if not SSHD.is_file():
        return f"OpenSSH's sshd is not installed ({SSHD}; scripts/setup.sh installs openssh-server as root)"
    if os.geteuid() != 0:
        return (f"the loopback devices need root here: sshd accepts a key login only as root, and the tests create "
                f"the non-root device user {DEVICE_USER} and its sudoers rule")
    if shutil.which("sudo") is None or shutil.which("visudo") is None:
        return "sudo is not installed (scripts/setup.sh installs it): the device user sets power modes through sudo -n"
    try:
        device_interpreter()
    except RuntimeError as e:
        return str(e)
    return None


def device_user() -> pwd.struct_passwd:
    """The devices' login user, created once (no password login, not locked: sshd refuses a locked account)."""
    try:
        return pwd.getpwnam(DEVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", DEVICE_USER], check=True,
                       capture_output=True)
        subprocess.run(["usermod", "-p", "*", DEVICE_USER], check=True, capture_output=True)
        return pwd.getpwnam(DEVICE_USER)


@dataclass(frozen=True)
class Interpreter:
    """The Python the device user runs: this one if the user may, else the system's of the same version
    with this environment's packages on PYTHONPATH (``site_packages``)."""

    python: str
    site_packages: str | None = None


def _runs_as_device_user(python: str, site_packages: str | None) -> bool:
    env = ["env", f"PYTHONPATH={site_packages}"] if site_packages else []
    done = subprocess.run(["runuser", "-u", DEVICE_USER, "--", *env, python, "-c", "import numpy, onnx, onnxruntime"],
                          capture_output=True, cwd="/")
    return done.returncode == 0


@lru_cache(maxsize=1)
def device_interpreter() -> Interpreter:
    device_user()
    if _runs_as_device_user(sys.executable, None):
        return Interpreter(sys.executable)
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = sysconfig.get_paths()["purelib"]
    if Path(system).is_file() and _runs_as_device_user(system, site_packages):
        return Interpreter(system, site_packages)
    raise RuntimeError(f"the device user {DEVICE_USER} can run neither {sys.executable} (its folder is private) nor "
                       f"{system} with {site_packages}: install python3 of this version, or run the tests from an "
                       "environment other users may read")


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: every socket is held until all are picked (ports picked one after another, each
    socket closed first, may repeat; two devices on one port answer with the first one's Match block)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


@dataclass
class Device:
    """One port of the test sshd: a device with its home (the login user's), fakes (root's) and environment."""

    port: int
    home: Path
    fakes: FakeJetson
    env: dict[str, str] = field(default_factory=dict)
    sudoers_rule: bool = True

    @property
    def host(self) -> Host:
        return Host("127.0.0.1", DEVICE_USER, self.port)

    @property
    def cache(self) -> Path:
        return self.home / "engine-cache"

    @property
    def uid(self) -> int:
        return pwd.getpwnam(DEVICE_USER).pw_uid


@dataclass
class SshServer:
    root: Path
    process: subprocess.Popen
    devices: list[Device]
    user_key: Path
    known_hosts: Path
    python: Path            # the devices' Python (--remote-python): the FAKE device python
    shared: Path            # the folder the device user may read: wrappers, fakes, homes
    sudoers: Path | None

    def options(self, **changes) -> SshOptions:
        return SshOptions(**{"identity": self.user_key, "known_hosts": self.known_hosts, "connect_timeout_s": 5,
                             **changes})

    def log(self) -> str:
        return (self.root / "sshd.log").read_text()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        if self.sudoers is not None:
            self.sudoers.unlink(missing_ok=True)
        shutil.rmtree(self.shared, ignore_errors=True)


def sudoers_rules(devices: list[Device]) -> str:
    """The device user may run each device's two fakes as root, nothing else (NOPASSWD: ``sudo -n``)."""
    return "".join(f"{DEVICE_USER} ALL=(root) NOPASSWD: {d.fakes.bin_dir / 'nvpmodel'}, "
                   f"{d.fakes.bin_dir / 'jetson_clocks'}\n" for d in devices if d.sudoers_rule)


def install_sudoers(devices: list[Device], port: int) -> Path | None:
    text = sudoers_rules(devices)
    if not text:
        return None
    path = SUDOERS_DIR / f"edge-tests-{port}"  # sudo skips names with a dot
    staged = Path(tempfile.mkstemp(prefix="edge-tests-")[1])
    staged.write_text(f"# edge deploy tests (tests/edge/deploy/sshd.py), removed when the server stops\n{text}")
    subprocess.run(["visudo", "-c", "-q", "-f", str(staged)], check=True, capture_output=True)
    staged.chmod(0o440)
    SUDOERS_DIR.mkdir(exist_ok=True)
    shutil.move(staged, path)
    return path


def _shared_folder() -> Path:
    """A folder under /tmp that the device user may enter (pytest's own is private to root)."""
    shared = Path(tempfile.mkdtemp(prefix="edge-sshd-"))
    shared.chmod(0o755)
    return shared


def start_sshd(root: Path, faults: list[dict[str, str]]) -> SshServer:
    """sshd with one device per entry of ``faults`` (that device's extra environment, and
    :data:`NO_SUDOERS_RULE`)."""
    root.mkdir(parents=True, exist_ok=True)
    user = device_user()
    interpreter = device_interpreter()
    shared = _shared_folder()
    host_key, user_key = keygen(root / "host_key"), keygen(root / "user_key")
    (shared / "authorized_keys").write_text((root / "user_key.pub").read_text())  # sshd reads it as the user
    shell = shared / "device-shell"
    shell.write_text(DEVICE_SHELL)
    shell.chmod(0o755)
    python = shared / "device-python"
    site = f'PYTHONPATH="{interpreter.site_packages}" ' if interpreter.site_packages else ""
    python.write_text(f'#!/bin/sh\n{site}exec "{interpreter.python}" "{FAKE_PYTHON}" "$@"\n')
    python.chmod(0o755)
    public_host_key = " ".join((root / "host_key.pub").read_text().split()[:2])
    devices, blocks, known = [], [], []
    for n, (extra, port) in enumerate(zip(faults, free_ports(len(faults)), strict=True)):
        extra = dict(extra)
        rule = extra.pop(NO_SUDOERS_RULE, "") != "1"
        tegrastats = extra.pop(NO_TEGRASTATS, "") != "1"
        home = shared / f"device{n}"
        home.mkdir()
        os.chown(home, user.pw_uid, user.pw_gid)
        fakes = install_fakes(shared / f"device{n}-tools", python=interpreter.python,
                              site_packages=interpreter.site_packages)
        if not tegrastats:
            (fakes.bin_dir / "tegrastats").unlink()
        env = {**fakes.variables(), "PATH": f"{fakes.bin_dir}:/usr/local/bin:/usr/bin:/bin",
               "FAKE_DEVICE_HOME": str(home), "EDGE_JETSON_CACHE": str(home / "engine-cache"), **extra}
        devices.append(Device(port, home, fakes, env, rule))
        blocks.append(f"Match LocalPort {port}\n  SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())
                      + f"\n  ForceCommand {shell}\n")
        known.append(f"[127.0.0.1]:{port} {public_host_key}")
    sudoers = install_sudoers(devices, devices[0].port)
    known_hosts = root / "known_hosts"
    known_hosts.write_text("\n".join(known) + "\n")
    config = root / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", *(f"Port {d.port}" for d in devices), f"HostKey {host_key}", "PidFile none",
        f"AuthorizedKeysFile {shared / 'authorized_keys'}", "PermitRootLogin no", f"AllowUsers {DEVICE_USER}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "StrictModes no",  # the keys live in a test folder under /tmp, not in a home with strict modes
        "", *blocks]))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    log = open(root / "sshd.log", "wb")
    process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    server = SshServer(root, process, devices, user_key, known_hosts, python, shared, sudoers)
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
