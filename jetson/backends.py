"""What each variant of a run runs on: ONNX Runtime on its graph (``--backend ort``), or TensorRT on its engine,
taken from the device's cache or built now (``--builder``: TensorRT's Python API in a child process,
jetson.build_process, or trtexec, jetson.trtexec), with edge's plugin library when its graph needs one
(jetson.plugin_build).

TensorRT, the CUDA binding, the run's TensorRT logger and trtexec are loaded once per run
(:meth:`Backends.load_tensorrt`), before the device is recorded; engines and plugin libraries once per
variant and per sources folder or library.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetson.bundle import Bundle, Variant
from jetson.errors import JetsonError
from jetson.interrupt import Interruptions
from jetson.run_options import RunOptions
from jetson.run_results import ResultsFolder


class Backends:
    """The backends of one run's variants (:meth:`make`), and the TensorRT state they share."""

    def __init__(self, options: RunOptions, bundle: Bundle, results: ResultsFolder, *, cuda_graph: bool,
                 interruptions: Interruptions, log: Callable[[str], None]) -> None:
        self.options = options
        self.bundle = bundle
        self.results = results
        self.cuda_graph = cuda_graph
        self.interruptions = interruptions
        self.log = log
        self.device: dict = {}             # jetson.device's record, set once the device is recorded
        self.cudart: Any = None
        self.trt_version: str | None = None
        self.trt_log: Any = None           # jetson.trt_log.TensorRTLog: one TensorRT logger for the whole run
        self.trtexec: tuple[str, tuple[int, ...]] | None = None  # the binary and its version (--builder trtexec)
        self.bindings_skipped: list[str] = []
        self.edge_plugins: dict[str, Any] = {}  # jetson.plugin_build.PluginLibrary per sources/library, this run

    # once per run
    def load_tensorrt(self) -> None:
        """TensorRT, the first CUDA binding that answers, the run's TensorRT logger and (--builder trtexec)
        trtexec of the same TensorRT; refused naming what is missing and the ONNX Runtime backend."""
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

    # per variant
    def make(self, variant: Variant) -> tuple[Any, dict | None]:
        """The backend for the variant (TensorRT: its engine from the cache, or built now) and the engine's facts
        (None on ONNX Runtime)."""
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
            batch=variant.build.batch, cuda_graph=self.cuda_graph, layer_runs=self.options.layer_runs,
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
            log_path = self.results.log_path(variant, "trtexec")
            self.log(f"{variant.id}: building the engine with {binary} (output: {log_path})")
            engine, facts = build_engine_with_trtexec(
                binary, version, graph, variant.build, work_dir=root / "building" / key,
                log_path=log_path, inputs=variant.inputs, timing_cache=timing_cache,
                plugins=plugins, calibration_cache=self.bundle.path(calibration) if calibration else None,
                dynamic_plugins=dynamic)
            facts["trtexec"]["log"] = str(log_path.relative_to(self.results.root))
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
                                                 log_path=self.results.nvcc_log_path())
        self.edge_plugins[source] = library
        return library
