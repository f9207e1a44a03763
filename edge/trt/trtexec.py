"""trtexec interop: the trtexec command equivalent to an ``edge build`` (with a benchmark run).

What trtexec prints and exports is read into the ``edge profile`` result schema by
:mod:`edge.profile.trtexec`.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from edge.trt.builder import BuildConfig

JETPACK_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"
#: what NVIDIA's maintainers ask benchmark reports to use
BENCHMARK_FLAGS = ("--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun", "--dumpProfile",
                   "--dumpLayerInfo", "--profilingVerbosity=detailed")


def find_trtexec() -> str | None:
    return shutil.which("trtexec") or (JETPACK_TRTEXEC if Path(JETPACK_TRTEXEC).is_file() else None)


def trtexec_command(onnx_path: str, engine_path: str, config: BuildConfig, binary: str = "trtexec",
                    benchmark: bool = True, input_name: str = "input") -> list[str]:
    """trtexec's argv for the same build (and a benchmark run with the maintainers' flags)."""
    argv = [binary, f"--onnx={onnx_path}", f"--saveEngine={engine_path}",
            f"--memPoolSize=workspace:{config.workspace_mib}M",
            f"--builderOptimizationLevel={config.optimization_level}"]
    if config.strongly_typed:
        argv.append("--stronglyTyped")
    elif config.precision != "fp32":
        # TensorRT 10.x only: trtexec 11 dropped --fp16/--int8/--best
        argv.append({"fp16": "--fp16", "int8": "--int8", "best": "--best"}[config.precision])
    if config.tiling_optimization_level is not None:
        argv.append(f"--tilingOptimizationLevel={config.tiling_optimization_level}")
    if config.timing_cache:
        argv.append(f"--timingCacheFile={config.timing_cache}")
    argv += [f"--staticPlugins={p}" for p in config.plugins]
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
    return argv


def shape_arguments(argv: list[str], input_shape: list[int]) -> list[str]:
    """Fill the ``x...`` placeholders of the shape flags with the input's non-batch dimensions."""
    rest = "x".join(str(d) for d in input_shape[1:])
    return [a.replace("x...", f"x{rest}") for a in argv]


def as_shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
