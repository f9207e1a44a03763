"""Engines on the device: built from a bundle's graph with TensorRT's ONNX parser and the variant's
recorded build config, and kept in a cache keyed by what makes an engine valid.

The build is strongly typed (the precision is the graph's own: ``edge bundle`` wrote fp16 and int8
Q/DQ graphs), which is the path TensorRT 11 still builds and works the same from 10.3 on; the knobs
(workspace, optimisation level, tiling level, dynamic-batch profile, timing cache, plugin
libraries) are applied where the loaded TensorRT has them and listed as not available where not,
as ``edge build`` does (edge.trt.builder shares :func:`parser_errors` and :func:`network_flags`).

The cache (``~/.cache/edge-jetson/engines``, or ``$EDGE_JETSON_CACHE/engines``) holds
``KEY.engine`` and ``KEY.engine.json``, the latter in ``edge build``'s manifest format (version 2:
``runtime`` holds the TensorRT version and the device identity), so ``edge profile`` runs a cached
engine as it is. KEY is the sha256 of the graph's sha256, the build config (plugin and cache files
by their sha256), the builder (TensorRT's Python API here, or trtexec: jetson.trtexec), the
TensorRT version and the device identity (jetson.device.IDENTITY): another device, TensorRT,
builder or config never finds the entry. An entry whose manifest names another identity
(an engine copied in from another device) is refused; one whose engine no longer matches its
sha256 is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from jetson.bundle import GRAPH_PRECISION, BuildSpec, sha256_file
from jetson.device import IDENTITY
from jetson.errors import JetsonError
from jetson.features import TensorRTFeatures, detect_features, dims_list, load_tensorrt

if TYPE_CHECKING:
    import tensorrt

ENGINE_MANIFEST_VERSION = 2  # edge.trt.manifest.MANIFEST_VERSION: the same format
PYTHON_BUILDER, TRTEXEC_BUILDER = "python", "trtexec"
#: who builds the engines: TensorRT's Python API here (the project's builder), or NVIDIA's trtexec (jetson.trtexec)
BUILDERS = (PYTHON_BUILDER, TRTEXEC_BUILDER)


def default_cache_root() -> Path:
    return Path(os.environ.get("EDGE_JETSON_CACHE") or Path.home() / ".cache" / "edge-jetson")


def parser_errors(parser: tensorrt.OnnxParser, features: TensorRTFeatures) -> list[str]:
    """One line per parser error, naming the node (index, name, operator where TensorRT says them)."""
    lines = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        node = error.node()
        where = f"node {node}" if node >= 0 else "graph"
        if features.parser_error_node_names:
            name, op = error.node_name(), error.node_operator()
            if name or op:
                where += f" ({name or '?'}: {op or '?'})"
        lines.append(f"{where}: {error.desc()} [{error.code()}]")
    return lines


def network_flags(strongly_typed: bool, features: TensorRTFeatures) -> int:
    """``1 << STRONGLY_TYPED`` on 10.x; nothing on 11+ (the flag is deprecated there, every network strongly typed)."""
    import tensorrt as trt

    if not strongly_typed or features.always_strongly_typed:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


class Knobs(Protocol):
    """The builder knobs both builders set (edge build's BuildConfig and a bundle's BuildSpec)."""

    @property
    def workspace_mib(self) -> int: ...
    @property
    def optimization_level(self) -> int: ...
    @property
    def tiling_optimization_level(self) -> int | None: ...
    @property
    def tactic_dram_mib(self) -> int | None: ...
    @property
    def tf32(self) -> bool: ...


def configure_builder(config: tensorrt.IBuilderConfig, spec: Knobs, features: TensorRTFeatures) -> dict:
    """Set the knobs this TensorRT has; return which were honoured and which it lacks."""
    import tensorrt as trt

    honoured: dict[str, Any] = {}
    ignored: dict[str, str] = {}
    if features.memory_pool_limit:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_mib << 20)
        honoured["workspace_mib"] = spec.workspace_mib
    else:
        ignored["workspace_mib"] = "no IBuilderConfig.set_memory_pool_limit"
    if spec.tactic_dram_mib is not None:
        if features.tactic_dram_pool:
            config.set_memory_pool_limit(trt.MemoryPoolType.TACTIC_DRAM, spec.tactic_dram_mib << 20)
            honoured["tactic_dram_mib"] = spec.tactic_dram_mib
        else:
            ignored["tactic_dram_mib"] = f"TensorRT {features.version} has no MemoryPoolType.TACTIC_DRAM (8.6+)"
    if features.optimization_level:
        config.builder_optimization_level = spec.optimization_level
        honoured["optimization_level"] = spec.optimization_level
    else:
        ignored["optimization_level"] = "no builder_optimization_level"
    if spec.tiling_optimization_level is not None:
        if features.tiling_optimization_level:
            config.tiling_optimization_level = trt.TilingOptimizationLevel(spec.tiling_optimization_level)
            honoured["tiling_optimization_level"] = spec.tiling_optimization_level
        else:
            ignored["tiling_optimization_level"] = f"TensorRT {features.version} has no tiling optimisation (10.8+)"
    if not spec.tf32:  # TensorRT sets TF32 by default: fp32 matrix products in TF32 (about 1e-3 relative)
        config.clear_flag(trt.BuilderFlag.TF32)
    honoured["tf32"] = spec.tf32
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    return {"honoured": honoured, "not_available": ignored}


def _profile(builder: tensorrt.Builder, network: tensorrt.INetworkDefinition,
             spec: BuildSpec) -> tensorrt.IOptimizationProfile | None:
    """A profile for inputs with a dynamic batch: min/opt/max from the spec, or its fixed batch (1 by default)."""
    import tensorrt as trt

    dynamic = [network.get_input(i) for i in range(network.num_inputs) if -1 in dims_list(network.get_input(i).shape)]
    if not dynamic:
        return None
    if spec.min_batch is not None:
        low, mid, high = int(spec.min_batch), int(spec.opt_batch or spec.min_batch), int(spec.max_batch or 0)
    else:
        low = mid = high = spec.batch or 1
    profile = builder.create_optimization_profile()
    for tensor in dynamic:
        dims = dims_list(tensor.shape)
        if -1 in dims[1:]:
            raise JetsonError(f"input {tensor.name} has dynamic dimensions besides the batch: {dims}",
                              fix="bundle a graph exported with a fixed image size")
        shapes = [trt.Dims([b, *dims[1:]]) for b in (low, mid, high)]
        profile.set_shape(tensor.name, shapes[0], shapes[1], shapes[2])
    return profile


def progress_monitor(keep_building: Callable[[], bool], log: Callable[[str], None]) -> tensorrt.IProgressMonitor:
    """A monitor that says each top-level build phase on ``log`` and cancels the build when ``keep_building()``
    turns False: ``step_complete`` returning False stops it (TensorRT 10, pyCore.cpp's PyProgressMonitor)."""
    import tensorrt as trt

    class CancellingMonitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            if not parent_phase:
                log(f"TensorRT: {phase_name}")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return bool(keep_building())

        def phase_finish(self, phase_name: str) -> None:
            pass

    return CancellingMonitor()


def build_engine_bytes(graph: Path, spec: BuildSpec, *, plugins: Sequence[Path] = (),
                       dynamic_plugins: Sequence[Path] = (), timing_cache: Path | None = None,
                       log: Callable[[str], None] = print,
                       logger: tensorrt.ILogger | None = None,
                       keep_building: Callable[[], bool] | None = None) -> tuple[bytes, dict]:
    """Parse ``graph`` and build a serialised engine with ``spec``; the build facts for the manifest.

    ``plugins``: third-party plugin libraries, opened (:func:`open_static_plugin_library`); ``dynamic_plugins``:
    edge's own, registered through ``loadLibrary`` (:func:`load_plugin_library`); each once per process.

    ``timing_cache`` is read when it exists and written after the build (a device-local file);
    ``logger`` receives TensorRT's messages (default: warnings and errors on stderr, jetson.trt_log.stderr_logger);
    ``keep_building`` is asked at every step of the build (where this TensorRT has a progress monitor):
    False cancels it (the build then fails; the caller knows why).
    """
    if not spec.strongly_typed:  # this builder sets no precision flags and reads no calibration cache
        raise JetsonError(f"the build config of {graph} is weakly typed (precision {spec.precision} by builder flags)",
                          expected="a strongly typed config (what `edge bundle` writes: the graph holds its precision)",
                          fix="run with --builder trtexec, which passes --fp16 / --int8 --calib, or rebundle")
    trt = load_tensorrt()
    features = detect_features(trt)
    if not features.strongly_typed:
        raise JetsonError(f"TensorRT {features.version} cannot build strongly typed networks",
                          expected="TensorRT >= 8.6 (10.3 on JetPack 6)", fix="upgrade JetPack")
    started = time.perf_counter()
    if logger is None:
        from jetson.trt_log import stderr_logger

        logger = stderr_logger()
    builder = trt.Builder(logger)
    trt.init_libnvinfer_plugins(logger, "")
    for library in plugins:  # before parsing: the parser looks each plugin node up in the registry
        open_static_plugin_library(trt, library)
    for library in dynamic_plugins:
        load_plugin_library(trt, builder.get_plugin_registry(), library)
    network = builder.create_network(network_flags(spec.strongly_typed, features))
    parser = trt.OnnxParser(network, logger)
    log(f"parsing {graph}")
    if not parser.parse(graph.read_bytes(), str(graph)):
        errors = parser_errors(parser, features)
        raise JetsonError(f"TensorRT {features.version} cannot parse {graph} ({len(errors)} errors)",
                          found="\n    " + "\n    ".join(errors[:20]),
                          fix="the node named is unsupported here: bundle the graph with the plugin library it needs, "
                              "or check its opset (17+)")
    config = builder.create_builder_config()
    knobs = configure_builder(config, spec, features)
    profile = _profile(builder, network, spec)
    if profile is not None:
        config.add_optimization_profile(profile)
    cache_info: dict[str, Any] = {"path": None}
    if timing_cache is not None and features.timing_cache:
        cache_info = _use_timing_cache(config, timing_cache, log)
    if keep_building is not None and features.progress_monitor:
        config.progress_monitor = progress_monitor(keep_building, log)
    log(f"building the engine of {graph} (TensorRT tries tactics: minutes on an Orin Nano)")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise JetsonError(f"TensorRT could not build an engine from {graph}", found="see TensorRT's log above",
                          fix=f"if it ran out of memory, close other programs or bundle with a smaller workspace "
                              f"(now {spec.workspace_mib} MiB)")
    engine = bytes(serialized)
    if cache_info["path"] is not None and timing_cache is not None:
        _write_atomic(timing_cache, bytes(config.get_timing_cache().serialize()))
    return engine, {"builder": PYTHON_BUILDER, "knobs": knobs, "timing_cache": cache_info,
                    "features": features.as_dict(), "build_seconds": round(time.perf_counter() - started, 2)}


def _use_timing_cache(config: tensorrt.IBuilderConfig, path: Path, log: Callable[[str], None]) -> dict:
    """Give the build the timing cache in ``path``, or an empty one when TensorRT cannot use it: a cache
    from another TensorRT makes ``create_timing_cache`` return None ("Magic tag does not match"), one from
    another GPU makes ``set_timing_cache`` refuse it. The build then times every tactic (slower, same
    engine) and the file is replaced by this build's cache."""
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    accepted = cache is not None and config.set_timing_cache(cache, ignore_mismatch=False)
    info = {"path": str(path), "loaded_bytes": len(data), "hit": bool(data) and bool(accepted)}
    if data and not accepted:
        why = "TensorRT cannot read it" if cache is None else "it was made on another GPU"
        log(f"the timing cache {path} was not used ({why}: made by another TensorRT or device?): building with an "
            "empty one, which replaces it after the build")
        info["stale"] = why
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    return info


def cache_key(graph_sha256: str, spec: BuildSpec, file_sha256: dict[str, str], identity: dict,
              builder: str = PYTHON_BUILDER, edge_plugins_sha256: str | None = None) -> str:
    """The engine cache key: graph, build config (files by content), the builder (:data:`BUILDERS`: each
    makes engines of its own), TensorRT version and device identity, and the sha256 of edge's plugin library
    the engine is built with (jetson.plugin_build), if any."""
    build = spec.to_json()
    for field in ("timing_cache", "calibration_cache"):
        build[field] = file_sha256.get(build[field]) if build[field] else None
    build["plugins"] = [file_sha256.get(p, p) for p in build["plugins"]]
    build.pop("timing_cache")  # speeds the build up, makes no other engine
    for field in ("plugin_sources", "plugin_library"):  # by the library's sha256 below; absent: keys as before
        build.pop(field)
    key: dict = {"graph": graph_sha256, "build": build, "builder": builder,
                 "identity": {f: identity.get(f) for f in IDENTITY}}
    if edge_plugins_sha256:
        key["edge_plugins"] = edge_plugins_sha256
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class EngineCache:
    """``root/KEY.engine`` with its manifest ``root/KEY.engine.json``."""

    root: Path

    def engine_path(self, key: str) -> Path:
        return self.root / f"{key}.engine"

    def manifest_path(self, key: str) -> Path:
        return self.root / f"{key}.engine.json"

    def load(self, key: str, identity: dict, log: Callable[[str], None] = print) -> tuple[bytes, dict] | None:
        """The cached engine and its manifest; None when absent or damaged (then removed); a JetsonError
        when the entry was built for another device or TensorRT."""
        engine_path, manifest_path = self.engine_path(key), self.manifest_path(key)
        if not (engine_path.is_file() and manifest_path.is_file()):
            return None
        try:
            manifest = json.loads(manifest_path.read_text())
            expected = manifest["engine"]["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            expected, manifest = None, {}
        data = engine_path.read_bytes()
        if expected != hashlib.sha256(data).hexdigest():
            log(f"the cached engine {engine_path} does not match its manifest: rebuilding it")
            engine_path.unlink(missing_ok=True)
            manifest_path.unlink(missing_ok=True)
            return None
        built = manifest.get("runtime", {})
        different = [f for f in IDENTITY if built.get(f) != identity.get(f)]
        if different:
            raise JetsonError(f"the cached engine {engine_path} was built for another device or TensorRT",
                              expected=", ".join(f"{f} {identity.get(f)}" for f in different),
                              found=", ".join(f"{f} {built.get(f)}" for f in different),
                              fix=f"engines are not portable: delete {engine_path} (it is rebuilt here), and copy "
                                  "engines only between devices of the same identity")
        return data, manifest

    def store(self, key: str, engine: bytes, manifest: dict) -> Path:
        """Write the engine, then its manifest (an engine without a manifest is never used)."""
        path = self.engine_path(key)
        _write_atomic(path, engine)
        manifest = {**manifest, "engine": {"path": str(path), "sha256": hashlib.sha256(engine).hexdigest(),
                                           "bytes": len(engine)}}
        _write_atomic(self.manifest_path(key), (json.dumps(manifest, indent=2) + "\n").encode())
        return path


def engine_manifest(graph: Path, spec: BuildSpec, identity: dict, facts: dict, *, key: str, plugins: Sequence[Path],
                    variant: str, bundle_sha256: str, edge_plugins: dict | None = None) -> dict:
    """An engine manifest in ``edge build``'s format (edge.trt.manifest), plus where it came from;
    ``edge_plugins``: edge's plugin library it was built with (jetson.plugin_build.PluginLibrary.to_json: its
    sha256, its plugin cache key, how it came), null when none."""
    builder = facts.get("builder", PYTHON_BUILDER)
    return {"manifest_version": ENGINE_MANIFEST_VERSION, "edge": None,
            "built_by": "jetson runner" + (f" ({builder})" if builder != PYTHON_BUILDER else ""),
            "onnx": {"path": str(graph), "sha256": sha256_file(graph), "variant": GRAPH_PRECISION[spec.precision],
                     "conversion": None},
            "runtime": {**identity}, "precision": spec.precision, "strongly_typed": spec.strongly_typed,
            "config": spec.to_json(), "plugins": [str(p) for p in plugins], "edge_plugins": edge_plugins,
            "cache_key": key, "bundle": {"sha256": bundle_sha256, "variant": variant}, **facts}


#: The plugin libraries each loaded TensorRT module (each process's one) has registered, by real path: the plugin
#: registry is process-wide and ``IPluginRegistry::loadLibrary`` "will fail and return nullptr if any of the
#: plugins are already registered" (include/NvInferRuntimeCommon.h at v10.3.0, ~204-207; the same at
#: release/10.16), so a library is loaded once per process, not once per engine. Keyed by the module so that a
#: fresh ``tensorrt`` (a test's fake) starts with nothing registered, as a fresh process does.
_REGISTERED: weakref.WeakKeyDictionary[types.ModuleType, dict[str, Any]] = weakref.WeakKeyDictionary()


def _registered(trt: types.ModuleType) -> dict[str, Any]:
    return _REGISTERED.setdefault(trt, {})


def _not_yet_loaded(trt: types.ModuleType, path: str | Path) -> str | None:
    """The key (real path) under which this process registers the library ``path``; None when it already has; a
    JetsonError when the file is missing."""
    if not Path(path).is_file():
        raise JetsonError(f"the plugin library {path} does not exist", fix="make the bundle again")
    key = os.path.realpath(path)
    return None if key in _registered(trt) else key


def load_plugin_library(trt: types.ModuleType, registry: Any, path: str | Path) -> None:
    """Register the creators of one of edge's plugin libraries (``IPluginRegistry::loadLibrary``: it calls the
    library's ``getCreators``), once per process; a JetsonError naming the library when TensorRT refuses it
    (a null handle)."""
    loaded, key = _registered(trt), _not_yet_loaded(trt, path)
    if key is None:
        return
    handle = registry.load_library(str(path))
    if handle is None:
        raise JetsonError(f"TensorRT could not load the plugin library {path}", found="see TensorRT's log above "
                          "(a library built for another TensorRT or GPU, or one of its plugins already registered "
                          "by another library)",
                          fix="rebuild it for this device (bundle the sources: `edge bundle --plugins`)")
    loaded[key] = handle


def open_static_plugin_library(trt: types.ModuleType, path: str | Path) -> None:
    """Open a third-party plugin library shipped as it is (a bundle's ``build.plugins``), once per process: such
    libraries register their creators from static initialisers (``REGISTER_TENSORRT_PLUGIN``) when they are
    loaded, and export no ``getCreators`` for ``loadLibrary`` to call. So they are opened as trtexec opens its
    ``--staticPlugins`` (``dlopen(path, RTLD_LAZY | RTLD_GLOBAL)``, samples/common/sampleEngines.cpp at v10.3.0,
    ~1701) and as Polygraphy and TensorRT's Python samples do (``ctypes.CDLL``)."""
    loaded, key = _registered(trt), _not_yet_loaded(trt, path)
    if key is None:
        return
    try:
        loaded[key] = _dlopen(str(path))
    except OSError as e:
        raise JetsonError(f"the plugin library {path} could not be loaded", found=str(e),
                          fix="ship a library built for this device (aarch64, this JetPack's TensorRT and CUDA)") \
            from e


def _dlopen(path: str) -> Any:
    import ctypes

    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
