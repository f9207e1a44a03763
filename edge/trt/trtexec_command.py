"""trtexec interop: the trtexec command equivalent to an ``edge build`` (with a benchmark run).

Which flags exist depends on trtexec's version (``samples/common/sampleOptions.cpp`` of each
release): ``--tilingOptimizationLevel`` from 10.8 (10.3 stops with "Unknown option"); 11 dropped
``--fp16/--int8/--best/--calib`` and turned ``--stronglyTyped``, ``--useCudaGraph``,
``--noDataTransfers``, ``--useSpinWait`` and ``--separateProfileRun`` into deprecated no-ops (their
behaviour is the default). The version comes from trtexec's banner, ``[TensorRT v100300]``; finding
trtexec and reading its version are jetson.trtexec's (the device runner builds with it too).

What trtexec prints and exports is read into the ``edge profile`` result schema by
:mod:`edge.profile.trtexec_output`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from edge.errors import EdgeError
from edge.trt.builder import BuildConfig
from jetson.trtexec import (  # noqa: F401 - the version logic is the device runner's (--builder trtexec)
    JETPACK_TRTEXEC,
    NO_OPS_IN_11,
    TACTIC_DRAM_NOTE,
    TILING_SINCE,
    banner_version,
    find_trtexec,
    trtexec_version,
)

#: what NVIDIA's maintainers ask benchmark reports to use
BENCHMARK_FLAGS = ("--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun", "--dumpProfile",
                   "--dumpLayerInfo", "--profilingVerbosity=detailed")
WEAK_TYPING_FLAGS = {"fp16": "--fp16", "int8": "--int8", "best": "--best"}


def left_out(config: BuildConfig, version: tuple[int, ...] | None) -> dict[str, str]:
    """The flags of this build that trtexec ``version`` lacks or ignores, each with why (None: unknown version)."""
    notes = {}
    if config.tiling_optimization_level is not None and (version is None or version < TILING_SINCE):
        notes["--tilingOptimizationLevel"] = ("exists from TensorRT 10.8; this trtexec's version is unknown"
                                              if version is None else f"exists from TensorRT 10.8; trtexec "
                                              f"{'.'.join(map(str, version))} stops on it (\"Unknown option\")")
    if config.tactic_dram_mib is not None:  # trtexec has no tactic-DRAM pool (jetson.trtexec.TRTEXEC_MEMORY_POOLS)
        notes["tactic_dram_mib"] = TACTIC_DRAM_NOTE
    if version is not None and version >= (11,):
        for flag in NO_OPS_IN_11:
            notes[flag] = "a no-op in trtexec 11 (the default)"
    return notes


def trtexec_command(onnx_path: str, engine_path: str, config: BuildConfig, binary: str = "trtexec",
                    benchmark: bool = True, input_name: str = "input",
                    version: tuple[int, ...] | None = None) -> list[str]:
    """trtexec's argv for the same build (and a benchmark run with the maintainers' flags), for trtexec ``version``.

    Flags that ``version`` lacks or ignores are left out (:func:`left_out` says which);
    a weakly typed build is refused on trtexec 11, and ``--int8``/``--best`` get ``--calib``.
    """
    dropped = left_out(config, version)
    argv = [binary, f"--onnx={onnx_path}", f"--saveEngine={engine_path}",
            f"--memPoolSize=workspace:{config.workspace_mib}M",
            f"--builderOptimizationLevel={config.optimization_level}"]
    if config.strongly_typed:
        argv.append("--stronglyTyped")
    elif config.precision != "fp32":
        argv += _weak_typing(onnx_path, config, version)
    if config.tiling_optimization_level is not None:
        argv.append(f"--tilingOptimizationLevel={config.tiling_optimization_level}")
    if not config.tf32:
        argv.append("--noTF32")
    if config.timing_cache:
        argv.append(f"--timingCacheFile={config.timing_cache}")
    # edge's plugin libraries export getCreators: trtexec registers such a library only through --dynamicPlugins
    # (IPluginRegistry::loadLibrary, sampleEngines.cpp at v10.3.0 ~1249); --staticPlugins only dlopens it
    # (trtexec.cpp ~300), which registers nothing, and the parse then fails with "Plugin not found"
    argv += [f"--dynamicPlugins={p}" for p in config.plugins]
    if config.min_batch is not None:
        argv += [f"--minShapes={input_name}:{config.min_batch}x...",
                 f"--optShapes={input_name}:{config.opt_batch}x...",
                 f"--maxShapes={input_name}:{config.max_batch}x..."]
    elif config.batch is not None:
        argv.append(f"--shapes={input_name}:{config.batch}x...")
    if benchmark:
        stem = str(Path(engine_path).with_suffix(""))
        argv += [*BENCHMARK_FLAGS, f"--exportTimes={stem}.times.json", f"--exportProfile={stem}.profile.json",
                 f"--exportLayerInfo={stem}.trtexec-layers.json"]
    return [a for a in argv if a.split("=", 1)[0] not in dropped]


def _weak_typing(onnx_path: str, config: BuildConfig, version: tuple[int, ...] | None) -> list[str]:
    """``--fp16``/``--int8``/``--best`` (TensorRT 10.x only); INT8 with the calibration cache ``edge build`` wrote."""
    if version is not None and version >= (11,):
        raise EdgeError(f"trtexec {'.'.join(map(str, version))} has no --{config.precision} (weak typing was removed "
                        "in TensorRT 11)", expected="trtexec 10.x for --weakly-typed",
                        fix="drop --weakly-typed: strongly typed builds take the precision from the ONNX "
                            "(edge quantize --precision fp16|int8)")
    flags = [WEAK_TYPING_FLAGS[config.precision]]
    if config.precision in ("int8", "best"):
        cache = Path(config.calibration_cache or f"{onnx_path}.calib.cache")
        if not cache.is_file():
            raise EdgeError(f"trtexec --{config.precision} needs a calibration cache, and {cache} does not exist",
                            found="without --calib trtexec quantizes with placeholder scales: the engine's accuracy "
                                  "means nothing",
                            fix=f"write it first: edge build {onnx_path} --precision {config.precision} --weakly-typed "
                                "--data DATA --out ENGINE (TensorRT 10.x), or build strongly typed from the Q/DQ "
                                f"graph: edge quantize {onnx_path} --precision int8 ...")
        flags.append(f"--calib={cache}")
    return flags


def shape_arguments(argv: list[str], input_shape: list[int]) -> list[str]:
    """Fill the ``x...`` placeholders of the shape flags with the input's non-batch dimensions."""
    rest = "x".join(str(d) for d in input_shape[1:])
    return [a.replace("x...", f"x{rest}") for a in argv]


def as_shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
