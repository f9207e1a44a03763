"""Ctrl-C, SIGTERM and SIGHUP during a run: always noted, raised only where Python will see the exception.

A signal stops a run: the runner writes what it measured (partial), puts the device back and exits
128 + N. Raising from the signal handler (as Python does for Ctrl-C) works wherever the runner's own
Python code runs, but not during a TensorRT build: ``build_serialized_network`` releases the GIL, and
while it runs Python runs only inside TensorRT's callbacks (the logger, the progress monitor, the
profiler), whose trampolines in TensorRT's bindings (``python/src/infer/pyCore.cpp``, 10.3 to 11.1:
``PyLogger::log``, ``PyProgressMonitor::stepComplete``, ``PyProfiler::reportLayerTime``) catch every
exception, print "Exception caught in log()" and go on. A handler's exception raised there is lost, and
the build (minutes on an Orin Nano) and the benchmark go on.

So inside :meth:`Interruptions.deferred` (around calls into TensorRT) the handler only notes the signal;
the build's progress monitor asks :attr:`Interruptions.noted` at every step and returns False from
``step_complete``, which cancels the build (TensorRT 10: "False to stop the build"); leaving the block
raises the noted signal. :meth:`Interruptions.check` raises a noted signal at any checkpoint (the
benchmark checks at every inference), in case a callback swallowed the handler's exception elsewhere.

What is raised: KeyboardInterrupt for SIGINT, jetson.power.Interrupted(signum) for the others, as before.
Handlers can be installed only in the main thread; elsewhere :meth:`handling` installs nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from jetson.power import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interruptions:
    """The signals a run has received (the first one is kept in :attr:`signum`)."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None
        self._deferring = 0

    @property
    def noted(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler: note the signal; raise it unless a TensorRT call is in progress. A signal after the
        first is only noted: the first one is already stopping the run, and a second raised again would land in
        whatever the stop does (putting the device back, writing the partial results). A terminal's Ctrl-C during
        a build reaches the build process twice: from the terminal, and forwarded by the runner."""
        if self.signum is not None:
            return
        self.signum = signum
        if not self._deferring:
            self.check()

    def check(self) -> None:
        """Raise the noted signal, if any."""
        if self.signum is None:
            return
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(self.signum)

    @contextmanager
    def handling(self) -> Iterator[None]:
        """:meth:`handle` for :attr:`signals` (default :data:`SIGNALS`) inside the block, the previous handlers
        after it (nestable: jetson.power.DeviceSettings installs handlers of its own, which the runner overrides
        inside it)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        saved = {signum: signal.signal(signum, self.handle) for signum in self.signals}
        try:
            yield
        finally:
            for signum, handler in saved.items():
                signal.signal(signum, handler)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside the block a signal is only noted (TensorRT's callbacks would swallow what a handler raises);
        leaving it raises the noted signal, in place of whatever the block raised (the signal explains it:
        a cancelled build returns None)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            self.check()
