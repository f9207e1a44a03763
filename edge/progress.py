"""Progress bars on stderr (never stdout, which carries ``--json`` output).

Under torchrun only the main process (rank 0) shows progress and log lines; the others are quiet.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def main_process() -> bool:
    """Whether this is the process that speaks: rank 0 of a torchrun job (``RANK``), or the only process."""
    return os.environ.get("RANK", "0") == "0"


def enabled() -> bool:
    return os.environ.get("EDGE_NO_PROGRESS", "") in ("", "0") and main_process()


def bar(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
        initial: int = 0, disable: bool = False):
    """A tqdm bar on stderr; in logs (stderr not a terminal) it refreshes every 30 s."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, file=sys.stderr,
                dynamic_ncols=True, mininterval=0.2 if tty else 30.0, disable=disable or not enabled(), leave=tty)


def log(message: str) -> None:
    """A line of human progress on stderr (from the main process only)."""
    if main_process():
        print(message, file=sys.stderr, flush=True)
