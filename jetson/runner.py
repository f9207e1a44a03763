"""The device runner: check a bundle, record the device, build each engine (cached), benchmark it, and
write results JSON and logs. ``python3 -m jetson run`` (jetson.__main__) is its command line.

The run's parts, one module each: what it is asked and its exit codes (jetson.run_options), what it prints
(jetson.run_log), each variant's backend and engine (jetson.backends), its results folder and their formats
(jetson.run_results). This module runs them in order: the bundle and the device checked, the device
recorded, and each variant built, checked by the accuracy gate (jetson.accuracy_gate) and benchmarked with the
power mode and clocks held (jetson.power) and signals noted (jetson.interrupt).
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from jetson.accuracy_gate import check_accuracy
from jetson.backends import Backends
from jetson.bundle import Variant, read_bundle, verify_bundle
from jetson.errors import JetsonError
from jetson.interrupt import Interruptions
from jetson.power import (
    DeviceSettings,
    Interrupted,
    check_not_under_sudo,
    check_power_rights,
    query_power_mode,
)
from jetson.run_log import RunLog, say
from jetson.run_options import EXIT_FAILED, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, RunOptions
from jetson.run_results import Measurement, ResultsFolder, new_summary, now, variant_result, write_json


class Runner:
    """One run over a bundle: :meth:`run` returns the exit code."""

    def __init__(self, options: RunOptions, log: Callable[[str], None] | None = None) -> None:
        self.options = options
        self.bundle = read_bundle(options.bundle)
        self.results = ResultsFolder(Path(options.out) if options.out else self.bundle.root / "results")
        self.protocol = options.protocol(self.bundle)
        self.logger = log
        self.device: dict = {}
        self.summary: dict = {}
        self.interruptions = Interruptions()  # Ctrl-C, SIGTERM, SIGHUP: raised, or noted during TensorRT calls
        self.backends = Backends(options, self.bundle, self.results, cuda_graph=self.protocol.cuda_graph,
                                 interruptions=self.interruptions, log=self.log)

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
            self.backends.load_tensorrt()
        from jetson.device import device_record

        self.device = device_record(self.backends.cudart, self.backends.trt_version)
        self.backends.device = self.device
        if self.options.backend == "tensorrt":
            self.device["cuda_bindings_skipped"] = self.backends.bindings_skipped
        self.device["power_mode"] = self._power_mode()

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

    def done_before(self, variant: Variant) -> bool:
        return not self.options.force and self.results.done_before(variant, self.bundle.sha256, self.config_key())

    # the run
    def run(self) -> int:
        """Prepare, then each variant in turn, with the device settings held around them all."""
        self.results.root.mkdir(parents=True, exist_ok=True)
        self.summary = new_summary(self.bundle, self.options.backend)
        try:
            with self.interruptions.handling():
                self.prepare()
                self.summary.update(device=self.device, config=self.config(), config_key=self.config_key())
                self.log(f"device: {self.device.get('device_model') or self.device.get('machine')}, L4T "
                         f"{self.device.get('l4t')}, TensorRT {self.backends.trt_version}, power mode "
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
        self.summary.update(finished=now(), partial=partial, exit_code=code)
        write_json(self.results.summary_path(), self.summary)
        return code

    def run_variant(self, variant: Variant) -> None:
        """Benchmark one variant unless done before; a JetsonError fails it and the run goes on,
        an interruption writes what was measured (partial) and ends the run."""
        entry: dict[str, Any] = {"result": self.results.result_path(variant).name, "error": None}
        self.summary["variants"][variant.id] = entry
        if self.done_before(variant):
            entry["status"] = "cached"
            self.log(f"{variant.id}: done before with this bundle and config (--force recomputes it)")
            write_json(self.results.summary_path(), self.summary)
            return
        measured = Measurement()
        backend = None
        trt_log = self.backends.trt_log
        if trt_log is not None:
            trt_log.open(self.results.log_path(variant, "trt"))
        try:
            backend, engine = self.backends.make(variant)
            accuracy = check_accuracy(backend, variant.gate, self.bundle.root, variant.id, self.log)
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
            write_json(self.results.result_path(variant), result)
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
            if trt_log is not None:
                trt_log.close()
            write_json(self.results.summary_path(), self.summary)

    def write_partial(self, variant: Variant, backend: Any, measured: Measurement, error: str) -> None:
        result = self.result(variant, backend, measured, None, partial=True)
        result["error"] = error
        write_json(self.results.result_path(variant), result)

    def benchmark(self, backend: Any, variant: Variant, measured: Measurement) -> None:
        """Warm-up, then timed inferences one at a time (host monotonic clock), with tegrastats around
        an idle window and the timed window when energy is measured."""
        protocol = self.protocol
        if not self.energy_on():
            self._timed(backend, measured)
            return
        from jetson.energy import Window, summarize
        from jetson.sampler import TegrastatsSampler

        log_path = self.results.log_path(variant, "tegrastats")
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
        measured.power.update(tegrastats_log=str(log_path.relative_to(self.results.root)), timed_window_s=[start, end],
                              idle_window_s=[idle.start_s, idle.end_s] if idle else None)

    def _timed(self, backend: Any, measured: Measurement) -> tuple[float, float]:
        """Warm up, then time; the monotonic start and end of the timed window."""
        protocol = self.protocol
        # each loop stops on the elapsed time it records (one clock reading): a later reading for the stop could
        # end a 3 s window whose recorded length is just under 3 s
        t0 = time.perf_counter()
        while measured.warmup_calls < protocol.warmup or measured.warmup_seconds < (protocol.warmup_s or 0.0):
            backend.infer()
            measured.warmup_calls += 1
            measured.warmup_seconds = time.perf_counter() - t0
        timed_s = protocol.timed_s(self.energy_on())
        latencies = measured.latencies_ms
        window_start = time.monotonic()
        started = time.perf_counter()
        while len(latencies) < protocol.iterations or measured.seconds < timed_s:
            t = time.perf_counter()
            backend.infer()
            done = time.perf_counter()
            latencies.append((done - t) * 1000.0)
            measured.seconds = done - started
            self.interruptions.check()  # a signal whose exception a TensorRT callback swallowed
        return window_start, time.monotonic()

    def result(self, variant: Variant, backend: Any, measured: Measurement, engine: dict | None, *,
               partial: bool) -> dict:
        """The variant's result in ``edge profile``'s schema plus the device runner's fields (jetson.run_results)."""
        info = backend.describe() if backend is not None else {"backend": self.options.backend,
                                                               "precision": variant.precision}
        extra = {}
        if backend is not None and measured.latencies_ms and not partial:
            with self.interruptions.deferred():  # the layer profiler's callbacks run in TensorRT's trampolines
                extra = backend.report(measured.warmup_calls)  # every warm-up call, as trtexec leaves them out
        return variant_result(variant, info, measured, extra=extra,
                              weight_bytes=backend.weight_bytes() if backend is not None else None,
                              engine=engine, partial=partial, bundle_sha256=self.bundle.sha256,
                              config=self.config(), config_key=self.config_key(), logs=self.results.logs(variant))


def run(options: RunOptions, log_stream: TextIO | None = None) -> int:
    """Run the bundle with ``options``; the exit code. A bad bundle or option is exit 2 (message on stderr)."""
    try:
        runner = Runner(options)
    except JetsonError as e:
        say(f"jetson run: error: {e}", log_stream)
        return EXIT_USAGE
    log = RunLog(runner.results.run_log_path(), log_stream)
    runner.logger = log
    try:
        return runner.run()
    finally:
        log.close()
