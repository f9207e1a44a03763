"""``python -m edge ARGS`` for the tests, forked from a zygote that has done the imports (tests/zygote.py).

A fresh interpreter spends 3-5 s importing torch, timm and ONNX on the 2-vCPU CI machine, and the suite runs a few
hundred ``edge`` commands: :func:`run_edge` forks each from one pre-imported process per pytest worker instead. The
command is still a process of its own (its working folder, environment, stdin from ``/dev/null``, stdout and
stderr captured, exit status or signal); it exits after its atexit handlers with its streams flushed, without
tearing its modules down (tests/zygote.py says why).

What a fork cannot give, a fresh interpreter does (:func:`run_edge` starts one):

- ``EDGE_TESTS_FRESH=1`` in the environment: every command in a fresh interpreter, as before the zygote;
- ``fresh=True``: the tests where a fresh interpreter is the point (the same bytes from two processes, each with
  its own hash seed; the imports a verb needs);
- a request whose environment changes what Python reads only at start-up (``PYTHONHASHSEED``, ``PYTHONIOENCODING``,
  ...), or a zygote that cannot fork safely.

Two commands at once (a test that starts two) need :func:`subprocess.Popen` of their own: one zygote runs one
command at a time.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Read by the interpreter at start-up only: a request that sets one of these differently gets a fresh interpreter.
STARTUP = ("PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONUNBUFFERED", "PYTHONWARNINGS",
           "PYTHONDONTWRITEBYTECODE", "PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONFAULTHANDLER", "PYTHONSAFEPATH",
           "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONHOME", "LD_PRELOAD", "LD_LIBRARY_PATH")


class Zygote:
    """One ``python -m tests.zygote`` and its two pipes."""

    def __init__(self) -> None:
        request_read, self._request = os.pipe()
        self._reply, reply_write = os.pipe()
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": path}
        # OpenMP reads this once, when torch loads it; threads that wait sleep (spinning only costs time on a shared
        # CPU, results do not change), as tests/test_readme.py asks of its commands
        self.env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", str(request_read), str(reply_write)], cwd=REPO, env=self.env,
            pass_fds=(request_read, reply_write), stdin=subprocess.DEVNULL)
        os.close(request_read)
        os.close(reply_write)
        self._buffer = b""
        line = self._line(timeout=300)
        if line != "ready":
            raise RuntimeError(f"tests/zygote.py did not start: {line!r}")

    def _line(self, timeout: float | None) -> str | None:
        """The next reply line; None when ``timeout`` seconds pass first."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._reply], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._reply, 65536)
            if not chunk:
                raise RuntimeError(f"tests/zygote.py exited ({self.process.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def startup_differs(self, env: dict[str, str]) -> bool:
        return any(env.get(name) != self.env.get(name) for name in STARTUP)

    def run(self, module: str, argv: list[str], cwd: Path, env: dict[str, str], timeout: float):
        """(status, stdout bytes, stderr bytes), or None when the zygote cannot fork this one."""
        with tempfile.TemporaryDirectory(prefix="edge-launch-") as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {"module": module, "argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                       "stderr": str(err)}
            os.write(self._request, (json.dumps(request) + "\n").encode())
            started = json.loads(self._line(timeout=60) or '{"error": "no answer in 60 s"}')
            if "error" in started:
                return None
            status = self._line(timeout=timeout)
            if status is None:
                os.killpg(started["pid"], signal.SIGKILL)
                self._line(timeout=60)
                raise subprocess.TimeoutExpired([sys.executable, "-m", module, *argv], timeout,
                                                out.read_bytes(), err.read_bytes())
            return json.loads(status)["status"], out.read_bytes(), err.read_bytes()

    def close(self) -> None:
        os.close(self._request)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


_zygote: Zygote | None = None


def zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = Zygote()
        atexit.register(_zygote.close)
    return _zygote


def _text(data: bytes) -> str:
    # as subprocess.run(text=True) decodes: the locale's encoding (UTF-8 here), universal newlines
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run_edge(argv: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 900, module: str = "edge", fresh: bool = False) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGV`` with stdin from /dev/null, stdout and stderr captured as text: forked from the
    zygote unless a fresh interpreter is asked for (``fresh``, ``EDGE_TESTS_FRESH=1``) or needed."""
    env = dict(os.environ if env is None else env)
    cwd = Path(cwd or os.getcwd()).resolve()
    args = [sys.executable, "-m", module, *argv]
    if not (fresh or os.environ.get("EDGE_TESTS_FRESH") == "1"):
        forker = zygote()
        if not forker.startup_differs(env):
            ran = forker.run(module, list(argv), cwd, env, timeout)
            if ran is not None:
                status, out, err = ran
                return subprocess.CompletedProcess(args, status, _text(out), _text(err))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout)
