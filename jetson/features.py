"""TensorRT on the device: loading it, and what the installed version can do (feature detection, never
version guessing). Shared with edge (edge.trt.features re-exports it); TensorRT is imported only
inside :func:`load_tensorrt`, so ``import jetson`` never needs it.

The main target is TensorRT 10.3 (JetPack 6.1/6.2 on the Orin Nano); users also have 10.16
(JetPack 7.2) and 11.x (x86). TensorRT 11 removed weak typing (the FP16/INT8/BF16/FP8 builder
flags; TF32 stays, it is not weak typing), the INT8 calibrators and ``platform_has_fast_*``, and
made every network strongly typed (``STRONGLY_TYPED`` is kept, deprecated and ignored); 10.6
added Python plugins, 10.8 tiling optimisation and the editable timing cache. Every such knob is
looked up with ``hasattr`` on the module actually loaded, so the same code runs on all of them
(and on the test fake); the one thing no attribute tells, strong typing being always on, comes
from the major version.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from jetson.errors import JetsonError

if TYPE_CHECKING:
    import tensorrt

INSTALL_HINT = ("on a Jetson, TensorRT comes with JetPack: `sudo apt install nvidia-jetpack` (or just the Python "
                "module: `sudo apt install python3-libnvinfer`); use the system Python, or a venv created with "
                "--system-site-packages. On x86: NVIDIA's packages, e.g. `pip install tensorrt-cu12` (NVIDIA's "
                "index), the TensorRT tar/deb packages, or the nvcr.io/nvidia/tensorrt container")


def load_tensorrt() -> ModuleType:
    """The ``tensorrt`` module, or a JetsonError saying it was not found and how to install it."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise JetsonError("TensorRT was not found: the Python module `tensorrt` cannot be imported",
                          expected="TensorRT >= 10.3 with its Python bindings", found=str(e), fix=INSTALL_HINT) from e
    except OSError as e:  # the bindings are there but libnvinfer is not
        raise JetsonError("TensorRT was not found: the `tensorrt` module is installed but its libraries are not",
                          found=str(e)[:300], fix=INSTALL_HINT) from e
    if not hasattr(trt, "Builder") or not hasattr(trt, "__version__"):
        # e.g. `tensorrt-stubs` installed into site-packages: a namespace package of .pyi files
        raise JetsonError("TensorRT was not found: `tensorrt` imports but has no Builder (type stubs only?)",
                          found=f"module {getattr(trt, '__path__', trt)!r}", fix=INSTALL_HINT)
    return trt


def dims_list(dims: tensorrt.Dims) -> list[int]:
    """A TensorRT ``Dims`` as a list (the bindings index it; the stubs give it no ``__iter__``)."""
    return [int(dims[i]) for i in range(len(dims))]


def parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass(frozen=True)
class TensorRTFeatures:
    """What the loaded TensorRT offers; each field is detected on the module itself."""

    version: str
    strongly_typed: bool            # NetworkDefinitionCreationFlag.STRONGLY_TYPED (8.6+)
    always_strongly_typed: bool     # 11+: every network is strongly typed, the flag is ignored
    weak_typing_flags: tuple[str, ...]  # precision BuilderFlags still present (FP16, INT8, BF16, ...): gone in 11
    int8_calibrator: bool           # IInt8EntropyCalibrator2 (deprecated 10.1, removed in 11)
    memory_pool_limit: bool         # IBuilderConfig.set_memory_pool_limit + MemoryPoolType.WORKSPACE
    tactic_dram_pool: bool          # MemoryPoolType.TACTIC_DRAM (8.6+): the optimiser's whole memory
    optimization_level: bool        # IBuilderConfig.builder_optimization_level
    tiling_optimization_level: bool  # TilingOptimizationLevel (10.8)
    editable_timing_cache: bool     # BuilderFlag.EDITABLE_TIMING_CACHE (10.8)
    timing_cache: bool              # ITimingCache
    progress_monitor: bool          # IProgressMonitor (10.0)
    engine_inspector: bool          # EngineInspector + LayerInformationFormat.JSON
    python_plugins: bool            # tensorrt.plugin (10.6)
    device_memory_size_v2: bool     # ICudaEngine.device_memory_size_v2 (10.1)
    parser_error_node_names: bool   # ParserError.node_name / node_operator (10.x)

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return parse_version(self.version)

    def has_builder_flag(self, name: str) -> bool:
        return name in self.weak_typing_flags

    def as_dict(self) -> dict:
        return asdict(self)


#: the weak-typing builder flags TensorRT 11 removed (TF32 is not one: it stays, on by default)
PRECISION_FLAGS = ("FP16", "BF16", "INT8", "FP8", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS",
                   "PREFER_PRECISION_CONSTRAINTS")


def has_python_plugins(trt: ModuleType) -> bool:
    """Whether ``tensorrt.plugin`` (10.6+) exists, without importing it (importing logs an "experimental" warning)."""
    try:
        return importlib.util.find_spec(f"{trt.__name__}.plugin") is not None
    except (ImportError, ValueError):  # a parent without __path__ (not a package), or a spec-less module
        return False


def detect_features(trt: ModuleType) -> TensorRTFeatures:
    flags = getattr(trt, "BuilderFlag", None)
    creation = getattr(trt, "NetworkDefinitionCreationFlag", None)
    config_cls = getattr(trt, "IBuilderConfig", None)
    engine_cls = getattr(trt, "ICudaEngine", None)
    parser_error = getattr(trt, "ParserError", None)
    info_format = getattr(trt, "LayerInformationFormat", None)
    version = str(trt.__version__)
    always_strongly_typed = parse_version(version)[0] >= 11
    return TensorRTFeatures(
        version=version,
        strongly_typed=always_strongly_typed or (creation is not None and hasattr(creation, "STRONGLY_TYPED")),
        always_strongly_typed=always_strongly_typed,
        weak_typing_flags=tuple(f for f in PRECISION_FLAGS if flags is not None and hasattr(flags, f)),
        int8_calibrator=hasattr(trt, "IInt8EntropyCalibrator2"),
        memory_pool_limit=config_cls is not None and hasattr(config_cls, "set_memory_pool_limit")
        and hasattr(getattr(trt, "MemoryPoolType", None), "WORKSPACE"),
        tactic_dram_pool=config_cls is not None and hasattr(config_cls, "set_memory_pool_limit")
        and hasattr(getattr(trt, "MemoryPoolType", None), "TACTIC_DRAM"),
        optimization_level=config_cls is not None and hasattr(config_cls, "builder_optimization_level"),
        tiling_optimization_level=hasattr(trt, "TilingOptimizationLevel"),
        editable_timing_cache=flags is not None and hasattr(flags, "EDITABLE_TIMING_CACHE"),
        timing_cache=hasattr(trt, "ITimingCache"),
        progress_monitor=hasattr(trt, "IProgressMonitor"),
        engine_inspector=engine_cls is not None and hasattr(engine_cls, "create_engine_inspector")
        and hasattr(info_format, "JSON"),
        python_plugins=has_python_plugins(trt),
        device_memory_size_v2=engine_cls is not None and hasattr(engine_cls, "device_memory_size_v2"),
        parser_error_node_names=parser_error is not None and hasattr(parser_error, "node_name"),
    )
