"""FakeTensorRT: a stand-in for the ``tensorrt`` module, for unit tests of the builder and backend logic.

NOT TensorRT. It builds nothing and measures nothing: it mimics the Python API surface that
edge uses (names and signatures as in tensorrt-stubs 10.13) and records what it was asked, so
tests can check the calls edge makes. Two feature sets:

* ``"10.3"``: strongly typed networks, precision builder flags (FP16/INT8/...), the INT8
  calibrator classes, no tiling optimisation (10.8+);
* ``"11.0"``: no precision builder flags, no calibrators (both removed in TensorRT 11), tiling
  optimisation, editable timing cache.

The "engine" it serialises is JSON describing the request, prefixed ``FAKE-ENGINE``.
"""

from __future__ import annotations

import json
import types

import onnx


class _Enum:
    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return self.name


def _enum(name: str, members: list[str]) -> type:
    return type(name, (), {m: _Enum(m, i) for i, m in enumerate(members)})


class Dims:
    def __init__(self, values) -> None:
        self.values = [int(v) for v in values]

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> int:
        return self.values[i]


def make_fake_tensorrt(feature_set: str = "10.3", unsupported_ops: tuple[str, ...] = (),
                       fail_build: bool = False) -> types.ModuleType:
    """A FakeTensorRT module of the given feature set; ``unsupported_ops`` make the parser fail on them."""
    legacy = feature_set.startswith("10.")
    version = {"10.3": "10.3.0.30", "11.0": "11.0.0.1"}[feature_set]
    m = types.ModuleType("tensorrt")
    m.__version__ = version
    m.FAKE = True
    m.calls = []  # every notable call, for the tests
    flag_names = ["DEBUG", "GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "SPARSE_WEIGHTS", "DIRECT_IO"]
    if legacy:
        flag_names += ["FP16", "BF16", "INT8", "FP8", "TF32", "OBEY_PRECISION_CONSTRAINTS",
                       "PREFER_PRECISION_CONSTRAINTS"]
    else:
        flag_names += ["EDITABLE_TIMING_CACHE"]
        m.TilingOptimizationLevel = lambda level: _Enum(f"TILING_{level}", level)
    m.BuilderFlag = _enum("BuilderFlag", flag_names)
    m.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED"])
    m.MemoryPoolType = _enum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM", "TACTIC_DRAM"])
    m.ProfilingVerbosity = _enum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "NONE", "DETAILED"])
    m.LayerInformationFormat = _enum("LayerInformationFormat", ["ONELINE", "JSON"])
    m.TensorIOMode = _enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    m.Dims = Dims
    m.init_libnvinfer_plugins = lambda logger, namespace: m.calls.append(("init_libnvinfer_plugins", namespace))

    class Logger:
        VERBOSE, INFO, WARNING, ERROR = "VERBOSE", "INFO", "WARNING", "ERROR"

        def __init__(self, severity="WARNING") -> None:
            self.severity = severity

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
            self.name, self.shape, self.dtype = name, Dims(shape), dtype

    class INetworkDefinition:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.inputs: list[Tensor] = []
            self.outputs: list[Tensor] = []

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
            self.errors: list[ParserError] = []

        def parse(self, model: bytes, path: str | None = None) -> bool:
            proto = onnx.load_from_string(bytes(model))
            m.calls.append(("parse", path, [p.value for p in proto.metadata_props if p.key == "edge.precision"]))
            for i, node in enumerate(proto.graph.node):
                if node.op_type in unsupported_ops:
                    self.errors.append(ParserError(i, node.name, node.op_type,
                                                   f"No importer registered for op: {node.op_type}"))
            if self.errors:
                return False
            self.network.inputs = [_tensor(v) for v in proto.graph.input]
            self.network.outputs = [_tensor(v) for v in proto.graph.output]
            self.network.precision = next((p.value for p in proto.metadata_props if p.key == "edge.precision"),
                                          "float32")
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

        def __init__(self) -> None:
            self.pools: dict = {}
            self.flags: list[str] = []
            self.profiling_verbosity = None
            self.profiles: list[IOptimizationProfile] = []
            self.timing_cache: ITimingCache | None = None
            self.int8_calibrator = None
            self.progress_monitor = None
            if not legacy:
                self.tiling_optimization_level = None

        def set_memory_pool_limit(self, pool, size: int) -> None:
            self.pools[repr(pool)] = size

        def set_flag(self, flag) -> None:
            self.flags.append(repr(flag))

        def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, data: bytes) -> ITimingCache:
            return ITimingCache(data)

        def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
            if cache.data and not cache.data.startswith(f"FAKE-CACHE:{version}:".encode()):
                return False
            self.timing_cache = cache
            return True

        def get_timing_cache(self) -> ITimingCache:
            return self.timing_cache or ITimingCache(b"")

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            return INetworkDefinition(flags)

        def create_builder_config(self) -> IBuilderConfig:
            return IBuilderConfig()

        def create_optimization_profile(self) -> IOptimizationProfile:
            return IOptimizationProfile()

        def get_plugin_registry(self):
            registry = types.SimpleNamespace(load_library=lambda path: m.calls.append(("load_library", path)))
            return registry

        def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig):
            if fail_build:
                return None
            if config.timing_cache is not None:
                config.timing_cache.entries += 5  # "timed" some tactics
            if config.progress_monitor is not None:
                config.progress_monitor.phase_start("Building engine", None, 3)
                config.progress_monitor.phase_finish("Building engine")
            request = {"flags": network.flags, "precision": getattr(network, "precision", None),
                       "pools": config.pools, "builder_flags": config.flags,
                       "optimization_level": config.builder_optimization_level,
                       "profiles": [p.shapes for p in config.profiles],
                       "calibrator": type(config.int8_calibrator).__name__ if config.int8_calibrator else None,
                       "tiling": repr(getattr(config, "tiling_optimization_level", None))}
            return b"FAKE-ENGINE" + json.dumps(request).encode()

    class ICudaEngine:
        device_memory_size = 1 << 20
        device_memory_size_v2 = 1 << 20

        def __init__(self, data: bytes) -> None:
            self.request = json.loads(bytes(data)[len(b"FAKE-ENGINE"):])

        def create_engine_inspector(self):
            inspector = types.SimpleNamespace()
            inspector.get_engine_information = lambda fmt: json.dumps(
                {"Layers": [{"Name": "fake layer"}], "Bindings": ["input", "logits"]})
            return inspector

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
            return ICudaEngine(data) if bytes(data).startswith(b"FAKE-ENGINE") else None

    class IProfiler:
        def __init__(self) -> None:
            pass

    for cls in (Logger, ParserError, INetworkDefinition, OnnxParser, ITimingCache, IOptimizationProfile,
                IProgressMonitor, IBuilderConfig, Builder, ICudaEngine, Runtime, IProfiler):
        setattr(m, cls.__name__, cls)
    if legacy:
        class IInt8EntropyCalibrator2:
            def __init__(self) -> None:
                pass

        m.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    return m


FAKE_DEVICE = {"gpu": "Fake Orin (nvgpu)", "compute_capability": "8.7", "cuda_runtime": "12.6",
               "cuda_driver": "12.6", "l4t": "36.4.3"}


class FakeCudart:
    """Just enough of cuda-python's runtime for the device identity (FakeTensorRT's companion)."""

    def __init__(self, name: str = "Fake Orin (nvgpu)", major: int = 8, minor: int = 7) -> None:
        self.props = types.SimpleNamespace(name=name.encode(), major=major, minor=minor)

    def cudaGetDeviceProperties(self, device: int):
        return 0, self.props

    def cudaRuntimeGetVersion(self):
        return 0, 12060

    def cudaDriverGetVersion(self):
        return 0, 12060
