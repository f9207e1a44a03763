"""TensorRT's own log, kept: every message of INFO or above into the current variant's file
(``logs/ID.trt.log``, one ``<seconds>\\t<SEVERITY>\\t<message>`` line each), its warnings and errors
summarised on the runner's log (the first few as they come, then a count naming the file).

TensorRT keeps the first logger a process gives it for its global messages, and holds a raw pointer
to it: so a run has one logger (:class:`TensorRTLog`), made once and kept alive for the whole run,
whose file is switched per variant (:meth:`TensorRTLog.open` / :meth:`TensorRTLog.close`).

Never ``trt.Logger``: it is pyCore's ``DefaultLogger`` (python/src/infer/pyCore.cpp, 10.3 to 11.1), which
writes to ``std::cout``, so a TensorRT warning would land on stdout before the JSON of ``edge build
--json`` or ``edge profile --json``. Where no TensorRTLog is given, :func:`stderr_logger` prints the
same lines on stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import tensorrt

ECHOED = 5  # warnings and errors repeated on the runner's log per variant; the rest are counted


def _make_logger(sink: Callable[[str, str, int], None]) -> tensorrt.ILogger:
    import tensorrt as trt

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: tensorrt.ILogger.Severity, msg: str) -> None:
            sink(severity.name, str(msg), int(severity))

    return Logger()


#: the letter pyCore's DefaultLogger prints per severity
SEVERITY_LETTERS = {"INTERNAL_ERROR": "F", "ERROR": "E", "WARNING": "W", "INFO": "I", "VERBOSE": "V"}


def stderr_logger(verbose: bool = False) -> tensorrt.ILogger:
    """A TensorRT logger printing warnings and errors (everything when ``verbose``) on stderr as
    ``[TRT] [W] message``: what ``trt.Logger`` prints, on stderr instead of stdout."""
    import tensorrt as trt

    worst_shown = int(trt.ILogger.VERBOSE if verbose else trt.ILogger.WARNING)

    def show(severity: str, message: str, level: int) -> None:
        if level <= worst_shown:
            print(f"[TRT] [{SEVERITY_LETTERS.get(severity, '?')}] {message}", file=sys.stderr, flush=True)

    return _make_logger(show)


class TensorRTLog:
    """The run's TensorRT logger (:attr:`logger`, for Builder, OnnxParser and Runtime)."""

    def __init__(self, trt: ModuleType, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self.info_level = int(trt.ILogger.INFO)
        self.warning_level = int(trt.ILogger.WARNING)
        self.logger = _make_logger(self._message)
        self.file: IO[str] | None = None
        self.path: Path | None = None
        self.counts = {"warnings": 0, "errors": 0, "messages": 0}
        self.start = time.monotonic()

    def open(self, path: Path) -> None:
        """Send the messages to ``path`` (appended: a rebuild adds to the same variant's log)."""
        self.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file, self.path = open(path, "a"), path
        self.counts = {"warnings": 0, "errors": 0, "messages": 0}

    def close(self) -> dict | None:
        """Stop writing the current file; what it received (None when none was open)."""
        if self.file is None:
            return None
        self.file.close()
        summary = {"path": str(self.path), **self.counts}
        if self.counts["warnings"] or self.counts["errors"]:
            self.echo(f"TensorRT: {self.counts['errors']} errors, {self.counts['warnings']} warnings, "
                      f"{self.counts['messages']} messages in all: {self.path}")
        self.file, self.path = None, None
        return summary

    def _message(self, severity: str, message: str, level: int) -> None:
        if level > self.info_level:  # VERBOSE: only with TensorRT's own verbose tools
            return
        if self.file is not None:
            self.file.write(f"{time.monotonic() - self.start:.3f}\t{severity}\t{message}\n")
            self.file.flush()
        self.counts["messages"] += 1
        if level <= self.warning_level:
            kind = "warnings" if level == self.warning_level else "errors"
            self.counts[kind] += 1
            if self.counts["warnings"] + self.counts["errors"] <= ECHOED:
                self.echo(f"TensorRT {severity.lower()}: {message}")
