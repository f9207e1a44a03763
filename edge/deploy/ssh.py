"""The system's OpenSSH client, driven with argument lists: a device's address, the options every
connection takes, remote commands built from quoted words, and the client's failures told apart.

Host keys are checked (``StrictHostKeyChecking=yes``; ``accept-new`` only when asked), nothing
prompts (``BatchMode=yes``), a silent host fails after ``ConnectTimeout`` and a dead connection
after ``ServerAliveInterval * ServerAliveCountMax``. The remote side gets one command string for its
shell: every word in it passes through :func:`shlex.quote`, so paths with spaces or shell
characters reach the device as they are and run nothing.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from edge.config import option
from edge.errors import EdgeError

SSH_FAILED = 255  # ssh's own exit status when it, not the remote command, failed
DEFAULT_CONNECT_TIMEOUT_S = 10
SHORT_COMMAND_S = 120  # a listing, a mkdir, a copy of results: never the benchmark


class DeployError(EdgeError):
    """A device could not be deployed to; ``kind`` says at which point (a fleet reports it per device)."""

    def __init__(self, kind: str, what: str, **parts: str | None) -> None:
        self.kind = kind
        super().__init__(what, **parts)


@dataclass(frozen=True)
class Host:
    """``user@address[:port]`` (an IPv6 address in brackets: ``user@[::1]:22``)."""

    address: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.user + '@' if self.user else ''}{address}" + (f":{self.port}" if self.port else "")

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}" if self.user else self.address

    @property
    def label(self) -> str:
        """A folder name for this device's results."""
        return re.sub(r"[^A-Za-z0-9_.@-]", "_", f"{self.destination}" + (f"_{self.port}" if self.port else ""))


_HOST = re.compile(r"(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^@:\s\[\]]+))(?::(?P<port>\d+))?")


def parse_host(text: str, default_port: int | None = None) -> Host:
    """A :class:`Host` from ``user@address[:port]``; ``default_port`` where it names none."""
    match = _HOST.fullmatch(text.strip())
    if not match or (match.group("name") or "").startswith("-") or (match.group("user") or "").startswith("-"):
        raise EdgeError(f"host {text!r}", expected="user@address or user@address:port (IPv6: user@[::1]:22)",
                        fix="pass e.g. --host nvidia@192.168.1.20")
    port = int(match.group("port")) if match.group("port") else default_port
    if port is not None and not 0 < port < 65536:
        raise EdgeError(f"host {text!r}: port {port}", expected="1..65535")
    return Host(match.group("v6") or match.group("name"), match.group("user"), port)


def read_hosts(path: str | Path, default_port: int | None = None) -> list[Host]:
    """The hosts of a fleet file: one ``user@address[:port]`` per line; ``#`` starts a comment."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise EdgeError(f"--hosts {path} cannot be read", found=str(e)) from e
    hosts = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            try:
                hosts.append(parse_host(text, default_port))
            except EdgeError as e:
                raise e.at(f"{path}, line {number}") from e
    if not hosts:
        raise EdgeError(f"--hosts {path} names no host", expected="one user@address[:port] per line")
    return hosts


def remote_words(*words: str | Path) -> str:
    """One shell command from words, each quoted."""
    return " ".join(shlex.quote(str(w)) for w in words)


@dataclass(frozen=True)
class SshOptions:
    """How to reach devices: the same for every device of a fleet."""

    identity: Path | None = None
    known_hosts: Path | None = None       # a known_hosts file of its own (default: ssh's, ~/.ssh/known_hosts)
    accept_new_host_key: bool = False
    connect_timeout_s: float = option(DEFAULT_CONNECT_TIMEOUT_S, above=0, maximum=3600)

    def argv(self, host: Host, *, no_stdin: bool = False) -> list[str]:
        """``ssh`` with every option and the destination, without the remote command; ``no_stdin``: ``-n`` (stdin
        from /dev/null: ssh reads none of the caller's input, so ``edge deploy ... &`` is not stopped by SIGTTIN,
        a script's input is not swallowed, and fleet threads do not share the terminal)."""
        options = {"BatchMode": "yes", "StrictHostKeyChecking": "accept-new" if self.accept_new_host_key else "yes",
                   "ConnectTimeout": str(max(1, round(self.connect_timeout_s))),
                   "ServerAliveInterval": "15", "ServerAliveCountMax": "4"}
        if self.known_hosts is not None:
            options["UserKnownHostsFile"] = f'"{self.known_hosts}"'  # ssh parses -o values as config lines
        if self.identity is not None:
            options["IdentitiesOnly"] = "yes"
        argv = ["ssh"]
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        if self.identity is not None:
            argv += ["-i", str(self.identity)]
        if host.port is not None:
            argv += ["-p", str(host.port)]
        if no_stdin:
            argv.append("-n")
        return [*argv, "--", host.destination]


class Connection:
    """Remote commands on one device; an ssh failure raises :class:`DeployError` saying why."""

    def __init__(self, host: Host, options: SshOptions) -> None:
        self.host = host
        self.options = options

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = SHORT_COMMAND_S,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``command`` (already quoted) in the login shell of the device; its output as bytes. Without
        ``stdin`` the command's input is /dev/null (``ssh -n``), never the caller's terminal or script."""
        argv = [*self.options.argv(self.host, no_stdin=stdin is None), command]
        given: dict = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, **given)
        except subprocess.TimeoutExpired as e:
            raise DeployError("unreachable", f"{self.host} did not answer within {timeout:g} s",
                              fix="check the device and the network; a dead connection ends after a minute") from e
        if done.returncode == SSH_FAILED:
            raise ssh_failure(self.host, done.stderr.decode(errors="replace"), self.options)
        if check and done.returncode != 0:
            raise DeployError("remote", f"{self.host}: `{command[:200]}` failed (exit {done.returncode})",
                              found=_tail(done.stderr))
        return done

    def hold(self, command: str, stderr: IO[bytes]) -> subprocess.Popen:
        """``command`` with pipes both ways: it reads the returned process's ``stdin`` (closing it ends the command)
        and writes lines to its ``stdout``; its stderr to ``stderr``."""
        return subprocess.Popen([*self.options.argv(self.host), command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr)

    def pipe_in(self, command: str, stderr: IO[bytes]) -> subprocess.Popen:
        """``command`` reading its stdin from the returned process's ``stdin``; its stderr to ``stderr``."""
        return subprocess.Popen([*self.options.argv(self.host), command], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=stderr)


def _tail(stderr: bytes | str, lines: int = 8) -> str:
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    return "\n".join(text.strip().splitlines()[-lines:]) or "no message"


def ssh_failure(host: Host, stderr: str, options: SshOptions) -> DeployError:
    """What ssh's own failure (exit 255) means, from its message: a changed host key, an unknown one,
    a refused key, an unreachable host, or else ssh's words as they are."""
    text = stderr.lower()
    found = _tail(stderr)
    known = f" ({options.known_hosts})" if options.known_hosts else ""
    if "host identification has changed" in text or ("host key for" in text and "has changed" in text):
        name = f"[{host.address}]:{host.port}" if host.port else host.address
        facts = [line for line in stderr.splitlines() if re.search(r"SHA256:|Offending|has changed", line)]
        return DeployError("host key mismatch", f"{host}: its host key differs from the one known_hosts{known} "
                           "holds for it: refused (the device was reinstalled, or someone is in between)",
                           found="\n".join(facts) or found,
                           fix=f"if the device was reinstalled, remove the old key (ssh-keygen -R '{name}'"
                           + (f" -f {options.known_hosts}" if options.known_hosts else "")
                           + ") and deploy with --accept-new-host-key once")
    if "host key verification failed" in text or ("host key is known" in text and "strict checking" in text):
        return DeployError("unknown host key", f"{host}: its host key is not in known_hosts{known}",
                           found=found, fix="check the key (ssh-keyscan, the device's console) and pass "
                           "--accept-new-host-key once to record it")
    if "permission denied" in text or "too many authentication failures" in text:
        return DeployError("key refused", f"{host} refused the SSH key"
                           + (f" {options.identity}" if options.identity else " (ssh's default keys)"),
                           found=found, fix="put the public key in ~/.ssh/authorized_keys on the device "
                           "(ssh-copy-id -i KEY.pub USER@HOST), or pass --identity with a key it accepts")
    unreachable = ("connection refused", "timed out", "no route to host", "network is unreachable",
                   "could not resolve hostname", "name or service not known", "connection closed",
                   "connection reset")
    if any(words in text for words in unreachable):
        return DeployError("unreachable", f"{host} is unreachable", found=found,
                           fix=f"check the address and port, that the device is on and runs sshd (connect timeout "
                           f"{options.connect_timeout_s:g} s: --connect-timeout)")
    return DeployError("ssh", f"ssh to {host} failed", found=found)
