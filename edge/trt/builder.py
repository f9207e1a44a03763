"""``edge build``: an ONNX graph -> a TensorRT engine, its manifest and its layer information.

Strongly typed by default: the precision lives in the ONNX (``edge quantize`` writes the fp16
and int8 Q/DQ variants; ``--precision fp16`` converts a float32 graph in memory), which is the
only path TensorRT 11 still builds and works the same from 10.3 on. ``best`` is the int8 Q/DQ
graph, whose unquantized part ``edge quantize`` writes in float16: INT8+FP16, what
TensorRT's weakly typed ``--best`` meant. The weakly typed path
(builder precision flags, the legacy INT8 calibrator) is kept for TensorRT 10.x users who ask
for it (``strongly_typed=False``) and refused with a clear message where the flags are gone.

``import tensorrt`` happens inside the functions, after :func:`load_tensorrt` has checked it, so
``import edge`` never needs TensorRT; mypy checks every call against ``tensorrt-stubs``, and the
unit tests swap a fake module in as ``sys.modules["tensorrt"]``.

The legacy calibrator calibrates on images the caller supplies (``calibration_images``: ``edge
build`` passes ``edge.precision.calibration.calibration_images``), so this package never reads a data set.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from edge.config import MAX_BATCH, MAX_SAMPLES, option
from edge.errors import EdgeError
from edge.fileio import sha256_file
from edge.trt.dims import dims_list
from edge.trt.features import TensorRTFeatures, detect_features, load_tensorrt
from edge.trt.manifest import MANIFEST_VERSION, layers_path, manifest_path
from jetson.bundle import DEFAULT_TACTIC_DRAM_MIB
from jetson.engine import load_plugin_library, network_flags, parser_errors
from jetson.errors import JetsonError
from jetson.interrupt import Interruptions
from jetson.trt_log import stderr_logger

if TYPE_CHECKING:
    import tensorrt

PRECISIONS = ("fp32", "fp16", "int8", "best")
#: 2 GiB: Ultralytics' advice for building on an 8 GB Orin Nano (CPU and GPU share the 7.6 GB usable);
#: the device runner's default too, and TACTIC_DRAM's (DEFAULT_TACTIC_DRAM_MIB): jetson.bundle says why
DEFAULT_WORKSPACE_MIB = 2048
#: the ONNX variant (edge.precision metadata) a strongly typed build of each --precision expects; "best" is
#: the int8 Q/DQ graph, float16 wherever it is not quantized (INT8+FP16)
ONNX_VARIANT = {"fp32": ("float32",), "fp16": ("float16",), "int8": ("int8",), "best": ("int8",)}
#: the legacy calibrator's images: (the parsed ONNX, its path, --data, --samples) -> float32 NCHW array
CalibrationImages = Callable[[onnx.ModelProto, str, str, int], np.ndarray]


@dataclass
class BuildConfig:
    precision: str = "fp32"               # fp32 | fp16 | int8 | best (= the int8 Q/DQ graph: INT8+FP16)
    strongly_typed: bool = True           # False: TensorRT 10.x builder flags (+ legacy calibrator for int8)
    workspace_mib: int = option(DEFAULT_WORKSPACE_MIB, minimum=1, maximum=1 << 20)
    optimization_level: int = option(3, minimum=0, maximum=5)  # 0..5 (TensorRT's default 3)
    tiling_optimization_level: int | None = option(None, minimum=0, maximum=3)  # 10.8+: 0..3 (None: TensorRT's default)
    # MemoryPoolType.TACTIC_DRAM, MiB (8.6+; None: TensorRT's default, 75 % of a Jetson's memory)
    tactic_dram_mib: int | None = option(DEFAULT_TACTIC_DRAM_MIB, minimum=1, maximum=1 << 20)
    timing_cache: str | None = None       # loaded when it exists, saved after the build
    plugins: tuple[str, ...] = ()         # plugin libraries (.so) to load
    # static batch for a dynamic-batch graph (None: the graph's own)
    batch: int | None = option(None, minimum=1, maximum=MAX_BATCH)
    # an optimisation profile for a dynamic batch: min/opt/max
    min_batch: int | None = option(None, minimum=1, maximum=MAX_BATCH)
    opt_batch: int | None = option(None, minimum=1, maximum=MAX_BATCH)
    max_batch: int | None = option(None, minimum=1, maximum=MAX_BATCH)
    calibration_data: str | None = None   # weakly typed int8 only: data for the legacy calibrator
    calibration_samples: int = option(500, minimum=1, maximum=MAX_SAMPLES)
    calibration_cache: str | None = None
    verbose: bool = False
    #: fp32 matrix products in TF32 (TensorRT's default: about 1e-3 relative from ONNX Runtime); False clears
    #: BuilderFlag.TF32 (`edge build --no-tf32`, trtexec --noTF32)
    tf32: bool = True

    def check(self) -> None:
        if self.precision not in PRECISIONS:
            raise EdgeError(f"--precision {self.precision!r}", expected=f"one of {', '.join(PRECISIONS)}")
        if self.workspace_mib < 1:
            raise EdgeError(f"--workspace {self.workspace_mib} MiB", expected="a positive size in MiB",
                            fix=f"use the default {DEFAULT_WORKSPACE_MIB} (2 GiB) on an 8 GB Orin Nano")
        check_tactic_memory(self.workspace_mib, self.tactic_dram_mib)
        if not 0 <= self.optimization_level <= 5:
            raise EdgeError(f"--opt-level {self.optimization_level}", expected="0..5 (TensorRT's default is 3)")
        batches = (self.min_batch, self.opt_batch, self.max_batch)
        if any(b is not None for b in batches):
            if any(b is None for b in batches):
                raise EdgeError("an optimisation profile needs --min-batch, --opt-batch and --max-batch together")
            low, mid, high = (int(b) for b in batches)  # type: ignore[arg-type]  # None excluded just above
            if not 1 <= low <= mid <= high:
                raise EdgeError(f"batch profile {low}/{mid}/{high}", expected="1 <= min <= opt <= max")


def check_tactic_memory(workspace_mib: int, tactic_dram_mib: int | None) -> None:
    """TACTIC_DRAM holds all the build's tactic memory, workspace included: never less than the workspace."""
    if tactic_dram_mib is not None and tactic_dram_mib < workspace_mib:
        raise EdgeError(f"--tactic-dram {tactic_dram_mib} MiB below --workspace {workspace_mib} MiB",
                        expected="the tactic memory (TACTIC_DRAM, all of the optimiser's, workspace included) at "
                                 "least the workspace",
                        fix=f"raise --tactic-dram to {workspace_mib} or more, or lower --workspace (defaults "
                            f"{DEFAULT_TACTIC_DRAM_MIB} and {DEFAULT_WORKSPACE_MIB} MiB on an 8 GB Orin Nano)")


class PhaseDisplay:
    """Build phase and elapsed time on stderr (TensorRT's progress covers too little for a percentage)."""

    def __init__(self, stream=None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.start = time.perf_counter()
        self.phases: list[tuple[str, float]] = []

    def __call__(self, phase: str) -> None:
        elapsed = time.perf_counter() - self.start
        self.phases.append((phase, round(elapsed, 3)))
        if self.enabled:
            print(f"[{elapsed:8.1f} s] {phase}", file=self.stream, flush=True)


def _progress_monitor(display: Callable[[str], None], ctrl_c: Interruptions) -> tensorrt.IProgressMonitor:
    import tensorrt as trt

    class Monitor(trt.IProgressMonitor):
        """Top-level TensorRT phases go to the display; steps are not shown (they are uneven). A Ctrl-C
        cancels the build at the next step (False: stop), as raising from a callback is swallowed."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            if not parent_phase:
                display(f"TensorRT: {phase_name}")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return not ctrl_c.noted  # True: keep building

        def phase_finish(self, phase_name: str) -> None:
            pass

    return Monitor()


def select_onnx(model_path: Path, config: BuildConfig, strongly_typed: bool) -> tuple[onnx.ModelProto, str, dict]:
    """The ONNX the builder parses: for strongly typed builds, the variant of the asked precision."""
    from edge.onnx_metadata import set_precision_metadata, source_precision
    from edge.precision.fp16 import convert_to_fp16
    from edge.precision.quantize import load_onnx

    model = load_onnx(model_path)
    have = source_precision(model)
    if not strongly_typed:
        if have != "float32" and not (config.precision in ("int8", "best") and have == "int8"):
            raise EdgeError(f"{model_path} is a {have} graph; weakly typed builds take the float32 graph",
                            fix="pass the float32 export (the builder flags set the precision)")
        return model, have, {"conversion": None}
    wanted = ONNX_VARIANT[config.precision]
    if have in wanted:
        return model, have, {"conversion": None}
    if have == "float32" and "float16" in wanted:
        converted, report = convert_to_fp16(model)
        set_precision_metadata(converted, "float16")
        return converted, "float16", {"conversion": "fp16 in memory (edge.fp16.convert_to_fp16)",
                                      "fp16": {k: v for k, v in report.as_dict().items() if k != "fp32_nodes"}}
    if config.precision in ("int8", "best"):
        raise EdgeError(f"{model_path} is a {have} graph; a strongly typed {config.precision} build needs the Q/DQ "
                        "graph (INT8 where quantized, float16 elsewhere)",
                        expected="an ONNX written by `edge quantize --precision int8`",
                        fix=f"edge quantize {model_path} --precision int8 --data DATA --samples 500 "
                            f"--out {model_path.with_suffix('.int8.onnx')}, then build that file")
    raise EdgeError(f"{model_path} is a {have} graph, --precision {config.precision} asked for",
                    expected=f"a {' or '.join(wanted)} graph", fix="build the float32 export, or pass --precision "
                    f"{ {'float16': 'fp16', 'int8': 'int8', 'float32': 'fp32'}.get(have, 'fp32') }")


def _weak_typing_flags(config: BuildConfig, features: TensorRTFeatures) -> list[str]:
    wanted = {"fp32": [], "fp16": ["FP16"], "int8": ["INT8"], "best": ["FP16", "INT8"]}[config.precision]
    missing = [f for f in wanted if not features.has_builder_flag(f)]
    if missing:
        raise EdgeError(f"TensorRT {features.version} has no {'/'.join(missing)} builder flag (weak typing was "
                        "removed in TensorRT 11)", expected="TensorRT 10.x for weakly typed builds",
                        fix="drop --weakly-typed: strongly typed builds take the precision from the ONNX "
                            "(edge quantize --precision fp16|int8)")
    return wanted


def _io_shapes(network: tensorrt.INetworkDefinition) -> dict[str, dict]:
    shapes = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shapes[tensor.name] = {"io": "input", "shape": dims_list(tensor.shape), "dtype": str(tensor.dtype)}
    for i in range(network.num_outputs):
        tensor = network.get_output(i)
        shapes[tensor.name] = {"io": "output", "shape": dims_list(tensor.shape), "dtype": str(tensor.dtype)}
    return shapes


def _optimisation_profile(builder: tensorrt.Builder, network: tensorrt.INetworkDefinition,
                          config: BuildConfig) -> tuple[tensorrt.IOptimizationProfile | None, dict]:
    """A profile for inputs with a dynamic batch: min/opt/max from the config, or the fixed --batch."""
    import tensorrt as trt

    dynamic = [network.get_input(i) for i in range(network.num_inputs) if -1 in dims_list(network.get_input(i).shape)]
    if not dynamic:
        if config.min_batch is not None or config.batch is not None:
            raise EdgeError("the graph has a static batch; --batch and --min/opt/max-batch need a dynamic one",
                            fix="re-export with `edge export --dynamic-batch`, or drop the batch options")
        return None, {"dynamic": False}
    if config.min_batch is not None:
        low, mid, high = int(config.min_batch), int(config.opt_batch or 0), int(config.max_batch or 0)
    else:
        low = mid = high = config.batch or 1
    profile = builder.create_optimization_profile()
    shapes = {}
    for tensor in dynamic:
        dims = dims_list(tensor.shape)
        if -1 in dims[1:]:
            raise EdgeError(f"input {tensor.name} has dynamic dimensions besides the batch: {dims}",
                            expected="only the batch dimension dynamic", fix="export with a fixed image size")
        make = [trt.Dims([b, *dims[1:]]) for b in (low, mid, high)]
        profile.set_shape(tensor.name, make[0], make[1], make[2])
        shapes[tensor.name] = {"min": [low, *dims[1:]], "opt": [mid, *dims[1:]], "max": [high, *dims[1:]]}
    return profile, {"dynamic": True, "profile": shapes}


def _load_timing_cache(config: tensorrt.IBuilderConfig, path: str | None) -> dict:
    if path is None:
        return {"path": None}
    cache_file = Path(path)
    data = cache_file.read_bytes() if cache_file.is_file() else b""
    cache = config.create_timing_cache(data)  # None: TensorRT cannot read it ("Magic tag does not match")
    accepted = cache is not None and config.set_timing_cache(cache, ignore_mismatch=False)
    if not accepted:
        raise EdgeError(f"timing cache {path} was made by another TensorRT or GPU"
                        + (" (TensorRT cannot read it)" if cache is None else ""),
                        fix="delete it (a new one is written after this build) or pass another --timing-cache")
    return {"path": str(cache_file), "loaded_bytes": len(data), "hit": bool(data)}


def _save_timing_cache(config: tensorrt.IBuilderConfig, path: str | None) -> int:
    if path is None:
        return 0
    from edge.fileio import write_atomic

    data = bytes(config.get_timing_cache().serialize())
    write_atomic(data, Path(path))
    return len(data)


def _load_plugins(builder: tensorrt.Builder, logger: tensorrt.ILogger, plugins: tuple[str, ...]) -> list[str]:
    import tensorrt as trt

    trt.init_libnvinfer_plugins(logger, "")
    loaded = []
    for path in plugins:
        if not Path(path).is_file():
            raise EdgeError(f"plugin library {path} does not exist", expected="a TensorRT plugin .so",
                            fix="build it (plugins/) or check the path")
        try:  # once per process, as the device runner does: the registry refuses creators registered already
            load_plugin_library(trt, builder.get_plugin_registry(), path)
        except JetsonError as e:
            raise EdgeError(e.what, found=e.found, fix="build it for this TensorRT and GPU (plugins/), or check "
                                                        "the path") from e
        loaded.append(str(path))
    return loaded


def _configure(builder_config: tensorrt.IBuilderConfig, config: BuildConfig, features: TensorRTFeatures,
               strongly_typed: bool) -> dict:
    """Apply the knobs; return which were honoured and which this TensorRT does not have."""
    import tensorrt as trt

    from jetson.engine import configure_builder

    knobs = configure_builder(builder_config, config, features)  # the device runner sets the same knobs
    honoured: dict[str, Any] = knobs["honoured"]
    ignored: dict[str, str] = knobs["not_available"]
    honoured["profiling_verbosity"] = "DETAILED"
    if not strongly_typed:
        for name in _weak_typing_flags(config, features):
            builder_config.set_flag(getattr(trt.BuilderFlag, name))
        honoured["builder_flags"] = _weak_typing_flags(config, features)
    return {"honoured": honoured, "not_available": ignored}


def _calibration_shape(network: tensorrt.INetworkDefinition, builder_config: tensorrt.IBuilderConfig,
                       profile: tensorrt.IOptimizationProfile | None, shape_info: dict) -> list[int]:
    """The input shape TensorRT calibrates at: the network's own, or (dynamic batch) the profile's opt shape.

    TensorRT 10 takes the calibration batch from the network input (``get_batch_size`` is a
    leftover of implicit batch); a dynamic network needs a calibration profile, whose opt shape is used.
    """
    if network.num_inputs != 1:
        raise EdgeError(f"the legacy calibrator feeds one input; this graph has {network.num_inputs}",
                        fix="build strongly typed from a Q/DQ graph: edge quantize MODEL.onnx --precision int8 ...")
    tensor = network.get_input(0)
    if profile is None:
        return dims_list(tensor.shape)
    builder_config.set_calibration_profile(profile)
    return list(shape_info["profile"][tensor.name]["opt"])


def _legacy_calibrator(config: BuildConfig, features: TensorRTFeatures, model: onnx.ModelProto, source: str,
                       calibration_images: CalibrationImages | None, shape: list[int]):
    if not features.int8_calibrator:
        raise EdgeError(f"TensorRT {features.version} has no INT8 calibrator (removed in TensorRT 11)",
                        fix="build strongly typed from a Q/DQ graph: edge quantize MODEL.onnx --precision int8 ...")
    if not config.calibration_data:
        raise EdgeError("a weakly typed int8 build calibrates in TensorRT and needs --data",
                        fix="pass --data fmnist --samples 500, or build strongly typed from `edge quantize` output")
    if calibration_images is None:
        raise EdgeError("a weakly typed int8 build calibrates in TensorRT, and build_engine was given no "
                        "calibration_images", expected="a function (model, source, data, samples) -> float32 images",
                        fix="pass calibration_images=edge.precision.calibration.calibration_images "
                            "(what `edge build` does)")
    from edge.trt.calibrator import make_entropy_calibrator

    images = calibration_images(model, source, config.calibration_data, config.calibration_samples)
    return make_entropy_calibrator(images, config.calibration_cache or f"{source}.calib.cache", shape)


def build_engine(model_path: str | Path, out: str | Path, config: BuildConfig | None = None,
                 display: Callable[[str], None] | None = None, device: dict | None = None,
                 calibration_images: CalibrationImages | None = None) -> dict:
    """Build, write the engine, its manifest (``OUT.json``) and layer information (``OUT.layers.json``).

    Everything the build needs (TensorRT, cuda-python and the device identity, the output
    folder, plugins, calibration images) is checked before TensorRT starts its minutes-long build,
    so a missing part never throws a built engine away. ``device`` replaces the identity read with
    cuda-python (tests). ``calibration_images`` is needed only by a weakly typed int8 build from a
    float32 graph (the legacy calibrator); ``edge build`` passes ``edge.precision.calibration.calibration_images``.
    """
    config = config or BuildConfig()
    config.check()
    load_tensorrt()
    import tensorrt as trt

    from edge import __version__
    from edge.fileio import write_atomic

    display = display or PhaseDisplay()
    model_path, out = Path(model_path), Path(out)
    features = detect_features(trt)
    strongly_typed = config.strongly_typed
    if strongly_typed and not features.strongly_typed:
        raise EdgeError(f"TensorRT {features.version} cannot build strongly typed networks",
                        expected="TensorRT >= 8.6 (10.3 on JetPack 6)", fix="upgrade TensorRT, or pass --weakly-typed")
    _check_output(out)
    if device is None:
        from edge.trt.cuda import device_identity

        device = device_identity()  # needs cuda-python: read now, not after the build
    started = time.perf_counter()
    display(f"reading {model_path}")
    model, variant, conversion = select_onnx(model_path, config, strongly_typed)
    model_bytes = model.SerializeToString()

    logger = stderr_logger(verbose=config.verbose)  # never trt.Logger: it prints on stdout, before --json's JSON
    builder = trt.Builder(logger)
    plugins = _load_plugins(builder, logger, config.plugins)
    network = builder.create_network(network_flags(strongly_typed, features))
    parser = trt.OnnxParser(network, logger)
    display("parsing ONNX")
    if not parser.parse(model_bytes, str(model_path)):
        errors = parser_errors(parser, features)
        raise EdgeError(f"TensorRT {features.version} cannot parse {model_path} ({len(errors)} errors)",
                        found="\n    " + "\n    ".join(errors[:20]),
                        fix="the node named is unsupported or malformed: run `edge clean` on the graph, check the "
                            "opset (17+), or supply a plugin library with --plugin")
    builder_config = builder.create_builder_config()
    knobs = _configure(builder_config, config, features, strongly_typed)
    profile, shape_info = _optimisation_profile(builder, network, config)
    if profile is not None:
        builder_config.add_optimization_profile(profile)
    if not strongly_typed and config.precision in ("int8", "best") and variant == "float32":
        # the legacy calibrator: deprecated in 10.1, gone in 11; kept for 10.x users who ask for it
        shape = _calibration_shape(network, builder_config, profile, shape_info) if features.int8_calibrator else []
        builder_config.int8_calibrator = _legacy_calibrator(config, features, model, str(model_path),
                                                            calibration_images, shape)
        knobs["honoured"]["int8_calibrator"] = "IInt8EntropyCalibrator2 (legacy)"
        knobs["honoured"]["calibration_shape"] = shape
    timing = _load_timing_cache(builder_config, config.timing_cache) if features.timing_cache else {"path": None}
    # Ctrl-C during the build: TensorRT's callbacks swallow a KeyboardInterrupt (jetson.interrupt), so it is
    # noted, the progress monitor cancels the build, and it is raised when the build returns
    ctrl_c = Interruptions((signal.SIGINT,))
    if features.progress_monitor:
        builder_config.progress_monitor = _progress_monitor(display, ctrl_c)
    display("building the engine (TensorRT tries tactics: minutes on an Orin Nano)")
    with ctrl_c.handling(), ctrl_c.deferred():
        serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise EdgeError(f"TensorRT could not build an engine from {model_path}", found="see TensorRT's log above",
                        fix=f"if it ran out of memory, lower --workspace (now {config.workspace_mib} MiB) or close "
                            "other programs; try --opt-level 2")
    engine_bytes = bytes(serialized)
    build_seconds = time.perf_counter() - started
    timing["saved_bytes"] = _save_timing_cache(builder_config, config.timing_cache) if timing.get("path") else 0
    display(f"writing {out}")
    layer_info = _inspect(logger, engine_bytes, features)
    write_atomic(engine_bytes, out)
    write_atomic(json.dumps(layer_info, indent=1).encode(), layers_path(out))
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "edge": __version__,
        "onnx": {"path": str(model_path), "sha256": sha256_file(model_path), "variant": variant, **conversion},
        "engine": {"path": str(out), "sha256": sha256_file(out), "bytes": len(engine_bytes)},
        "runtime": {"tensorrt": features.version, **device},
        "precision": config.precision,
        "strongly_typed": strongly_typed,
        "tf32": config.tf32,
        "shapes": {**_io_shapes(network), **shape_info},
        "knobs": knobs,
        "config": asdict(config),
        "timing_cache": timing,
        "plugins": plugins,
        "features": features.as_dict(),
        "build_seconds": round(build_seconds, 2),
        "phases": getattr(display, "phases", []),
        "layers": layers_path(out).name,
    }
    write_atomic(json.dumps(manifest, indent=2).encode(), manifest_path(out))
    return manifest


def _check_output(out: Path) -> None:
    """The engine can be written where asked (checked before the build, not after it)."""
    if out.is_dir():
        raise EdgeError(f"--out {out} is a folder", expected="an engine file name",
                        fix=f"pass e.g. --out {out}/model.engine")
    folder = next((p for p in (out.parent, *out.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise EdgeError(f"cannot write the engine {out}: {folder} is not a writable folder",
                        fix="pass an --out in a folder you can write to")


def _inspect(logger: tensorrt.ILogger, engine_bytes: bytes, features: TensorRTFeatures) -> Any:
    """The engine inspector's layer information (JSON), or a note where this TensorRT has none."""
    import tensorrt as trt

    if not features.engine_inspector:
        return {"note": f"TensorRT {features.version} has no engine inspector"}
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    inspector = engine.create_engine_inspector()
    text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"text": text}

