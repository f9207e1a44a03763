"""The device runner: check a bundle, record the device, build each engine (cached), benchmark it, and
write results JSON and logs. ``python3 -m jetson run`` (jetson.__main__) is its command line.

Results (``--out``, by default ``BUNDLE/results``)::

    results/run.json              the run summary (format edge-jetson-run, version 1)
    results/NAME.PRECISION.json   one per variant and precision (format edge-jetson-result, version 1)
    results/logs/run.log          what the runner printed, with times
    results/logs/NAME.PRECISION.tegrastats.log   the tegrastats samples (``<monotonic s>\\t<line>``)
    results/logs/NAME.PRECISION.trt.log          TensorRT's own messages, INFO and above (jetson.trt_log)
    results/logs/NAME.PRECISION.trtexec.log      trtexec's whole output, with its argv (--builder trtexec)

A variant's result has the keys of ``edge profile``'s result (``backend``, ``device``,
``precision``, ``batch``, ``threads``, ``model``, ``latency``: the jetson.stats schema on the host
clock, ``warmup``, ``seconds``, ``weight_bytes``, ``peak_rss_mb``, ``clock``) and: ``variant``,
``bundle_sha256``, ``config`` and ``config_key`` (what was asked: backend, protocol, power
settings), ``partial`` (true when the benchmark stopped early: then ``error`` says why and
``latency`` covers what was measured, or is null), ``power`` (jetson.energy's PowerSummary:
energy per call (per batch) and per image, total and above idle, per rail, whether enough tegrastats
samples stand behind it (``reliable``), peak RAM and temperatures, plus
``tegrastats_log`` and the ``timed_window_s`` and ``idle_window_s`` on the log's monotonic clock, so
the figures can be checked against the samples; null without tegrastats), and per backend:
TensorRT adds ``gpu_latency`` (CUDA events), ``device_memory``, ``layers``, ``cuda_graph``,
``cuda_binding`` and ``engine`` (cache key, path, whether it was cached, ``edge_plugins``: edge's plugin
library the engine was built with, its sha256, plugin cache key and origin (jetson.plugin_build: compiled
here from the bundle's sources, nvcc's output in ``logs/plugins.nvcc.log``, or prebuilt and its stamp
checked), null when the graph needs none, build facts: ``builder`` is
``python``, TensorRT's Python API, built in a child process with its memory limits in ``knobs`` and
its peak memory in ``build_memory``: jetson.build_process, or ``trtexec``, with its argv and version); ONNX Runtime adds
``onnxruntime`` and ``providers``. ``logs`` names the variant's log files (relative to the results).
``accuracy``: the accuracy gate's verdict (jetson.accuracy_gate: ``status`` pass | wrong, the figures, the
failures), null when the bundle carries no gate; a wrong variant still exits 0: its verdict is the news.

``run.json`` holds ``bundle_sha256``, ``backend``, ``config``, ``device`` (jetson.device's record
with the power mode read from ``nvpmodel -q``), ``settings`` (the power mode set and the clocks
locked, if asked), ``variants`` (per id: ``status`` done | cached | failed | interrupted, ``result``
file, ``error``, ``accuracy`` pass | wrong | null), ``partial``, ``exit_code``, ``started`` and ``finished``.

Re-running continues: a variant whose result file holds the same bundle sha256 and config key and
is not partial is not recomputed (``status: cached``); ``--force`` recomputes everything.

Exit codes: 0 every variant done, 1 at least one variant failed (the others ran; see run.json),
2 bad usage or a bad bundle (nothing ran), 3 a bug in the runner, 128 + N when signal N
interrupted it (130: Ctrl-C), after putting the power mode and clocks back and marking the results
partial.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from jetson.accuracy_gate import check_accuracy
from jetson.bundle import Bundle, Protocol, Variant, read_bundle, verify_bundle
from jetson.engine import BUILDERS, PYTHON_BUILDER
from jetson.errors import JetsonError
from jetson.interrupt import Interruptions
from jetson.power import (
    DeviceSettings,
    Interrupted,
    check_not_under_sudo,
    check_power_rights,
    query_power_mode,
)

RUN_FORMAT, RESULT_FORMAT, FORMAT_VERSION = "edge-jetson-run", "edge-jetson-result", 1
BACKENDS = ("tensorrt", "ort")

ENERGY = ("auto", "on", "off")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


@dataclass(frozen=True)
class RunOptions:
    """What ``python3 -m jetson run`` was asked; None takes the bundle's protocol default."""

    bundle: Path
    out: Path | None = None
    backend: str = "tensorrt"
    warmup: int | None = None
    warmup_s: float | None = None
    iterations: int | None = None
    duration_s: float | None = None
    cuda_graph: bool | None = None
    idle_s: float | None = None
    energy: str = "auto"
    power_mode: str | None = None
    lock_clocks: bool = False
    variants: tuple[str, ...] = ()
    cache_dir: Path | None = None
    cuda: str | None = None
    threads: int | None = None
    layer_runs: int = 20
    force: bool = False
    nvpmodel_conf: Path | None = None  # None: the configuration nvpmodel reads (jetson.power.nvpmodel_conf_in_use)
    builder: str = PYTHON_BUILDER
    trtexec: str | None = None       # the trtexec binary (default: on PATH, else JetPack's)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise JetsonError(f"--backend {self.backend!r}", expected=f"one of {', '.join(BACKENDS)}")
        if self.builder not in BUILDERS:
            raise JetsonError(f"--builder {self.builder!r}", expected=f"one of {', '.join(BUILDERS)}")
        if self.builder != PYTHON_BUILDER and self.backend != "tensorrt":
            raise JetsonError(f"--builder {self.builder} with --backend {self.backend}",
                              expected="--builder only with --backend tensorrt (ONNX Runtime builds no engine)",
                              fix="leave out --builder, or run --backend tensorrt")
        if self.energy not in ENERGY:
            raise JetsonError(f"--energy {self.energy!r}", expected=f"one of {', '.join(ENERGY)}")

    def protocol(self, bundle: Bundle) -> Protocol:
        """The bundle's protocol with this run's overrides: --duration or --iterations is the whole timed window
        (--iterations without --duration drops the durations, the energy one too)."""
        base = bundle.protocol
        overrides: dict[str, Any] = {k: v for k, v in (("warmup", self.warmup), ("iterations", self.iterations),
                                                        ("cuda_graph", self.cuda_graph), ("idle_s", self.idle_s),
                                                        ("warmup_s", self.warmup_s))
                                     if v is not None}
        if self.duration_s is not None or self.iterations is not None:
            overrides["duration_s"] = self.duration_s
            overrides["energy_duration_s"] = None
        if self.duration_s is not None and self.iterations is None:
            overrides["iterations"] = 1
        return replace(base, **overrides)


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


def write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON, written to a temporary file and renamed (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(value, f, indent=1)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Measurement:
    """What a benchmark measured so far: kept by the caller, so an interrupted one still reports."""

    latencies_ms: list[float] = field(default_factory=list)
    warmup_calls: int = 0
    warmup_seconds: float = 0.0
    seconds: float = 0.0
    power: dict | None = None


class Runner:
    """One run over a bundle: :meth:`run` returns the exit code."""

    def __init__(self, options: RunOptions, log: Callable[[str], None] | None = None) -> None:
        self.options = options
        self.bundle = read_bundle(options.bundle)
        self.out = Path(options.out) if options.out else self.bundle.root / "results"
        self.protocol = options.protocol(self.bundle)
        self.logger = log
        self.cudart: Any = None
        self.trt_version: str | None = None
        self.trt_log: Any = None           # jetson.trt_log.TensorRTLog: one TensorRT logger for the whole run
        self.trtexec: tuple[str, tuple[int, ...]] | None = None  # the binary and its version (--builder trtexec)
        self.device: dict = {}
        self.summary: dict = {}
        self.interruptions = Interruptions()  # Ctrl-C, SIGTERM, SIGHUP: raised, or noted during TensorRT calls
        self.bindings_skipped: list[str] = []
        self.edge_plugins: dict[str, Any] = {}  # jetson.plugin_build.PluginLibrary per sources/library, this run

    def log(self, message: str) -> None:
        if self.logger is not None:
            self.logger(message)

    # what the run needs, checked before anything runs
    def prepare(self) -> None:
        from jetson.check import require_numpy

        require_numpy()
        check_not_under_sudo()
        check_power_rights(self.options.power_mode, self.options.lock_clocks)
        verify_bundle(self.bundle)
        count = len(self.bundle.variants)
        self.log(f"bundle {self.bundle.root}: {count} variant{'s' * (count != 1)}, sha256 {self.bundle.sha256[:16]}, "
                 "every file checked")
        unknown = [v for v in self.options.variants
                   if not any(v in (x.id, x.name) for x in self.bundle.variants)]
        if unknown:
            raise JetsonError(f"--variant {unknown[0]} is not in the bundle",
                              expected=f"one of {', '.join(v.id for v in self.bundle.variants)}")
        if self.options.backend == "tensorrt":
            from jetson.cuda import load_cuda_runtime
            from jetson.features import load_tensorrt

            try:
                self.trt_version = str(load_tensorrt().__version__)
            except JetsonError as e:
                raise JetsonError(e.what, expected=e.expected, found=e.found,
                                  fix=f"{e.fix}; or run the same protocol on ONNX Runtime: --backend ort") from e
            self.cudart = load_cuda_runtime(self.options.cuda, log=self._binding_skipped)
            from jetson.trt_log import TensorRTLog

            self.trt_log = TensorRTLog(load_tensorrt(), self.log)
            if self.options.builder == "trtexec":
                self.trtexec = self._find_trtexec(self.trt_version)
        from jetson.device import device_record

        self.device = device_record(self.cudart, self.trt_version)
        if self.options.backend == "tensorrt":
            self.device["cuda_bindings_skipped"] = self.bindings_skipped
        self.device["power_mode"] = self._power_mode()

    def _binding_skipped(self, why: str) -> None:
        """A CUDA binding before the one used did not answer (jetson.cuda.load_cuda_runtime): logged and recorded."""
        self.bindings_skipped.append(why)
        self.log(why)

    def _find_trtexec(self, trt_version: str) -> tuple[str, tuple[int, ...]]:
        """trtexec (--trtexec, PATH, JetPack's) and its version, which must be the Python TensorRT's: an
        engine deserialises only in the TensorRT that built it."""
        from jetson.features import parse_version
        from jetson.trtexec import JETPACK_TRTEXEC, find_trtexec, trtexec_version

        binary = find_trtexec(self.options.trtexec)
        if binary is None:
            raise JetsonError(f"--builder trtexec: {self.options.trtexec or 'trtexec'} was not found",
                              expected=f"trtexec on PATH or at {JETPACK_TRTEXEC}",
                              fix="install it (`sudo apt install tensorrt` on JetPack, or libnvinfer-bin), pass "
                                  "--trtexec PATH, or build with TensorRT's Python API: --builder python")
        python_version = parse_version(trt_version)[:3]
        version = trtexec_version(binary)
        if version is None:
            self.log(f"{binary} prints no TensorRT version: its flags are chosen for TensorRT {trt_version}")
            return binary, python_version
        if version != python_version:
            raise JetsonError(f"{binary} is TensorRT {'.'.join(map(str, version))}, the Python module TensorRT "
                              f"{trt_version}", expected="one TensorRT: an engine deserialises only in the "
                                                         "version that built it",
                              fix="pass --trtexec with the trtexec of the same TensorRT (JetPack's: "
                                  f"{JETPACK_TRTEXEC}), or --builder python")
        self.log(f"builder: {binary} (TensorRT {'.'.join(map(str, version))})")
        return binary, version

    def _power_mode(self) -> dict:
        try:
            mode = query_power_mode()
        except JetsonError as e:
            return {"name": None, "id": None, "note": e.what}
        return {"name": mode.name, "id": mode.id}

    def config(self) -> dict:
        """What a result depends on besides the bundle: a result made with another config is recomputed."""
        return {"backend": self.options.backend, "builder": self.options.builder if self.options.backend == "tensorrt"
                else None, "protocol": asdict(self.protocol),
                "power_mode": self.options.power_mode, "lock_clocks": self.options.lock_clocks,
                "energy": self.energy_on(), "threads": self.options.threads, "cuda": self.options.cuda}

    def config_key(self) -> str:
        return hashlib.sha256(json.dumps(self.config(), sort_keys=True).encode()).hexdigest()[:16]

    def energy_on(self) -> bool:
        if self.options.energy == "auto":
            import shutil

            return shutil.which("tegrastats") is not None
        return self.options.energy == "on"

    def selected(self) -> list[Variant]:
        wanted = self.options.variants
        return [v for v in self.bundle.variants if not wanted or v.id in wanted or v.name in wanted]

    def result_path(self, variant: Variant) -> Path:
        return self.out / f"{variant.id}.json"

    def done_before(self, variant: Variant) -> bool:
        path = self.result_path(variant)
        if self.options.force or not path.is_file():
            return False
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return (result.get("bundle_sha256") == self.bundle.sha256 and result.get("config_key") == self.config_key()
                and result.get("partial") is False)

    # the run
    def run(self) -> int:
        """Prepare, then each variant in turn, with the device settings held around them all."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.summary = {"format": RUN_FORMAT, "format_version": FORMAT_VERSION, "bundle": str(self.bundle.root),
                        "bundle_sha256": self.bundle.sha256, "bundle_created_by": self.bundle.created_by,
                        "backend": self.options.backend, "started": _now(), "finished": None, "device": None,
                        "settings": None, "config": None, "config_key": None, "variants": {}, "partial": True,
                        "exit_code": None}
        try:
            with self.interruptions.handling():
                self.prepare()
                self.summary.update(device=self.device, config=self.config(), config_key=self.config_key())
                self.log(f"device: {self.device.get('device_model') or self.device.get('machine')}, L4T "
                         f"{self.device.get('l4t')}, TensorRT {self.trt_version}, power mode "
                         f"{self.device['power_mode'].get('name')}; backend {self.options.backend}")
                if self.device.get("device_model_note"):
                    self.log(f"note: {self.device['device_model_note']}")
                with DeviceSettings(self.options.power_mode, self.options.lock_clocks,
                                    conf=self.options.nvpmodel_conf) as settings:
                    self.summary["settings"] = {
                        "original_mode": settings.original_mode and asdict(settings.original_mode),
                        "power_mode": settings.power_mode and asdict(settings.power_mode),
                        "clocks_locked": settings.clocks_locked,
                        "clocks": settings.clocks}  # read back after locking, and after restoring (at the end)
                    with self.interruptions.handling():  # over DeviceSettings' own handlers, which only raise
                        for variant in self.selected():
                            self.run_variant(variant)
            failed = any(v["status"] == "failed" for v in self.summary["variants"].values())
            return self.finish(EXIT_FAILED if failed else EXIT_OK, partial=failed)
        except Interrupted as e:
            self.log(f"interrupted by {signal.Signals(e.signum).name}: results so far are kept, marked partial")
            return self.finish(128 + e.signum, partial=True)
        except KeyboardInterrupt:
            self.log("interrupted (Ctrl-C): results so far are kept, marked partial")
            return self.finish(128 + signal.SIGINT, partial=True)
        except JetsonError as e:
            self.log(f"error: {e}")
            self.summary["error"] = str(e)
            return self.finish(EXIT_USAGE if not self.summary["variants"] else EXIT_FAILED, partial=True)
        except Exception as e:  # noqa: BLE001 - not swallowed: its traceback goes to the log, exit 3
            self.log(traceback.format_exc())
            self.summary["error"] = f"internal error: {type(e).__name__}: {e}"
            return self.finish(EXIT_INTERNAL, partial=True)

    def finish(self, code: int, *, partial: bool) -> int:
        self.summary.update(finished=_now(), partial=partial, exit_code=code)
        write_json(self.out / "run.json", self.summary)
        return code

    def run_variant(self, variant: Variant) -> None:
        """Benchmark one variant unless done before; a JetsonError fails it and the run goes on,
        an interruption writes what was measured (partial) and ends the run."""
        entry: dict[str, Any] = {"result": self.result_path(variant).name, "error": None}
        self.summary["variants"][variant.id] = entry
        if self.done_before(variant):
            entry["status"] = "cached"
            self.log(f"{variant.id}: done before with this bundle and config (--force recomputes it)")
            write_json(self.out / "run.json", self.summary)
            return
        measured = Measurement()
        backend = None
        if self.trt_log is not None:
            self.trt_log.open(self.log_path(variant, "trt"))
        try:
            backend, engine = self.make_backend(variant)
            accuracy = check_accuracy(backend, variant.gate, self.bundle.root, variant.id, self.log)  # jetson.accuracy_gate
            timed_s = self.protocol.timed_s(self.energy_on())
            self.log(f"{variant.id}: benchmarking (warm-up {self.protocol.warmup} calls and "
                     f"{self.protocol.warmup_s or 0:g} s, then {self.protocol.iterations} calls"
                     + (f" and at least {timed_s:g} s" if timed_s else "") + ")")
            self.benchmark(backend, variant, measured)
            result = self.result(variant, backend, measured, engine, partial=False)
            result["accuracy"], entry["accuracy"] = accuracy, accuracy and accuracy["status"]
            entry["status"] = "done"
            self.log(f"{variant.id}: median {result['latency']['median_ms']:.3f} ms, p99 "
                     f"{result['latency']['p99_ms']:.3f} ms over {result['latency']['iterations']} iterations"
                     + (f", {result['power']['rails'][result['power']['total_rail']]['energy_per_image_mj']:.2f} "
                        f"mJ per image" if result["power"] and result["power"]["total_rail"] else ""))
            if result["power"] and not result["power"]["reliable"]:
                self.log(f"{variant.id}: energy unreliable: {result['power']['unreliable']}")
            write_json(self.result_path(variant), result)
        except JetsonError as e:
            self.log(f"{variant.id}: failed: {e}")
            entry.update(status="failed", error=str(e))
            self.write_partial(variant, backend, measured, str(e))
        except (Interrupted, KeyboardInterrupt) as e:
            entry.update(status="interrupted", error=str(e) or "interrupted (Ctrl-C)")
            self.write_partial(variant, backend, measured, entry["error"])
            raise
        finally:
            if backend is not None:
                backend.close()
            if self.trt_log is not None:
                self.trt_log.close()
            write_json(self.out / "run.json", self.summary)

    def log_path(self, variant: Variant, kind: str) -> Path:
        """``logs/ID.KIND.log``: ``trt`` (TensorRT's messages), ``trtexec`` (its output), ``tegrastats``."""
        return self.out / "logs" / f"{variant.id}.{kind}.log"

    def logs(self, variant: Variant) -> dict:
        """The variant's log files that exist, by kind, relative to the results folder."""
        return {kind: str(path.relative_to(self.out)) for kind in ("trt", "trtexec", "tegrastats")
                if (path := self.log_path(variant, kind)).is_file()}

    def write_partial(self, variant: Variant, backend: Any, measured: Measurement, error: str) -> None:
        result = self.result(variant, backend, measured, None, partial=True)
        result["error"] = error
        write_json(self.result_path(variant), result)

    def make_backend(self, variant: Variant) -> tuple[Any, dict | None]:
        """The backend for the variant (TensorRT: its engine from the cache, or built now)."""
        graph = self.bundle.path(variant.graph)
        if self.options.backend == "ort":
            from jetson.ort_backend import OrtBackend

            if variant.build.needs_edge_plugins:
                raise JetsonError(f"{variant.id}: its graph holds edge's TensorRT plugin nodes (TokenDepthwiseConv), "
                                  "which ONNX Runtime on the device cannot run",
                                  fix="run it with --backend tensorrt, or bundle the graph without `edge clean "
                                      "--plugins`")

            return OrtBackend(graph, precision=variant.precision, threads=self.options.threads), None
        engine, facts = self.engine(variant)
        backend = None
        try:
            with self.interruptions.deferred():  # TensorRT logs while it deserialises
                backend = self._tensorrt_backend(variant, engine, facts)
        except BaseException:
            if backend is not None:  # made, then the noted signal raised: release its CUDA objects
                backend.close()
            raise
        return backend, facts

    def _tensorrt_backend(self, variant: Variant, engine: bytes, facts: dict) -> Any:
        from jetson.trt_backend import TensorRTEngineBackend

        static = [str(self.bundle.path(p)) for p in variant.build.plugins]
        edge_plugins = [facts["edge_plugins"]["path"]] if facts.get("edge_plugins") else []
        return TensorRTEngineBackend(
            engine, self.cudart, label=f"{variant.id} ({facts['path']})", plugins=edge_plugins,
            static_plugins=static,
            batch=variant.build.batch, cuda_graph=self.protocol.cuda_graph, layer_runs=self.options.layer_runs,
            precision=variant.precision, device=self.device.get("gpu"),
            logger=self.trt_log.logger if self.trt_log is not None else None)

    def engine(self, variant: Variant) -> tuple[bytes, dict]:
        """The variant's engine from the device's cache, else built now (by --builder) and cached."""
        from jetson.engine import EngineCache, cache_key, default_cache_root, engine_manifest

        root = Path(self.options.cache_dir) if self.options.cache_dir else default_cache_root()
        cache = EngineCache(root / "engines")
        identity = self.device["identity"]
        files = {name: entry["sha256"] for name, entry in self.bundle.files.items()}
        library = self.edge_plugin_library(variant, root)
        edge_plugins = library.to_json() if library is not None else None
        key = cache_key(variant.graph_sha256, variant.build, files, identity, self.options.builder,
                        library.sha256 if library is not None else None)
        cached = cache.load(key, identity, self.log)
        if cached is not None:
            self.log(f"{variant.id}: engine from the cache ({cache.engine_path(key)})")
            return cached[0], {"cache_key": key, "path": str(cache.engine_path(key)), "cached": True,
                               **{fact: cached[1].get(fact) for fact in ("build_seconds", "knobs", "build_memory")},
                               "edge_plugins": edge_plugins}
        plugins = [self.bundle.path(p) for p in variant.build.plugins]
        dynamic = [Path(library.path)] if library is not None else []
        device = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        timing_cache = root / "timing" / f"{device}.cache"  # per TensorRT and device; seeded from the bundle's
        if not timing_cache.exists() and variant.build.timing_cache:
            timing_cache.parent.mkdir(parents=True, exist_ok=True)
            timing_cache.write_bytes(self.bundle.path(variant.build.timing_cache).read_bytes())
        graph = self.bundle.path(variant.graph)
        if self.trtexec is not None:
            from jetson.trtexec import build_engine_with_trtexec

            binary, version = self.trtexec
            calibration = variant.build.calibration_cache
            self.log(f"{variant.id}: building the engine with {binary} (output: {self.log_path(variant, 'trtexec')})")
            engine, facts = build_engine_with_trtexec(
                binary, version, graph, variant.build, work_dir=root / "building" / key,
                log_path=self.log_path(variant, "trtexec"), inputs=variant.inputs, timing_cache=timing_cache,
                plugins=plugins, calibration_cache=self.bundle.path(calibration) if calibration else None,
                dynamic_plugins=dynamic)
            facts["trtexec"]["log"] = str(self.log_path(variant, "trtexec").relative_to(self.out))
        else:
            from jetson.build_process import build_in_child

            with self.interruptions.deferred():  # a signal is forwarded to the child, whose monitor cancels the build
                engine, facts = build_in_child(  # an OOM kill takes the child, not the run (BuildOutOfMemory)
                    graph, variant.build, plugins=plugins, dynamic_plugins=dynamic, timing_cache=timing_cache,
                    log=self.log,
                    interruptions=self.interruptions,
                    trt_message=self.trt_log.message if self.trt_log is not None else None)
        manifest = engine_manifest(graph, variant.build, identity, facts, key=key, plugins=plugins,
                                   variant=variant.id, bundle_sha256=self.bundle.sha256, edge_plugins=edge_plugins)
        path = cache.store(key, engine, manifest)
        self.log(f"{variant.id}: engine built in {facts['build_seconds']} s, cached as {path}")
        return engine, {"cache_key": key, "path": str(path), "cached": False, **facts, "edge_plugins": edge_plugins}

    def edge_plugin_library(self, variant: Variant, cache_root: Path) -> Any:
        """edge's plugin library the variant's graph needs (jetson.plugin_build.PluginLibrary), None when it needs
        none: compiled from the bundle's sources with this device's nvcc and TensorRT headers (cached under
        ``cache_root/plugins``), or the bundle's prebuilt library once its stamp matches this device. Once per
        run for each sources folder or library."""
        from jetson import plugin_build

        build = variant.build
        source = build.plugin_sources or build.plugin_library
        if not source:
            return None
        if source in self.edge_plugins:
            return self.edge_plugins[source]
        sm = (self.device.get("compute_capability") or "").replace(".", "") or None
        if build.plugin_library is not None:
            self.log(f"{variant.id}: checking the prebuilt plugin library {build.plugin_library} against this device")
            library = plugin_build.check_prebuilt(
                self.bundle.path(build.plugin_library), tensorrt=self.trt_version,
                cuda=self.device.get("cuda_runtime") or self.device.get("cuda_python_runtime"),
                l4t=self.device.get("l4t"), sm=sm, log=self.log)
        else:  # the sources (source is one of the two)
            toolchain = plugin_build.find_toolchain()
            if self.trt_version and toolchain.tensorrt.split(".")[:2] != self.trt_version.split(".")[:2]:
                raise JetsonError(f"TensorRT's headers in {toolchain.tensorrt_include} are TensorRT "
                                  f"{toolchain.tensorrt}, the Python module TensorRT {self.trt_version}",
                                  expected="the headers of the TensorRT that loads the plugins",
                                  fix="install the matching libnvinfer-dev (`sudo apt install nvidia-jetpack`), or "
                                      "point EDGE_JETSON_TENSORRT_INCLUDE at the right headers")
            library = plugin_build.build_library(self.bundle.path(source), cache_root / "plugins",
                                                 toolchain, sm=sm or plugin_build.DEFAULT_SM, log=self.log,
                                                 log_path=self.out / "logs" / "plugins.nvcc.log")
        self.edge_plugins[source] = library
        return library

    def benchmark(self, backend: Any, variant: Variant, measured: Measurement) -> None:
        """Warm-up, then timed inferences one at a time (host monotonic clock), with tegrastats around
        an idle window and the timed window when energy is measured."""
        protocol = self.protocol
        if not self.energy_on():
            self._timed(backend, measured)
            return
        from jetson.energy import Window, summarize
        from jetson.sampler import TegrastatsSampler

        log_path = self.log_path(variant, "tegrastats")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with TegrastatsSampler(protocol.tegrastats_interval_ms, log_path=log_path) as sampler:
            idle = None
            if protocol.idle_s > 0:
                idle_start = time.monotonic()
                time.sleep(protocol.idle_s)
                idle = Window(idle_start, time.monotonic())
            start, end = self._timed(backend, measured)
            sampler.wait_past(end)
            samples = sampler.samples()
        batch = int(backend.describe().get("batch") or 1)
        measured.power = summarize(samples, Window(start, end), len(measured.latencies_ms), idle, batch=batch,
                                   interval_ms=protocol.tegrastats_interval_ms).to_json()
        measured.power.update(tegrastats_log=str(log_path.relative_to(self.out)), timed_window_s=[start, end],
                              idle_window_s=[idle.start_s, idle.end_s] if idle else None)

    def _timed(self, backend: Any, measured: Measurement) -> tuple[float, float]:
        """Warm up, then time; the monotonic start and end of the timed window."""
        protocol = self.protocol
        t0 = time.perf_counter()
        while measured.warmup_calls < protocol.warmup or time.perf_counter() - t0 < (protocol.warmup_s or 0.0):
            backend.infer()
            measured.warmup_calls += 1
            measured.warmup_seconds = time.perf_counter() - t0
        timed_s = protocol.timed_s(self.energy_on())
        latencies = measured.latencies_ms
        window_start = time.monotonic()
        started = time.perf_counter()
        while len(latencies) < protocol.iterations or time.perf_counter() - started < timed_s:
            t = time.perf_counter()
            backend.infer()
            latencies.append((time.perf_counter() - t) * 1000.0)
            measured.seconds = time.perf_counter() - started
            self.interruptions.check()  # a signal whose exception a TensorRT callback swallowed
        return window_start, time.monotonic()

    def result(self, variant: Variant, backend: Any, measured: Measurement, engine: dict | None, *,
               partial: bool) -> dict:
        """The variant's result in ``edge profile``'s schema plus the device runner's fields."""
        from jetson.stats import latency_stats  # numpy: imported once the run needs it (`jetson check` reports it)

        info = backend.describe() if backend is not None else {"backend": self.options.backend,
                                                               "precision": variant.precision}
        batch = int(info.get("batch") or 1)
        latencies = measured.latencies_ms
        extra = {}
        if backend is not None and latencies and not partial:
            with self.interruptions.deferred():  # the layer profiler's callbacks run in TensorRT's trampolines
                extra = backend.report(measured.warmup_calls)  # every warm-up call, as trtexec leaves them out
        return {
            "format": RESULT_FORMAT, "format_version": FORMAT_VERSION,
            "variant": variant.name, "id": variant.id, **info, "precision": variant.precision,
            "latency": latency_stats(latencies, batch) if latencies else None,
            "warmup": {"iterations": measured.warmup_calls, "seconds": measured.warmup_seconds},
            "seconds": measured.seconds,
            "weight_bytes": backend.weight_bytes() if backend is not None else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "clock": "time.perf_counter (device host clock, synchronous calls)",
            **extra,
            "engine": engine,
            "power": measured.power,
            "partial": partial,
            "bundle_sha256": self.bundle.sha256, "config": self.config(), "config_key": self.config_key(),
            "graph": variant.graph, "graph_sha256": variant.graph_sha256,
            "logs": self.logs(variant),
            "finished": _now(),
        }


def run(options: RunOptions, log_stream: TextIO | None = None) -> int:
    """Run the bundle with ``options``; the exit code. A bad bundle or option is exit 2 (message on stderr)."""
    try:
        runner = Runner(options)
    except JetsonError as e:
        say(f"jetson run: error: {e}", log_stream)
        return EXIT_USAGE
    log = RunLog(runner.out / "logs" / "run.log", log_stream)
    runner.logger = log
    try:
        return runner.run()
    finally:
        log.close()
