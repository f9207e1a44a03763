"""An engine build in a child process, with its memory measured and an out-of-memory end told apart.

On an 8 GB Orin Nano the CPU and the GPU share one memory, and a TensorRT build can take all of it: the
kernel's OOM killer then sends SIGKILL to the process that holds the most, the builder. Built in the
runner's own process, that ends the whole run with no word; built here, in a fresh interpreter
(``python3 -m jetson.build_process REQUEST.json``; not a fork: CUDA cannot be used in a child forked after
the parent initialised it, and the runner has), the kill takes the child only, and the runner reports
the variant and goes on with the next one.

What the child says comes back as JSON lines on its stdout: ``{"log": text}`` (the runner's log),
``{"trt": [severity, message, level]}`` (TensorRT's messages, into the variant's TensorRT log), then
``{"done": facts}`` (the engine written to the request's ``engine`` path), ``{"error": {...},
"out_of_memory": bool}`` or ``{"interrupted": signum}``. Its stderr is the runner's.

Memory (``build_memory`` in the engine manifest and the result's ``engine``):

* ``peak_rss_mib``: the child's peak resident set (``os.wait4``'s ``ru_maxrss``): the builder's CPU-side
  memory (parsed network, weights, the engine being serialised). On a Jetson the GPU's allocations
  (``cudaMalloc``, through nvmap) are not in it;
* ``mem_available_mib``: ``MemAvailable`` of /proc/meminfo before the build, its lowest during it (sampled
  every :data:`SAMPLE_S`) and after it; ``system_use_mib`` = before - lowest is what the board gave the
  build at its peak, GPU allocations included (unified memory), plus whatever else ran meanwhile. A peak
  shorter than the sampling interval can be missed.

Signals: Ctrl-C reaches the whole foreground process group, child too; a signal sent to the runner alone
(SIGTERM, SIGHUP) is forwarded to the child. Either way the child's progress monitor cancels the build
(jetson.interrupt) and the runner, whose handler has noted the signal, raises it once the child is gone.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from jetson.bundle import DEFAULT_TACTIC_DRAM_MIB, BuildSpec
from jetson.errors import JetsonError
from jetson.interrupt import Interruptions
from jetson.power import Interrupted

SAMPLE_S = 0.05  # MemAvailable is sampled this often while the child builds
MEMINFO = "/proc/meminfo"
#: words in TensorRT's error messages when an allocation failed (TensorRT 10: "Error Code 2: OutOfMemory
#: (Requested size was N bytes.)"; the CUDA runtime's "out of memory"; a failed host new: std::bad_alloc)
OUT_OF_MEMORY_MARKERS = ("outofmemory", "out of memory", "bad_alloc", "cudaerrormemoryallocation",
                         "requested size was")
SWAP_LINES = ("sudo fallocate -l 8G /swapfile && sudo chmod 600 /swapfile && sudo mkswap /swapfile && "
              "sudo swapon /swapfile")


class BuildOutOfMemory(JetsonError):
    """The build ran out of memory: killed by the kernel, or TensorRT could not allocate."""


def out_of_memory_fix(spec: BuildSpec) -> str:
    """What to do when a build with ``spec`` ran out of memory, with the exact options."""
    workspace = max(256, spec.workspace_mib // 2)
    tactic_now = spec.tactic_dram_mib or DEFAULT_TACTIC_DRAM_MIB  # None: TensorRT's default, larger still
    tactic = max(workspace, tactic_now * 2 // 3)
    level = max(0, spec.optimization_level - 2)
    return (f"lower the workspace and the tactic memory: rebundle with `edge bundle ... --workspace {workspace} "
            f"--tactic-dram {tactic}` (now {spec.workspace_mib} and {spec.tactic_dram_mib or 'the default'} MiB); "
            f"or add swap: `{SWAP_LINES}`; or try fewer tactics: `edge bundle ... --opt-level {level}` (builder "
            f"optimisation level, now {spec.optimization_level}); and free memory: close other programs and the "
            "desktop (`sudo systemctl isolate multi-user.target`)")


def is_out_of_memory_message(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in OUT_OF_MEMORY_MARKERS)


def mem_available_mib(path: str = MEMINFO) -> float | None:
    """``MemAvailable`` in MiB, or None where the file or the field is missing (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class MemoryWatch:
    """MemAvailable before, lowest during and after a build."""

    before: float | None = field(default_factory=mem_available_mib)
    lowest: float | None = None
    after: float | None = None

    def __post_init__(self) -> None:
        self.lowest = self.before

    def sample(self) -> None:
        now = mem_available_mib()
        if now is not None and (self.lowest is None or now < self.lowest):
            self.lowest = now

    def finish(self, peak_rss_kib: int) -> dict:
        self.after = mem_available_mib()
        use = None if self.before is None or self.lowest is None else self.before - self.lowest
        return {"peak_rss_mib": round(peak_rss_kib / 1024, 1),
                "mem_available_mib": {k: None if v is None else round(v, 1)
                                      for k, v in (("before", self.before), ("lowest", self.lowest),
                                                   ("after", self.after))},
                "system_use_mib": None if use is None else round(use, 1), "sampled_every_s": SAMPLE_S,
                "meaning": "peak_rss_mib: the build process's peak resident memory (CPU side; GPU allocations "
                           "are not in it on a Jetson); system_use_mib: MemAvailable before the build minus its "
                           "lowest during it: the board's memory the build took at its peak, GPU included "
                           "(unified), plus anything else that ran meanwhile"}


# the parent's side

def child_env() -> dict[str, str]:
    """The runner's environment, with this ``jetson`` package first on the child's path."""
    package_root = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}


def build_in_child(graph: Path, spec: BuildSpec, *, plugins: Sequence[Path] = (),
                   dynamic_plugins: Sequence[Path] = (), timing_cache: Path | None = None,
                   log: Callable[[str], None], interruptions: Interruptions,
                   trt_message: Callable[[str, str, int], None] | None = None) -> tuple[bytes, dict]:
    """jetson.engine.build_engine_bytes in a child process; the engine and its build facts, with
    ``build_memory``. Call it inside ``interruptions.deferred()``: a noted signal is forwarded to the child,
    and raised by the caller's block once the child is gone. An out-of-memory end raises
    :class:`BuildOutOfMemory` (with the fix), any other failure a JetsonError."""
    with tempfile.TemporaryDirectory(prefix="edge-jetson-build-") as work:
        engine_path = Path(work) / "engine"
        request = {"graph": str(graph), "spec": spec.to_json(), "plugins": [str(p) for p in plugins],
                   "dynamic_plugins": [str(p) for p in dynamic_plugins],
                   "timing_cache": str(timing_cache) if timing_cache else None, "engine": str(engine_path)}
        (Path(work) / "request.json").write_text(json.dumps(request))
        watch = MemoryWatch()
        process = subprocess.Popen([sys.executable, "-m", "jetson.build_process", str(Path(work) / "request.json")],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=child_env())
        outcome: dict[str, Any] = {}
        try:
            status, usage = _wait(process, watch, interruptions,
                                  lambda m: _take(m, outcome, log, trt_message))
        finally:
            if process.returncode is None:  # the parent itself failed: the child must not outlive it
                process.kill()
                os.waitpid(process.pid, 0)
                process.returncode = -signal.SIGKILL
        memory = watch.finish(usage.ru_maxrss)
        log(f"build memory: peak RSS {memory['peak_rss_mib']} MiB, MemAvailable {watch.before and round(watch.before)}"
            f" -> lowest {watch.lowest and round(watch.lowest)} MiB")
        if "done" in outcome:
            return engine_path.read_bytes(), {**outcome["done"], "build_memory": memory}
        raise _failure(graph, spec, status, outcome, memory)


def _wait(process: subprocess.Popen, watch: MemoryWatch, interruptions: Interruptions,
          take: Callable[[str], None]) -> tuple[int, Any]:
    """Relay the child's lines, sample memory and forward a noted signal until the child ends; its wait
    status and resource usage (os.wait4)."""
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    forwarded = False
    while True:
        _drain(lines, take, timeout=SAMPLE_S)
        watch.sample()
        if interruptions.signum is not None and not forwarded:
            os.kill(process.pid, interruptions.signum)
            forwarded = True
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            break
    reader.join(timeout=5)
    _drain(lines, take, timeout=0)
    return status, usage


def _read_lines(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
    if stream is not None:
        for line in stream:
            lines.put(line)
        stream.close()
    lines.put(None)


def _drain(lines: queue.Queue[str | None], take: Callable[[str], None], timeout: float) -> None:
    try:
        line = lines.get(timeout=timeout) if timeout else lines.get_nowait()
        while line is not None:
            take(line)
            line = lines.get_nowait()
    except queue.Empty:
        pass


def _take(line: str, outcome: dict, log: Callable[[str], None],
          trt_message: Callable[[str, str, int], None] | None) -> None:
    """One line from the child: a log line, a TensorRT message, or its outcome."""
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict):  # something in the child printed on stdout: shown as it is
        log(line.rstrip("\n"))
    elif "log" in message:
        log(str(message["log"]))
    elif "trt" in message:
        if trt_message is not None:
            severity, text, level = message["trt"]
            trt_message(str(severity), str(text), int(level))
    else:
        outcome.update(message)


def _failure(graph: Path, spec: BuildSpec, status: int, outcome: dict, memory: dict) -> JetsonError:
    """The error for a child that gave no engine."""
    seen = (f"peak RSS {memory['peak_rss_mib']} MiB; MemAvailable {memory['mem_available_mib']['before']} MiB "
            f"before, {memory['mem_available_mib']['lowest']} MiB at the lowest")
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return BuildOutOfMemory(f"the build of {graph} was killed by SIGKILL: the kernel's out-of-memory killer, "
                                "most likely (`sudo dmesg | grep -i oom` says)", found=seen,
                                fix=out_of_memory_fix(spec))
    if "error" in outcome:
        error = outcome["error"]
        if outcome.get("out_of_memory"):
            return BuildOutOfMemory(f"TensorRT ran out of memory building {graph}",
                                    found=f"{error.get('what')} (TensorRT's log: out of memory); {seen}",
                                    fix=out_of_memory_fix(spec))
        return JetsonError(str(error.get("what")), expected=error.get("expected"), found=error.get("found"),
                           fix=error.get("fix"))
    if "interrupted" in outcome:
        return JetsonError(f"the build of {graph} was cancelled by signal {outcome['interrupted']}")
    how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
           else f"exit status {os.waitstatus_to_exitcode(status)}")
    return JetsonError(f"the build process of {graph} ended with {how} and no engine",
                       found="its messages above (stderr)", fix="report it with the run's logs")


# the child's side

def _say(message: dict) -> None:
    print(json.dumps(message), flush=True)


def child_main(request_path: str) -> int:
    """Build what ``request_path`` asks; the exit status (0 built, 1 failed, 128 + N interrupted)."""
    from jetson.engine import build_engine_bytes
    from jetson.trt_log import make_logger

    request = json.loads(Path(request_path).read_text())
    spec = BuildSpec(**{**request["spec"], "plugins": tuple(request["spec"]["plugins"])})
    out_of_memory = []

    def message(severity: str, text: str, level: int) -> None:
        if level <= 1 and is_out_of_memory_message(text):  # INTERNAL_ERROR or ERROR
            out_of_memory.append(text)
        _say({"trt": [severity, text, level]})

    interruptions = Interruptions()
    with interruptions.handling():
        try:
            with interruptions.deferred():
                engine, facts = build_engine_bytes(
                    Path(request["graph"]), spec, plugins=[Path(p) for p in request["plugins"]],
                    dynamic_plugins=[Path(p) for p in request.get("dynamic_plugins", [])],
                    timing_cache=Path(request["timing_cache"]) if request["timing_cache"] else None,
                    log=lambda text: _say({"log": text}), logger=make_logger(message),
                    keep_building=lambda: not interruptions.noted)
            Path(request["engine"]).write_bytes(engine)
            _say({"done": facts})
            return 0
        except (Interrupted, KeyboardInterrupt):
            signum = interruptions.signum or signal.SIGINT
            _say({"interrupted": signum})
            return 128 + signum
        except JetsonError as e:
            _say({"error": {"what": e.what, "expected": e.expected, "found": e.found, "fix": e.fix},
                  "out_of_memory": bool(out_of_memory)})
            return 1


if __name__ == "__main__":
    try:
        sys.exit(child_main(sys.argv[1]))
    except KeyboardInterrupt:  # the runner's forwarded Ctrl-C, after child_main put the default handler back
        sys.exit(128 + signal.SIGINT)
    except Exception:  # noqa: BLE001 - not swallowed: the traceback goes to stderr, exit 3
        traceback.print_exc()
        sys.exit(3)
