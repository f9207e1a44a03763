"""Numerical equivalence of graphs: one comparator with explicit tolerances (fp32 defaults: max
absolute error <= 1e-4 and relative L2 error <= 1e-5), and ONNX Runtime sessions to run them.

Pure numpy and ONNX Runtime (the graph passes verify each change with it); the comparison with a
PyTorch model is :mod:`edge.check.torch_compare`.

ONNX Runtime's notes (its optimiser's "UnsqueezeElimination cannot remove node ...", its
quantizer's "Please consider to run pre-processing ...") are nothing a user of edge can act on.
Our sessions log errors only; sessions other libraries create (onnx-graphsurgeon's constant
folding, the quantizer's calibration) log through ONNX Runtime's default logger, which writes to
file descriptor 2 whatever Python does. :func:`ort_messages` keeps them off the terminal: code
that lets another library create sessions runs inside it, and the lines land in
:data:`ORT_MESSAGES`, which the CLI and the pipeline write to a log with their count.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from edge.config import option


@dataclass(frozen=True)
class Tolerance:
    max_abs: float = option(1e-4, minimum=0, maximum=1e6)
    rel_l2: float = option(1e-5, minimum=0, maximum=1e6)


@dataclass
class Comparison:
    max_abs: float
    rel_l2: float
    inputs: str
    passed: bool

    def as_dict(self) -> dict:
        return asdict(self)


def compare_arrays(reference: np.ndarray, candidate: np.ndarray, tolerance: Tolerance, inputs: str) -> Comparison:
    if reference.shape != candidate.shape:
        raise ValueError(f"output shapes differ: {reference.shape} vs {candidate.shape}")
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    max_abs = float(np.abs(ref - cand).max()) if ref.size else 0.0
    rel = float(np.linalg.norm(ref - cand) / max(np.linalg.norm(ref), 1e-30))
    finite = bool(np.isfinite(cand).all())
    return Comparison(max_abs, rel, inputs, finite and max_abs <= tolerance.max_abs and rel <= tolerance.rel_l2)


def default_threads() -> int | None:
    """ONNX Runtime's threads where a caller names none: ``OMP_NUM_THREADS`` when set to a whole number (torch's
    threads follow it too), else None (ONNX Runtime's own choice: one per physical core)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


T = TypeVar("T")
R = TypeVar("R")
MAX_CALLS = 4  # calls at once, each holding a batch's activations: bounded for large models on many cores


def concurrent_calls(threads: int) -> tuple[int, int]:
    """How a run of many batches spends ``threads`` (accuracy, the accuracy gate): (calls at once on one session,
    intra-op threads of each). One-thread calls, up to :data:`MAX_CALLS` at once: on a 2-core Intel Xeon VM two
    calls of one thread each scored 6-23 % more images a second than one call of two threads (the reference
    model's float32 graph, 64 images a call, four tries), with bit-identical outputs (each call is still one whole
    batch)."""
    calls = max(1, min(threads, MAX_CALLS))
    return calls, max(1, threads // calls)


def in_order(function: Callable[[T], R], items: Iterable[T], calls: int) -> Iterator[R]:
    """``function(item)`` for every item, in the items' order; with ``calls`` > 1 that many at once on threads (an
    ONNX Runtime session runs concurrent calls, each on its calling thread), reading at most twice ``calls`` items
    ahead of the results."""
    if calls <= 1:
        yield from map(function, items)
        return
    with ThreadPoolExecutor(calls, thread_name_prefix="onnxruntime-call") as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * calls:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def ort_session(model_bytes_or_path, threads: int | None = None, spinning: bool = True,
                profile_prefix: str | None = None, config: Mapping[str, str] | None = None):
    """A CPU session with all graph optimisations; ``spinning=False``: its pool threads stop spinning when a call
    returns (they still spin within a call, between its operators, as ONNX Runtime does by default);
    ``profile_prefix``: ONNX Runtime's profiler on, its JSON written by ``session.end_profiling()``; ``config``:
    session config entries (``onnxruntime_session_options_config_keys.h``), e.g. ``session.disable_quant_qdq``.

    A graph with edge's TensorRT plugin ops runs them as their numpy references (:mod:`edge.check.plugin_ops`).
    """
    import onnxruntime as ort

    from edge.check.plugin_ops import session_model

    options = ort.SessionOptions()
    model_bytes_or_path, custom_ops = session_model(model_bytes_or_path)
    if custom_ops:
        options.register_custom_ops_library(custom_ops)
    threads = threads or default_threads()
    if threads:
        options.intra_op_num_threads = threads
    if not spinning:
        # not "session.intra_op.allow_spinning" = "0": threads that never spin sleep after every operator and
        # each call pays one wake-up per operator; on this project's 2-core VM that made the original's batch-1
        # call 5.7 ms instead of 4.5 ms, and how much it cost changed from process to process (a fast FP16
        # graph's speedup over five fresh processes: 2.28-2.43x, against 2.47-2.52x stopping after the call)
        options.add_session_config_entry("session.force_spinning_stop", "1")
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # errors only: ORT's optimiser warns about fusions it skips ("UnsqueezeElimination cannot
    # remove node ..."), which are neither errors nor anything a user of edge can act on (sessions
    # that other libraries create are kept quiet by ort_messages())
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes_or_path, options, providers=["CPUExecutionProvider"])


def run_ort(session, x: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    return session.run(None, {name: x})[0]


# ONNX Runtime's C++ log line: "<time> [W:onnxruntime:<logger>, <file>:<line> <function>] <text>";
# verbose, info and warning lines are kept, errors and fatal ones still reach the terminal
_ORT_LINE = re.compile(r"\[[VIW]:onnxruntime:")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class OrtMessages:
    """ONNX Runtime's notes this process kept off the terminal, in order."""

    lines: list[str] = field(default_factory=list)
    depth: int = 0  # nesting of ort_messages() blocks; only the outermost captures

    def take(self) -> list[str]:
        """The lines kept so far, which are then no longer kept (each is logged once)."""
        lines, self.lines = self.lines, []
        return lines


def write_ort_log(lines: list[str], path: Path) -> None:
    from edge.fileio import write_atomic

    write_atomic(("\n".join(lines) + "\n").encode(), path)


ORT_MESSAGES = OrtMessages()  # the process's ONNX Runtime log (one process, one log, like ONNX Runtime's own)


class _OrtRecords(logging.Filter):
    """Takes the records onnxruntime's Python modules log (to the root logger or their own)."""

    def __init__(self) -> None:
        super().__init__()
        import onnxruntime

        self.package = str(Path(onnxruntime.__file__).parent)

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name.startswith("onnxruntime") or record.pathname.startswith(self.package)):
            return True
        if not getattr(record, "edge_ort_kept", False):  # once, however many handlers see it
            record.edge_ort_kept = True
            ORT_MESSAGES.lines.append(f"[python:{record.levelname}:{record.name}] {record.getMessage()}")
        return False


@contextmanager
def ort_messages() -> Iterator[OrtMessages]:
    """Run a block with ONNX Runtime's notes kept in :data:`ORT_MESSAGES` instead of the terminal.

    File descriptor 2 goes to a temporary file for the block (ONNX Runtime's C++ logger writes
    there); when the block ends, its ONNX Runtime lines are kept and everything else is written to
    stderr as it came. onnxruntime's Python log records are kept too.
    """
    if ORT_MESSAGES.depth:
        yield ORT_MESSAGES
        return
    root = logging.getLogger()
    # with no handler, logging.warning() would configure the root logger for good (and print around
    # the filter): for the block, a handler that prints as logging's last resort does stands in
    stand_in = None if root.handlers else logging.StreamHandler()
    if stand_in is not None:
        stand_in.setLevel(logging.WARNING)
        root.addHandler(stand_in)
    records = _OrtRecords()
    sys.stderr.flush()
    saved = os.dup(2)
    ORT_MESSAGES.depth += 1
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            for handler in root.handlers:
                handler.addFilter(records)
            try:
                yield ORT_MESSAGES
            finally:
                for handler in root.handlers:
                    handler.removeFilter(records)
                if stand_in is not None:
                    root.removeHandler(stand_in)
                sys.stderr.flush()
                os.dup2(saved, 2)
                captured.seek(0)
                _sort_captured(captured.read().decode(errors="replace"))
    finally:
        os.close(saved)
        ORT_MESSAGES.depth -= 1


def _sort_captured(text: str) -> None:
    passed = []
    for line in text.splitlines(keepends=True):
        if _ORT_LINE.search(line):
            ORT_MESSAGES.lines.append(_ANSI.sub("", line).rstrip("\n"))
        else:
            passed.append(line)
    if passed:
        sys.stderr.write("".join(passed))
        sys.stderr.flush()


def log_ort_messages(label: str) -> None:
    """Write the ONNX Runtime notes still kept to a log file and say on stderr how many went there.

    The file is ``$EDGE_ORT_LOG``, by default ``edge-onnxruntime.log`` in the temporary folder.
    """
    lines = ORT_MESSAGES.take()
    if not lines:
        return
    path = Path(os.environ.get("EDGE_ORT_LOG") or Path(tempfile.gettempdir()) / "edge-onnxruntime.log")
    write_ort_log(lines, path)
    print(f"{label}: {len(lines)} ONNX Runtime notes (warnings about its own optimisations, not errors) "
          f"are in {path}", file=sys.stderr)
