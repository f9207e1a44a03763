"""A content-hash step cache: a step is redone only when one of its inputs or its code changed.

A step's key is the sha256 of its inputs (upstream content hashes, its settings, the package
versions, the fingerprint of the edge code that computes it), written as canonical JSON. When a
step finishes, its outputs are already in place (each written atomically by the library call that
makes it) and a marker ``STEP.done.json`` records the key, the sha256 of every output and the
step's result; the marker is written last, atomically, and the old marker is removed before a step
starts. So an interrupted step is never marked done, and a step counts as cached only if its
marker's key matches and every output still has the recorded hash.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edge import __version__
from edge.fileio import sha256_file, write_atomic
from edge.pipeline.fingerprint import code_fingerprint
from edge.runtime import versions

MARKER_SUFFIX = ".done.json"


def sha256_path(path: Path) -> str | None:
    """A file's sha256, or for a folder the sha256 over its files' relative names and hashes."""
    if path.is_file():
        return sha256_file(path)
    if not path.is_dir():
        return None
    digest = hashlib.sha256()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{item.relative_to(path).as_posix()}\0{sha256_file(item)}\n".encode())
    return digest.hexdigest()


def sha256_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class StepRecord:
    """What a step produced and whether this run did the work (``ran``) or found it (``cached``)."""

    step: str
    key: str
    status: str            # "ran" or "cached"
    seconds: float         # time spent in this run (the check only, when cached)
    work_seconds: float    # wall time the work took when it ran
    work_cpu_seconds: float  # CPU time of this process (all threads) the work took when it ran
    result: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)  # relative path -> sha256

    def summary(self) -> dict:
        return {"status": self.status, "seconds": round(self.seconds, 3), "work_seconds": round(self.work_seconds, 3),
                "work_cpu_seconds": round(self.work_cpu_seconds, 3), "key": self.key}


class StepCache:
    """Runs steps in folders; ``redo`` names steps to run even when their marker matches.

    Every key includes the package versions (:func:`versions`): a new torch, ONNX Runtime or edge
    redoes every step; and the fingerprint of the step's code (:func:`code_fingerprint`, read from
    ``code_root``, by default the installed edge): editing a cleaning pass redoes the clean step.
    """

    def __init__(self, redo: tuple[str, ...] | set[str] = (), code_root: Path | None = None) -> None:
        self.redo = set(redo)
        self.versions = versions()
        self.code_root = code_root
        self._code: dict[str, str] = {}  # step -> its code fingerprint, read once per run

    def code(self, step: str) -> str:
        if step not in self._code:
            self._code[step] = code_fingerprint(step, self.code_root)
        return self._code[step]

    def key(self, step: str, inputs: dict) -> str:
        return sha256_json({"step": step, "versions": self.versions, "code": self.code(step), "inputs": inputs})

    @staticmethod
    def marker(folder: Path, step: str) -> Path:
        return folder / f"{step}{MARKER_SUFFIX}"

    def lookup(self, folder: Path, step: str, key: str, outputs: tuple[str, ...]) -> dict | None:
        """The marker of a finished step with this key whose outputs are intact, else None."""
        if step in self.redo:
            return None
        try:
            record = json.loads(self.marker(folder, step).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if record.get("key") != key or sorted(record.get("outputs", {})) != sorted(outputs):
            return None
        if any(sha256_path(folder / name) != digest for name, digest in record["outputs"].items()):
            return None
        return record

    def run(self, folder: Path, step: str, inputs: dict, work: Callable[[], dict],
            outputs: tuple[str, ...] = (), on_start: Callable[[], None] | None = None) -> StepRecord:
        """Return the cached record of ``step`` or call ``work()`` (which writes ``outputs`` in ``folder``).

        ``on_start`` is called before the work starts (not when the step is cached).
        """
        start = time.perf_counter()
        key = self.key(step, inputs)
        record = self.lookup(folder, step, key, outputs)
        if record is not None:
            return StepRecord(step, key, "cached", time.perf_counter() - start, record["work_seconds"],
                              record.get("work_cpu_seconds", 0.0), record["result"], record["outputs"])
        folder.mkdir(parents=True, exist_ok=True)
        self.marker(folder, step).unlink(missing_ok=True)
        if on_start is not None:
            on_start()
        cpu_start = time.process_time()
        result = json.loads(json.dumps(work()))  # as a cached run will read it back
        work_seconds, work_cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        hashes = {}
        for name in outputs:
            digest = sha256_path(folder / name)
            if digest is None:
                from edge.errors import InternalError

                raise InternalError(f"pipeline step {step} did not write its output {folder / name}")
            hashes[name] = digest
        record = {"step": step, "key": key, "edge": __version__, "inputs": inputs, "outputs": hashes,
                  "result": result, "work_seconds": work_seconds, "work_cpu_seconds": work_cpu_seconds}
        write_atomic((json.dumps(record, indent=1) + "\n").encode(), self.marker(folder, step))
        return StepRecord(step, key, "ran", time.perf_counter() - start, work_seconds, work_cpu_seconds, result, hashes)
