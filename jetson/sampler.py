"""Run ``tegrastats --interval MS`` in the background and keep every line with the monotonic time
it arrived, so that a benchmark can mark its idle and timed windows with ``time.monotonic()`` and
integrate exactly those (jetson.energy). tegrastats's own clock has one-second resolution, too
coarse for 100 ms samples.

The lines also go to a log file, ``<seconds>\\t<line>`` each, which read_sampler_log reads back.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from jetson.errors import JetsonError
from jetson.tegrastats import TimedSample, parse_line

INTERVAL_MS = 100


class TegrastatsSampler:
    """``with TegrastatsSampler(log_path=...) as sampler:`` starts tegrastats and waits for its
    first line; leaving stops it (SIGTERM, then SIGKILL) also on an exception.

    ``program`` is the executable looked up on PATH (tests put a named fake there).
    """

    def __init__(self, interval_ms: int = INTERVAL_MS, *, log_path: Path | None = None,
                 program: str = "tegrastats", start_timeout_s: float = 10.0) -> None:
        if interval_ms < 1:
            raise JetsonError(f"tegrastats interval {interval_ms} ms", expected="1 ms or more")
        self.interval_ms = interval_ms
        self.log_path = log_path
        self.program = program
        self.start_timeout_s = start_timeout_s
        self._lines: list[tuple[float, str]] = []
        self._lock = threading.Condition()
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._stderr: IO[bytes] | None = None
        self._log: IO[str] | None = None
        self._stopping = False

    def __enter__(self) -> TegrastatsSampler:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(check=exc_type is None)

    def start(self) -> None:
        """Start tegrastats and wait until its first line arrives."""
        argv = [self.program, "--interval", str(self.interval_ms)]
        if self.log_path is not None:
            self._log = open(self.log_path, "w")
        self._stderr = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=self._stderr, text=True, bufsize=1,
                                             preexec_fn=_stop_with_parent())
        except FileNotFoundError:
            if self._log is not None:
                self._log.close()
            raise JetsonError(f"{self.program} was not found on PATH",
                              expected="tegrastats, which JetPack installs in /usr/bin",
                              fix="run on a Jetson, or leave power measurement off") from None
        self._reader = threading.Thread(target=self._read, name="tegrastats-reader", daemon=True)
        self._reader.start()
        if not self.wait_for(1, timeout_s=self.start_timeout_s):
            failure = self._failure() or f"no line within {self.start_timeout_s:g} s"
            self.stop(check=False)
            raise JetsonError(f"`{' '.join(argv)}` did not start sampling", found=failure,
                              fix="check that tegrastats runs on this device")

    def stop(self, *, check: bool = True) -> None:
        """Stop tegrastats; with ``check``, raise if it had died on its own while sampling."""
        process = self._process
        if process is None:
            return
        died = self._failure()
        self._stopping = True
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._stderr is not None:
            self._stderr.close()
        self._process = None
        if check and died:
            raise JetsonError("tegrastats stopped while sampling", found=died,
                              fix="see its message; power figures for this run are incomplete")

    def wait_for(self, count: int, *, timeout_s: float) -> bool:
        """Wait until ``count`` lines have arrived (False on timeout or if tegrastats died)."""
        return self._wait(lambda: len(self._lines) >= count, timeout_s)

    def wait_past(self, time_s: float, *, timeout_s: float | None = None) -> bool:
        """Wait for a line that arrived after ``time_s``, so that a window ending then is covered."""
        limit = timeout_s if timeout_s is not None else 5 + 10 * self.interval_ms / 1000
        return self._wait(lambda: bool(self._lines) and self._lines[-1][0] > time_s, limit)

    def samples(self) -> list[TimedSample]:
        """Every line so far, parsed, with its arrival time."""
        with self._lock:
            lines = list(self._lines)
        return [TimedSample(t, parse_line(line, where=f"tegrastats line {n}"))
                for n, (t, line) in enumerate(lines, start=1)]

    def _wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0 or self._failure():
                    return False
                self._lock.wait(min(left, 0.1))
            return True

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        log = self._log
        try:
            for raw in self._process.stdout:
                arrived = time.monotonic()
                if not raw.endswith("\n"):
                    break  # a line cut short when tegrastats was stopped
                line = raw.rstrip("\n")
                if not line.strip():
                    continue
                with self._lock:
                    self._lines.append((arrived, line))
                    self._lock.notify_all()
                if log is not None:
                    log.write(f"{arrived!r}\t{line}\n")
                    log.flush()
        finally:
            if log is not None:
                log.close()
            with self._lock:
                self._lock.notify_all()

    def _failure(self) -> str | None:
        """How tegrastats ended, if it ended without being asked to."""
        process = self._process
        if process is None or self._stopping or process.poll() is None:
            return None
        message = ""
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.seek(0)
            message = self._stderr.read().decode(errors="replace").strip()[-500:]
        return f"exit code {process.returncode}" + (f": {message}" if message else "")


def read_sampler_log(path: Path) -> list[TimedSample]:
    """The timed samples in a sampler's log file (``<seconds>\\t<line>`` per line)."""
    samples = []
    for n, row in enumerate(Path(path).read_text().splitlines(), start=1):
        stamp, tab, line = row.partition("\t")
        try:
            arrived = float(stamp)
        except ValueError:
            arrived = None
        if not tab or arrived is None:
            raise JetsonError(f"{path} line {n} is not <seconds><TAB><tegrastats line>", found=row[:200])
        samples.append(TimedSample(arrived, parse_line(line, where=f"{path} line {n}")))
    return samples


def _stop_with_parent() -> Callable[[], None] | None:
    """A function for the child to run before exec that asks Linux to send it SIGTERM when this
    process dies without stopping it (SIGKILL), so no sampler outlives its benchmark. libc is
    loaded here, in the parent: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))
