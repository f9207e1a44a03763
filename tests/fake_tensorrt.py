"""FakeTensorRT: a stand-in for the ``tensorrt`` module, for unit tests of the builder and backend logic.

NOT TensorRT. It builds nothing and measures nothing: it mimics the Python API surface that
edge uses (names and signatures as in tensorrt-stubs 10.13) and records what it was asked, so
tests can check the calls edge makes. Where it mirrors behaviour, the source is TensorRT's Python
bindings, ``python/src/infer/pyCore.cpp`` at v10.3.0 (the same code at v10.13.0 and v11.1):

* ``trt.Logger`` is pyCore's ``DefaultLogger``: it prints ``[MM/DD/YYYY-HH:MM:SS] [TRT] [W] msg`` on
  **stdout** (``std::cout``) for messages at or above its severity;
* the trampolines ``PyLogger::log``, ``PyProfiler::reportLayerTime`` and ``PyProgressMonitor::phaseStart/
  stepComplete/phaseFinish`` catch every exception a Python callback raises (KeyboardInterrupt too),
  print ``[ERROR] Exception caught in log(): ...`` on stderr and go on; ``stepComplete`` then returns
  False, and a False from ``step_complete`` cancels the build (``build_serialized_network`` -> None);
* ``build_serialized_network`` releases the GIL (``py::gil_scoped_release``): while it runs, Python runs
  only inside those callbacks, so a signal's Python handler runs there and what it raises is swallowed.
  The fake blocks SIGINT, SIGTERM and SIGHUP for the calling thread while it "builds" and unblocks them
  only around each callback (``build_seconds`` makes the build last that long in steps);
* a build that runs out of memory: ``build_serialized_network`` logs TensorRT 10's "Error Code 2:
  OutOfMemory (Requested size was N bytes.)" and returns None (``fail_build``, or the graph named in
  :data:`OUT_OF_MEMORY_VARIABLE` with ``none``), or the process is killed by SIGKILL as the kernel's OOM
  killer does (the graph named there with ``killed``: only where the build runs in a child process);
* ``create_timing_cache`` returns None for bytes it cannot read (a cache from another TensorRT: "Magic tag
  does not match"), ``create_execution_context`` returns None when it cannot allocate (``fail_contexts``).

Two feature sets, each as the real release has it:

* ``"10.3"``: strongly typed networks on request (``STRONGLY_TYPED`` = 1), precision builder
  flags (FP16/INT8/...), the INT8 calibrator classes and the calibration profile, no tiling
  optimisation (10.8+); the engine inspector lists ``"Bindings"``;
* ``"11.0"``: strongly typed always (``STRONGLY_TYPED`` = 0, deprecated and ignored), no precision
  builder flags but TF32 (still there), no calibrators, tiling optimisation, editable timing
  cache; the engine inspector lists ``"I/O Tensors"``.

Execution runs against FakeCudaRuntime (tests/fake_cuda.py): the execution context checks that
every I/O tensor has a live device buffer large enough for its shape, and an enqueue advances
the fake GPU clock (or is captured into a CUDA graph); the builder calibrates by reading the
batches a legacy calibrator hands over. Plugins: TensorRT's own (``init_libnvinfer_plugins``) and
libraries loaded into the plugin registry are per module, as they are per process, and an engine
that used them does not deserialise in a fresh module that lacks them.

The "engine" it serialises is JSON describing the request, prefixed ``FAKE-ENGINE``. Its outputs: an
enqueue (not a CUDA graph replay) runs the parsed ONNX file in ONNX Runtime on the input buffers and writes
the output buffers, so the accuracy gate sees what a correct engine computes. ``FAKE_TENSORRT_WRONG_OUTPUTS``
(comma-separated variant ids ``NAME.PRECISION``, matched against the parsed file ``.../NAME/PRECISION.onnx``)
makes those engines write their outputs negated: the top-1 becomes the reference's lowest score.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from tests.fake_cuda import FakeCudaRuntime


class _Enum:
    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def __int__(self) -> int:
        return self.value

    def __eq__(self, other) -> bool:
        return isinstance(other, _Enum) and (self.name, self.value) == (other.name, other.value)

    def __hash__(self) -> int:
        return hash((self.name, self.value))

    def __repr__(self) -> str:
        return self.name


def _enum(name: str, members: list[str] | dict[str, int]) -> type:
    values = members if isinstance(members, dict) else {m: i for i, m in enumerate(members)}
    return type(name, (), {m: _Enum(m, v) for m, v in values.items()})


class Dims:
    def __init__(self, values) -> None:
        self.values = [int(v) for v in values]

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> int:
        return self.values[i]


#: ONNX element type -> (TensorRT DataType name, numpy type)
_DTYPES = {"FLOAT": ("FLOAT", np.float32), "FLOAT16": ("HALF", np.float16), "INT8": ("INT8", np.int8),
           "INT32": ("INT32", np.int32), "INT64": ("INT64", np.int64), "BOOL": ("BOOL", np.bool_)}
#: the fake's layers and what each "takes" per inference on the fake GPU clock
FAKE_LAYERS = {"fake gemm": 0.75, "fake norm": 0.25}
WRONG_OUTPUTS = "FAKE_TENSORRT_WRONG_OUTPUTS"  # variant ids whose engines compute wrong outputs (docstring)


def _graph_session(graph: str | None):
    """ONNX Runtime on the engine's ONNX file; None without one, or when ONNX Runtime cannot load it (a
    plugin op): such an engine leaves its output buffers as they are."""
    if not graph or not Path(graph).is_file():
        return None
    import onnxruntime as ort

    try:
        return ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - ONNX Runtime raises its own types, all meaning "cannot load"
        return None


def _wrong(graph: str) -> bool:
    path = Path(graph)
    return f"{path.parent.name}.{path.stem}" in os.environ.get(WRONG_OUTPUTS, "").split(",")


#: module attributes that only the fake has: what it records for the tests
FAKE_RECORDS = ("FAKE", "calls", "cuda", "plugin_libraries", "builtin_plugins", "contexts", "plugin_creators")
#: the signals a native call holds back from Python until a callback runs (see the module docstring)
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
BUILD_STEP_S = 0.05  # one step of a slow fake build
#: ``GRAPH:FORM[,GRAPH:FORM...]``: a build whose ONNX path contains GRAPH (e.g. ``graphs/b/``) runs out of
#: memory; FORM ``none``: build_serialized_network returns None after TensorRT's out-of-memory message,
#: ``killed``: the building process is sent SIGKILL (what the kernel's OOM killer does). Read at each
#: build, so it reaches the device runner's build process through the environment.
#: what tests/jetson/bin/fake_nvcc (FakeNvcc) writes at the start of a "library": the registry below reads the JSON
#: after it and registers the plugin creators it names, as IPluginRegistry::loadLibrary registers getCreators'
FAKE_NVCC_MAGIC = b"\x7fELF\x02\x01\x01\x00FAKE-NVCC-OUTPUT\n"
#: edge's plugin ops (jetson.plugin_build.PLUGIN_OPS): the ONNX parser imports such a node only through a
#: creator of that name in the registry (else "Plugin not found", as TensorRT's fallback importer says)
EDGE_PLUGIN_OPS = ("TokenDepthwiseConv",)
OUT_OF_MEMORY_VARIABLE = "FAKE_TENSORRT_OUT_OF_MEMORY"
OUT_OF_MEMORY_FORMS = ("none", "killed")


def out_of_memory_form(graph_path: str | None) -> str | None:
    """The form in which the build of ``graph_path`` runs out of memory (:data:`OUT_OF_MEMORY_VARIABLE`)."""
    for entry in filter(None, os.environ.get(OUT_OF_MEMORY_VARIABLE, "").split(",")):
        graph, _, form = entry.rpartition(":")
        if form not in OUT_OF_MEMORY_FORMS:
            raise ValueError(f"{OUT_OF_MEMORY_VARIABLE}={entry!r}: the form is one of {OUT_OF_MEMORY_FORMS}")
        if graph_path is not None and graph and graph in graph_path:
            return form
    return None


@contextmanager
def _native_call():
    """The calling thread inside C++ with the GIL released: signals wait (blocked) until Python runs."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _callback(name: str, method, *args, on_exception=None):
    """pyCore's trampoline for a Python callback: a held signal is delivered now (``pthread_sigmask`` runs
    the pending Python handlers before it returns), and any exception is printed and dropped."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
        try:
            return method(*args)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # blocked again inside a native call only
    except BaseException as e:  # noqa: BLE001 - pyCore's catch (...): that is the behaviour mirrored
        print(f"[ERROR] Exception caught in {name}(): {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return on_exception


def make_fake_tensorrt(feature_set: str = "10.3", unsupported_ops: tuple[str, ...] = (),
                       fail_build: bool = False, plugin_layers: tuple[str, ...] = (),
                       cuda: FakeCudaRuntime | None = None, build_seconds: float = 0.0,
                       fail_contexts: int = 0) -> types.ModuleType:
    """A FakeTensorRT module of the given feature set.

    ``unsupported_ops`` make the parser fail on them; ``plugin_layers`` are ops the parser imports
    as TensorRT's own plugins (they need ``init_libnvinfer_plugins`` at build and at load time);
    ``cuda`` is the FakeCudaRuntime the engine runs on and calibration reads from (``m.cuda``);
    ``build_seconds``: each build takes that long, in steps of :data:`BUILD_STEP_S` reported to the
    progress monitor and the logger; ``fail_contexts``: the first that many ``create_execution_context``
    calls return None (out of device memory).
    """
    legacy = feature_set.startswith("10.")
    version = {"10.3": "10.3.0.30", "11.0": "11.0.0.114"}[feature_set]
    m = types.ModuleType("tensorrt")
    m.__version__ = version
    m.FAKE = True
    m.calls = []  # every notable call, for the tests (FAKE_RECORDS: the fake's own module attributes)
    m.cuda = cuda or FakeCudaRuntime()
    m.plugin_libraries = []  # the process-wide plugin registry
    m.builtin_plugins = False  # init_libnvinfer_plugins was called
    m.plugin_creators = set()  # creators registered by libraries (FakeNvcc's records), by plugin name
    m.contexts = 0  # create_execution_context calls
    flag_names = ["DEBUG", "GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "TF32", "SPARSE_WEIGHTS", "DIRECT_IO"]
    if legacy:
        flag_names += ["FP16", "BF16", "INT8", "FP8", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS"]
        m.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED"])
    else:
        flag_names += ["EDITABLE_TIMING_CACHE"]
        m.TilingOptimizationLevel = lambda level: _Enum(f"TILING_{level}", level)
        # TensorRT 11: STRONGLY_TYPED is 0, deprecated and ignored (every network is strongly typed)
        m.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", [
            "STRONGLY_TYPED", "PREFER_JIT_PYTHON_PLUGINS", "PREFER_AOT_PYTHON_PLUGINS"])
    m.BuilderFlag = _enum("BuilderFlag", flag_names)
    m.MemoryPoolType = _enum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM", "TACTIC_DRAM"])
    m.ProfilingVerbosity = _enum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "NONE", "DETAILED"])
    m.LayerInformationFormat = _enum("LayerInformationFormat", ["ONELINE", "JSON"])
    m.TensorIOMode = _enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    m.DataType = _enum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "FP8", "BF16", "INT64"])
    m.Dims = Dims
    numpy_types = {name: kind for name, kind in _DTYPES.values()}
    m.nptype = lambda dtype: numpy_types[dtype.name]

    def init_libnvinfer_plugins(logger, namespace: str) -> bool:
        m.calls.append(("init_libnvinfer_plugins", namespace))
        m.builtin_plugins = True
        return True

    m.init_libnvinfer_plugins = init_libnvinfer_plugins
    def load_library(path: str):
        """IPluginRegistry::loadLibrary: None when the file cannot be opened (dlopen fails); a FakeNvcc library's
        creators are registered (its getCreators). The registry is process-wide, and loadLibrary "will fail and
        return nullptr if any of the plugins are already registered" (include/NvInferRuntimeCommon.h at v10.3.0,
        ~204-207, the same at release/10.16): a second load of the same creators (the same library again, or
        another holding one of its creators) returns None."""
        m.calls.append(("load_library", path))
        try:
            data = Path(path).read_bytes()
        except OSError:
            return None
        creators = set(json.loads(data[len(FAKE_NVCC_MAGIC):])["creators"]) if data.startswith(FAKE_NVCC_MAGIC) \
            else {f"creators of {Path(path).resolve()}"}  # another library: its creators are its own
        if creators & m.plugin_creators:
            m.calls.append(("error", "loadLibrary: a plugin creator is already registered"))
            return None
        m.plugin_creators.update(creators)
        m.plugin_libraries.append(path)
        return ("handle", path)

    def get_creator(name: str, version: str, namespace: str = ""):
        """IPluginRegistry::getCreator: the creator registered under ``name`` (None when none is)."""
        return types.SimpleNamespace(name=name, plugin_version=version, plugin_namespace=namespace) \
            if name in m.plugin_creators else None

    registry = types.SimpleNamespace(load_library=load_library, get_creator=get_creator)

    severity = _enum("Severity", {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4})

    class ILogger:
        """A user's logger subclasses it and overrides ``log``; the fake's builder, parser and runtime call
        ``log`` with (a few of) the messages real TensorRT 10 writes at the same points."""

        Severity = severity
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = (severity.INTERNAL_ERROR, severity.ERROR, severity.WARNING,
                                                         severity.INFO, severity.VERBOSE)

        def __init__(self) -> None:
            pass

        def log(self, severity, msg: str) -> None:
            pass

    class Logger(ILogger):
        """pyCore's DefaultLogger: messages at ``min_severity`` or worse on stdout (std::cout)."""

        def __init__(self, min_severity=ILogger.WARNING) -> None:
            self.min_severity = min_severity

        def log(self, severity, msg: str) -> None:
            if int(severity) <= int(self.min_severity):
                stamp = time.strftime("%m/%d/%Y-%H:%M:%S")
                print(f"[{stamp}] [TRT] [{'FEWIV'[int(severity)]}] {msg}", file=sys.stdout, flush=True)

    def _log(logger, severity: str, message: str) -> None:
        if isinstance(logger, ILogger):
            _callback("log", logger.log, getattr(ILogger.Severity, severity), message)

    class ParserError:
        def __init__(self, index: int, name: str, op: str, desc: str) -> None:
            self._node, self._name, self._op, self._desc = index, name, op, desc

        def node(self) -> int:
            return self._node

        def node_name(self) -> str:
            return self._name

        def node_operator(self) -> str:
            return self._op

        def desc(self) -> str:
            return self._desc

        def code(self) -> str:
            return "ErrorCode.UNSUPPORTED_NODE"

    class Tensor:
        def __init__(self, name: str, shape: list[int], dtype: str) -> None:
            self.name, self.shape, self.dtype = name, Dims(shape), getattr(m.DataType, _DTYPES[dtype][0])

    class INetworkDefinition:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.inputs: list[Tensor] = []
            self.outputs: list[Tensor] = []
            self.plugin_layers: list[str] = []
            self.source: str | None = None  # the parsed file's path (the fake's own: out_of_memory_form)

        num_inputs = property(lambda self: len(self.inputs))
        num_outputs = property(lambda self: len(self.outputs))

        def get_input(self, i: int) -> Tensor:
            return self.inputs[i]

        def get_output(self, i: int) -> Tensor:
            return self.outputs[i]

    def _tensor(value: onnx.ValueInfoProto) -> Tensor:
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]
        return Tensor(value.name, dims, onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type))

    class OnnxParser:
        def __init__(self, network: INetworkDefinition, logger: Logger) -> None:
            self.network = network
            self.logger = logger
            self.errors: list[ParserError] = []

        def parse(self, model: bytes, path: str | None = None) -> bool:
            proto = onnx.load_from_string(bytes(model))
            _log(self.logger, "INFO", "----------------------------------------------------------------")
            _log(self.logger, "INFO", f"Input filename:   {path}")
            m.calls.append(("parse", path, [p.value for p in proto.metadata_props if p.key == "edge.precision"]))
            self.network.source = path
            for i, node in enumerate(proto.graph.node):
                if node.op_type in unsupported_ops:
                    self.errors.append(ParserError(i, node.name, node.op_type,
                                                   f"No importer registered for op: {node.op_type}"))
                elif node.op_type in EDGE_PLUGIN_OPS:
                    if node.op_type not in m.plugin_creators:
                        self.errors.append(ParserError(i, node.name, node.op_type, "Plugin not found, are the "
                                                       "plugin name, version, and namespace correct?"))
                    self.network.plugin_layers.append(node.op_type)
                elif node.op_type in plugin_layers:
                    if not m.builtin_plugins:
                        self.errors.append(ParserError(i, node.name, node.op_type, "Plugin not found, are the "
                                                       "plugin name, version, and namespace correct?"))
                    self.network.plugin_layers.append(node.op_type)
            for error in self.errors:
                _log(self.logger, "ERROR", f"ModelImporter.cpp:949: ERROR: {error.desc()}")
            if self.errors:
                return False
            self.network.inputs = [_tensor(v) for v in proto.graph.input]
            self.network.outputs = [_tensor(v) for v in proto.graph.output]
            self.network.precision = next((p.value for p in proto.metadata_props if p.key == "edge.precision"),
                                          "float32")
            self.network.graph = path
            return True

        num_errors = property(lambda self: len(self.errors))

        def get_error(self, i: int) -> ParserError:
            return self.errors[i]

    class ITimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = bytes(data)
            self.entries = int(self.data.rsplit(b":", 1)[1]) if self.data else 0

        def serialize(self) -> bytes:
            return f"FAKE-CACHE:{version}:{self.entries}".encode()

    class IOptimizationProfile:
        def __init__(self) -> None:
            self.shapes: dict = {}

        def set_shape(self, name, low, opt, high) -> None:
            self.shapes[name] = [list(d.values) for d in (low, opt, high)]

    class IProgressMonitor:
        def __init__(self) -> None:
            pass

    class IBuilderConfig:
        builder_optimization_level = 3  # a class-level property in the real bindings (feature-detected so)
        _logger = None  # the builder's (the fake logs through it)

        def __init__(self) -> None:
            self.pools: dict = {}
            self.flags: list[str] = []
            self.cleared_flags: list[str] = []
            self.profiling_verbosity = None
            self.profiles: list[IOptimizationProfile] = []
            self.timing_cache: ITimingCache | None = None
            self.progress_monitor = None
            if legacy:
                self.int8_calibrator = None
                self.calibration_profile: IOptimizationProfile | None = None
            else:
                self.tiling_optimization_level = None

        def set_memory_pool_limit(self, pool, size: int) -> None:
            self.pools[repr(pool)] = size

        def set_flag(self, flag) -> None:
            self.flags.append(repr(flag))

        def clear_flag(self, flag) -> None:  # pyCore: IBuilderConfig.clear_flag (TF32 is set by default)
            self.cleared_flags.append(repr(flag))

        def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, data: bytes) -> ITimingCache | None:
            if data and not bytes(data).startswith(b"FAKE-CACHE:"):
                _log(self._logger, "ERROR", "[timingCache.cpp::load] Error Code 1: Internal Error (Magic tag does not "
                                           "match)")
                return None
            if data and not bytes(data).startswith(f"FAKE-CACHE:{version}:".encode()):
                _log(self._logger, "ERROR", "Error Code 1: Internal Error (the timing cache was made by another "
                                           "TensorRT version)")
                return None
            return ITimingCache(data)

        def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
            if not isinstance(cache, ITimingCache):  # pybind11 refuses None for a reference argument
                raise TypeError("set_timing_cache(): incompatible function arguments. The following argument "
                                "types are supported: (self, cache: tensorrt.ITimingCache, ignore_mismatch: bool)")
            if cache.data and not cache.data.startswith(f"FAKE-CACHE:{version}:".encode()):
                return False
            self.timing_cache = cache
            return True

        def get_timing_cache(self) -> ITimingCache:
            return self.timing_cache or ITimingCache(b"")

    if legacy:
        def set_calibration_profile(self, profile: IOptimizationProfile) -> bool:
            self.calibration_profile = profile
            return True

        IBuilderConfig.set_calibration_profile = set_calibration_profile

    def _calibrate(network: INetworkDefinition, config: IBuilderConfig) -> dict | None:
        """Read every batch the calibrator hands over, as TensorRT does: one input volume per input, at the
        network's shape (a dynamic network: the calibration profile's opt shape, which it must have)."""
        calibrator = config.int8_calibrator
        cached = calibrator.read_calibration_cache()
        if cached:
            return {"from_cache": True}
        shapes = {}
        for tensor in network.inputs:
            shape = list(tensor.shape.values)
            if -1 in shape:
                profile = config.calibration_profile
                if profile is None or tensor.name not in profile.shapes:
                    m.calls.append(("error", "a network with dynamic shapes needs a calibration profile"))
                    return None
                shape = profile.shapes[tensor.name][1]
            shapes[tensor.name] = shape
        names = list(shapes)
        images = batches = 0
        while True:
            pointers = calibrator.get_batch(names)
            if not pointers:
                break
            for name, pointer in zip(names, pointers, strict=True):
                nbytes = int(np.prod(shapes[name])) * 4
                if m.cuda.allocation_size(pointer) != nbytes:
                    m.calls.append(("error", f"calibration buffer of {m.cuda.allocation_size(pointer)} bytes for "
                                             f"input {name} {shapes[name]} ({nbytes} bytes)"))
                    return None
                m.cuda.read(pointer, nbytes)
            batches += 1
            images += shapes[names[0]][0]
        if not batches:
            m.calls.append(("error", "the calibrator gave no batch"))
            return None
        calibrator.write_calibration_cache(b"FAKE-CALIBRATION")
        return {"batches": batches, "images": images, "shapes": shapes}

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            return INetworkDefinition(flags)

        def create_builder_config(self) -> IBuilderConfig:
            config = IBuilderConfig()
            config._logger = self.logger
            return config

        def create_optimization_profile(self) -> IOptimizationProfile:
            return IOptimizationProfile()

        def get_plugin_registry(self):
            return registry

        def _steps(self, config: IBuilderConfig) -> bool:
            """The build's steps (``build_seconds`` long), reported as TensorRT reports them; False: cancelled."""
            monitor = config.progress_monitor
            steps = max(1, round(build_seconds / BUILD_STEP_S))
            if monitor is not None:
                _callback("phase_start", monitor.phase_start, "Building engine", None, steps)
            try:
                for step in range(steps):
                    with _native_call():
                        time.sleep(build_seconds / steps)
                    _log(self.logger, "VERBOSE", f"[fake] tactic step {step + 1} of {steps}")
                    if monitor is not None and not _callback("step_complete", monitor.step_complete,
                                                             "Building engine", step, on_exception=False):
                        return False
                return True
            finally:
                if monitor is not None:
                    _callback("phase_finish", monitor.phase_finish, "Building engine")

        def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig):
            m.calls.append(("build",))
            _log(self.logger, "INFO", "[MemUsageChange] Init CUDA: CPU +2, GPU +0, now: CPU 31, GPU 3402 (MiB)")
            if config.timing_cache is None:
                _log(self.logger, "INFO", "Local timing cache in use. Profiling results in this builder pass will "
                                          "not be stored.")
            form = "none" if fail_build else out_of_memory_form(network.source)
            if form == "killed":
                _log(self.logger, "INFO", "[fake] the kernel's OOM killer takes this process (SIGKILL)")
                os.kill(os.getpid(), signal.SIGKILL)
            if form == "none":
                _log(self.logger, "ERROR", "[virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory "
                                           "(Requested size was 2147483648 bytes.)")
                return None
            calibration = None
            if getattr(config, "int8_calibrator", None) is not None and "INT8" in config.flags:
                calibration = _calibrate(network, config)
                if calibration is None:
                    return None
            if not self._steps(config):
                m.calls.append(("build cancelled",))
                _log(self.logger, "ERROR", "[fake] the build was cancelled (step_complete returned False)")
                return None
            _log(self.logger, "WARNING", "[fake] a warning while building, as TensorRT often gives one")
            if config.timing_cache is not None:
                config.timing_cache.entries += 5  # "timed" some tactics
            io = [{"name": t.name, "mode": mode, "shape": list(t.shape.values), "dtype": t.dtype.name}
                  for mode, tensors in (("INPUT", network.inputs), ("OUTPUT", network.outputs)) for t in tensors]
            request = {"flags": network.flags, "precision": getattr(network, "precision", None),
                       "graph": getattr(network, "graph", None),
                       "pools": config.pools, "builder_flags": config.flags,
                       "cleared_flags": config.cleared_flags,
                       "optimization_level": config.builder_optimization_level,
                       "profiles": [p.shapes for p in config.profiles],
                       "calibrator": type(config.int8_calibrator).__name__
                       if getattr(config, "int8_calibrator", None) else None,
                       "calibration": calibration,
                       "tiling": repr(getattr(config, "tiling_optimization_level", None)),
                       "io": io, "plugin_layers": network.plugin_layers, "plugin_libraries": list(m.plugin_libraries)}
            return b"FAKE-ENGINE" + json.dumps(request).encode()

    class IExecutionContext:
        """Checks what TensorRT checks before an enqueue: input shapes set, every address a large enough buffer."""

        def __init__(self, engine: ICudaEngine) -> None:
            self.engine = engine
            self.input_shapes: dict[str, list[int]] = {}
            self.addresses: dict[str, int] = {}
            self.profiler = None

        def set_input_shape(self, name: str, shape) -> bool:
            low, _, high = self.engine._profile_of(name)
            if not all(lo <= int(d) <= hi for lo, d, hi in zip(low, shape, high, strict=True)):
                return False
            self.input_shapes[name] = [int(d) for d in shape]
            return True

        def get_tensor_shape(self, name: str) -> Dims:
            shape = list(self.engine.tensors[name]["shape"])
            batch = next(iter(self.input_shapes.values()), [1])[0]
            return Dims([batch if d == -1 else d for d in shape])

        def set_tensor_address(self, name: str, address: int) -> bool:
            self.addresses[name] = int(address)
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            for name, tensor in self.engine.tensors.items():
                if -1 in tensor["shape"] and tensor["mode"] == "INPUT" and name not in self.input_shapes:
                    return False
                shape = self.get_tensor_shape(name).values if tensor["mode"] == "OUTPUT" or -1 not in tensor[
                    "shape"] else self.input_shapes[name]
                nbytes = int(np.prod(shape)) * np.dtype(numpy_types[tensor["dtype"]]).itemsize
                if (m.cuda.allocation_size(self.addresses.get(name, 0)) or 0) < nbytes:
                    return False
            if not m.cuda.launch(stream_handle, sum(FAKE_LAYERS.values())):
                return False
            if self.profiler is not None:
                for layer, ms in FAKE_LAYERS.items():
                    _callback("report_layer_time", self.profiler.report_layer_time, layer, ms)
            self._compute()
            return True

        def _buffer(self, name: str) -> tuple[int, list[int], np.dtype]:
            tensor = self.engine.tensors[name]
            shape = self.input_shapes.get(name) or self.get_tensor_shape(name).values
            return self.addresses[name], list(shape), np.dtype(numpy_types[tensor["dtype"]])

        def _compute(self) -> None:
            """The graph's outputs from the input buffers into the output buffers (module docstring)."""
            session = self.engine._ort_session()
            if session is None:
                return
            feeds = {}
            for i in session.get_inputs():
                address, shape, dtype = self._buffer(i.name)
                feeds[i.name] = np.frombuffer(m.cuda.read(address, int(np.prod(shape)) * dtype.itemsize),
                                              dtype).reshape(shape)
            wrong = _wrong(self.engine.request["graph"])
            for o, value in zip(session.get_outputs(), session.run(None, feeds), strict=True):
                address, shape, dtype = self._buffer(o.name)
                data = (-value if wrong else value).astype(dtype).tobytes()
                m.cuda.memory[address][:len(data)] = data

    class ICudaEngine:
        device_memory_size = 1 << 20
        _logger = None  # the runtime's (the fake logs through it)
        device_memory_size_v2 = 1 << 20

        def __init__(self, data: bytes) -> None:
            self.request = json.loads(bytes(data)[len(b"FAKE-ENGINE"):])
            self.tensors = {t["name"]: t for t in self.request["io"]}
            self.names = list(self.tensors)
            self._ort: list = []

        def _ort_session(self):
            """ONNX Runtime on the parsed graph, made at the first enqueue (None: outputs are not computed)."""
            if not self._ort:
                self._ort.append(_graph_session(self.request.get("graph")))
            return self._ort[0]

        num_io_tensors = property(lambda self: len(self.names))

        def get_tensor_name(self, i: int) -> str:
            return self.names[i]

        def get_tensor_mode(self, name: str):
            return getattr(m.TensorIOMode, self.tensors[name]["mode"])

        def get_tensor_shape(self, name: str) -> Dims:
            return Dims(self.tensors[name]["shape"])

        def get_tensor_dtype(self, name: str):
            return getattr(m.DataType, self.tensors[name]["dtype"])

        def _profile_of(self, name: str) -> list[list[int]]:
            profiles = self.request["profiles"]
            shape = self.tensors[name]["shape"]
            return profiles[0][name] if profiles and name in profiles[0] else [shape, shape, shape]

        def create_execution_context(self) -> IExecutionContext | None:
            m.contexts += 1
            if m.contexts <= fail_contexts:
                _log(self._logger, "ERROR", "[fake] Error Code 2: OutOfMemory (Requested size was 1048576 bytes.)")
                return None
            return IExecutionContext(self)

        def create_engine_inspector(self):
            inspector = types.SimpleNamespace()
            io_key = "Bindings" if legacy else "I/O Tensors"  # TensorRT 11 renamed the inspector's key
            inspector.get_engine_information = lambda fmt: json.dumps(
                {"Layers": [{"Name": name} for name in FAKE_LAYERS], io_key: self.names})
            return inspector

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def get_plugin_registry(self):
            return registry

        def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
            if not bytes(data).startswith(b"FAKE-ENGINE"):
                _log(self.logger, "ERROR", "1: [runtime.cpp::parsePlan::314] Error Code 1: Serialization ("
                                           "Serialization assertion plan->header.magicTag == "
                                           "rt::kPLAN_MAGIC_TAG failed.)")
                return None
            _log(self.logger, "INFO", f"Loaded engine size: {len(data) >> 20} MiB")
            engine = ICudaEngine(data)
            engine._logger = self.logger
            missing = [p for p in engine.request["plugin_libraries"] if p not in m.plugin_libraries]
            missing += [op for op in engine.request["plugin_layers"] if op in EDGE_PLUGIN_OPS
                        and op not in m.plugin_creators]
            if (engine.request["plugin_layers"] and not m.builtin_plugins) or missing:
                m.calls.append(("error", "getPluginCreator could not find a plugin creator"))
                _log(self.logger, "ERROR", "3: getPluginCreator could not find plugin: FakePlugin version: 1")
                return None
            return engine

    class IProfiler:
        def __init__(self) -> None:
            pass

    for cls in (ILogger, Logger, ParserError, INetworkDefinition, OnnxParser, ITimingCache, IOptimizationProfile,
                IProgressMonitor, IBuilderConfig, Builder, IExecutionContext, ICudaEngine, Runtime, IProfiler):
        setattr(m, cls.__name__, cls)
    if legacy:
        class IInt8EntropyCalibrator2:
            def __init__(self) -> None:
                pass

        m.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    return m
