"""What the runner prints: ``results/logs/run.log`` and stderr, kept apart so a gone terminal never stops a run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO


class RunLog:
    """Lines to ``logs/run.log`` and to stderr, each with the time since the run started.

    The file comes first and never depends on the terminal: when the SSH session that started the runner
    drops, sshd sends no SIGHUP unless it gave a pty, and the next write to stderr raises BrokenPipeError.
    Then the run goes on with the file only, and the broken stream's descriptor is pointed at /dev/null
    (:func:`detach_broken_stream`), so nothing else in the process (a print, TensorRT's std::cerr, Python's
    flush at exit) meets the broken pipe.
    """

    def __init__(self, path: Path, stream: TextIO | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a")
        self.stream: TextIO | None = stream or sys.stderr
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.start:8.1f} s] {message}"
        self.file.write(line + "\n")
        self.file.flush()
        self._show(line)

    def _show(self, line: str) -> None:
        if self.stream is None:
            return
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError) as e:  # BrokenPipeError, EIO; ValueError: the stream was closed
            detach_broken_stream(self.stream)
            self.stream = None
            self.file.write(f"[{time.monotonic() - self.start:8.1f} s] the terminal is gone ({type(e).__name__}: "
                            f"{e}): the run goes on, its lines only in this file\n")
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def detach_broken_stream(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at /dev/null (its buffered text then flushes there); nothing for a
    stream without one."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def say(text: str, stream: TextIO | None = None) -> None:
    """``text`` on ``stream`` (stderr), or nowhere when the terminal is gone (a broken pipe is not an error)."""
    stream = stream or sys.stderr
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        detach_broken_stream(stream)
