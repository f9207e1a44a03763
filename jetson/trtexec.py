"""Engines built by NVIDIA's ``trtexec`` (``python3 -m jetson run --builder trtexec``) from a bundle's
build config, for the TensorRT version trtexec itself reports; shared with ``edge build --trtexec``
(edge.trt.trtexec_command), which imports the version logic from here.

Which flags exist depends on trtexec's version (``samples/common/sampleOptions.cpp`` of each
release): ``--tilingOptimizationLevel`` from 10.8 (10.3 stops with "Unknown option"); 11 dropped
``--fp16/--int8/--best/--calib`` (weak typing) and turned ``--stronglyTyped``, ``--useCudaGraph``,
``--noDataTransfers``, ``--useSpinWait`` and ``--separateProfileRun`` into deprecated no-ops (their
behaviour is the default). The version comes from trtexec's banner (``[TensorRT v100300]``), printed
by ``--help``; an engine only deserialises in the TensorRT that built it, so a trtexec whose version
is not the Python module's is refused before it builds anything.

The build: ``--onnx``, ``--saveEngine``, ``--skipInference`` (the runner benchmarks the engine
itself), ``--memPoolSize=workspace:NM``, ``--builderOptimizationLevel``, ``--profilingVerbosity=detailed``
(per-layer names for the runner's layer table; a build config's tactic-DRAM cap cannot be given: trtexec has
no such pool, so it is listed in ``not_available`` and the knobs record it as not applied), strong typing
(``--stronglyTyped`` before 11: the precision is the graph's own) or, for a weakly typed build config,
``--fp16`` or ``--int8 --calib=``
the bundle's calibration cache (10.x only), ``--minShapes/--optShapes/--maxShapes`` for inputs with a
dynamic batch, ``--timingCacheFile`` (the device's own, read and written by trtexec),
``--staticPlugins`` per plugin library shipped as it is (``dlopen``: libraries that register their creators
from static initialisers) and ``--dynamicPlugins`` for edge's own plugin library (``IPluginRegistry::loadLibrary``,
which calls its ``getCreators``: jetson.plugin_build). The argv is a list (never a shell); trtexec's whole output
goes to a log file that is kept whether it succeeds or not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from jetson.bundle import BuildSpec
from jetson.errors import JetsonError

JETPACK_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"
#: no-ops in trtexec 11 (its default behaviour), left out there
NO_OPS_IN_11 = ("--stronglyTyped", "--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun")
TILING_SINCE = (10, 8)
WEAK_TYPING_FLAGS = {"fp16": "--fp16", "int8": "--int8"}
LOG_TAIL_LINES = 15
#: why a build config's TACTIC_DRAM cap (edge.bundle: 3072 MiB, what keeps an 8 GB Orin Nano's build from the OOM
#: killer) is not applied by trtexec: its --memPoolSize takes only these pools (samples/common/sampleOptions.cpp at
#: v10.3.0, ~1146-1173, and at release/10.16), any other name stops it with "Unknown memory pool"
TRTEXEC_MEMORY_POOLS = ("workspace", "dlaSRAM", "dlaLocalDRAM", "dlaGlobalDRAM", "tacticSharedMem")
TACTIC_DRAM_NOTE = (f"not applied: trtexec's --memPoolSize takes only {', '.join(TRTEXEC_MEMORY_POOLS)} (no "
                    "tactic DRAM pool), so the build may take TensorRT's default (75 % of the device's memory); "
                    "--builder python applies the cap")


def find_trtexec(given: str | None = None) -> str | None:
    """``given`` (a path, or a name on PATH), else ``trtexec`` on PATH, else JetPack's own; None when none is there."""
    if given:
        return shutil.which(given) or (given if Path(given).is_file() else None)
    return shutil.which("trtexec") or (JETPACK_TRTEXEC if Path(JETPACK_TRTEXEC).is_file() else None)


def banner_version(text: str) -> tuple[int, int, int] | None:
    """TensorRT's version from trtexec's banner: "[TensorRT v100300]" -> (10, 3, 0); 8.x wrote v8601."""
    match = re.search(r"\[TensorRT v(\d+)\]", text)
    if not match:
        return None
    n = int(match.group(1))
    if n >= 100000:  # 10.0 on: major * 10000 + minor * 100 + patch
        return n // 10000, n // 100 % 100, n % 100
    return n // 1000, n // 100 % 10, n % 100  # 8.x: major * 1000 + minor * 100 + patch


def trtexec_version(binary: str) -> tuple[int, int, int] | None:
    """The TensorRT version of a trtexec binary (its banner, printed by ``--help``), None if it says none."""
    try:
        done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return banner_version(done.stdout + done.stderr)


def _dims(shape: Sequence) -> list[int | None]:
    """A bundle input shape with every dynamic dimension (a name, null or -1) as None."""
    return [d if isinstance(d, int) and d >= 0 else None for d in shape]


def shape_flags(inputs: Sequence[dict], spec: BuildSpec) -> list[str]:
    """``--minShapes/--optShapes/--maxShapes`` for the inputs with a dynamic batch: the spec's
    min/opt/max batch, else its fixed batch (1 by default), as the Python builder's profile has them."""
    dynamic = [(str(i["name"]), _dims(i["shape"])) for i in inputs if None in _dims(i["shape"])]
    if not dynamic:
        return []
    if spec.min_batch is not None:
        batches = (spec.min_batch, spec.opt_batch or spec.min_batch, spec.max_batch or spec.min_batch)
    else:
        batches = (spec.batch or 1,) * 3
    specs: list[list[str]] = [[], [], []]
    for name, dims in dynamic:
        if None in dims[1:]:
            raise JetsonError(f"input {name} has dynamic dimensions besides the batch: {dims}",
                              fix="bundle a graph exported with a fixed image size")
        quoted = f"'{name}'" if re.search(r"[:,']", name) else name  # trtexec's quoting of names with : or ,
        for target, batch in zip(specs, batches):
            target.append(f"{quoted}:" + "x".join(str(d) for d in [batch, *dims[1:]]))
    return [f"--{kind}Shapes={','.join(s)}" for kind, s in zip(("min", "opt", "max"), specs)]


def build_argv(binary: str, graph: Path, engine: Path, spec: BuildSpec, version: tuple[int, ...], *,
               inputs: Sequence[dict] = (), timing_cache: Path | None = None, plugins: Sequence[Path] = (),
               calibration_cache: Path | None = None,
               dynamic_plugins: Sequence[Path] = ()) -> tuple[list[str], dict[str, str]]:
    """trtexec's argv to build ``graph`` into ``engine`` with ``spec``, for trtexec ``version``; with the
    build config's settings this version lacks or ignores, each with why (as the Python builder's
    ``not_available``)."""
    argv = [binary, f"--onnx={graph}", f"--saveEngine={engine}", "--skipInference",
            f"--memPoolSize=workspace:{spec.workspace_mib}M", f"--builderOptimizationLevel={spec.optimization_level}",
            "--profilingVerbosity=detailed"]
    notes: dict[str, str] = {}
    release = ".".join(map(str, version))
    if spec.strongly_typed:
        if version >= (11,):
            notes["--stronglyTyped"] = "a no-op in trtexec 11 (every network is strongly typed)"
        else:
            argv.append("--stronglyTyped")
        if calibration_cache is not None:
            notes["--calib"] = "not used: a strongly typed build takes the INT8 scales from the graph's Q/DQ nodes"
    elif spec.precision != "fp32":
        if version >= (11,):
            raise JetsonError(f"trtexec {release} has no --{spec.precision}: the bundle asks for a weakly typed "
                              f"{spec.precision} build, and TensorRT 11 removed weak typing",
                              expected="a strongly typed build config (edge bundle writes them), or TensorRT 10.x",
                              fix="make the bundle again with `edge bundle` (its fp16 and int8 graphs carry "
                                  "their precision)")
        argv.append(WEAK_TYPING_FLAGS[spec.precision])
        if spec.precision == "int8":
            if calibration_cache is None:
                raise JetsonError("a weakly typed int8 build needs the bundle's calibration cache, and the "
                                  "build config names none",
                                  found="without --calib trtexec quantizes with placeholder scales: the engine's "
                                        "accuracy would mean nothing",
                                  fix="bundle the int8 variant as a Q/DQ graph (edge bundle --precision int8)")
            argv.append(f"--calib={calibration_cache}")
    if spec.tiling_optimization_level is not None:
        if version >= TILING_SINCE:
            argv.append(f"--tilingOptimizationLevel={spec.tiling_optimization_level}")
        else:
            notes["--tilingOptimizationLevel"] = (f"exists from TensorRT 10.8; trtexec {release} stops on it "
                                                  "(\"Unknown option\")")
    if spec.tactic_dram_mib is not None:
        notes["tactic_dram_mib"] = TACTIC_DRAM_NOTE
    if not spec.tf32:
        argv.append("--noTF32")
    if timing_cache is not None:
        argv.append(f"--timingCacheFile={timing_cache}")
    argv += [f"--staticPlugins={p}" for p in plugins]
    argv += [f"--dynamicPlugins={p}" for p in dynamic_plugins]
    argv += shape_flags(inputs, spec)
    return argv, notes


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n    ".join(text.rstrip().splitlines()[-lines:]) or "(no output)"


def run_trtexec(argv: list[str], log_path: Path, *, timeout_s: float | None = None) -> float:
    """Run trtexec with its stdout and stderr into ``log_path`` (kept in any case); the seconds it took.
    A failure raises a JetsonError with the log's last lines; an interruption kills trtexec."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        log.write(("# " + " ".join(argv) + "\n").encode())  # the argv as run (a list: no shell, no quoting)
        log.flush()
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)
        except OSError as e:
            raise JetsonError(f"trtexec {argv[0]} could not be started", found=str(e),
                              fix="check the path (--trtexec) and that it is executable") from e
        except subprocess.TimeoutExpired as e:
            raise JetsonError(f"trtexec did not finish within {timeout_s:g} s; its output: {log_path}",
                              found=_tail(log_path)) from e
    if done.returncode != 0:
        raise JetsonError(f"trtexec failed (exit {done.returncode}); its whole output: {log_path}",
                          found="\n    " + _tail(log_path),
                          fix="the log names the cause (an unsupported node, out of memory: then bundle with a "
                              "smaller --workspace); or build with TensorRT's Python API: --builder python")
    return time.perf_counter() - started


def build_engine_with_trtexec(binary: str, version: tuple[int, ...], graph: Path, spec: BuildSpec, *,
                              work_dir: Path, log_path: Path, inputs: Sequence[dict] = (),
                              timing_cache: Path | None = None, plugins: Sequence[Path] = (),
                              calibration_cache: Path | None = None, dynamic_plugins: Sequence[Path] = (),
                              timeout_s: float | None = None) -> tuple[bytes, dict]:
    """Build with trtexec into ``work_dir`` (removed after); the engine's bytes and the build facts."""
    work_dir.mkdir(parents=True, exist_ok=True)
    engine_path = work_dir / "trtexec.engine"
    engine_path.unlink(missing_ok=True)
    argv, notes = build_argv(binary, graph, engine_path, spec, version, inputs=inputs, timing_cache=timing_cache,
                             plugins=plugins, calibration_cache=calibration_cache, dynamic_plugins=dynamic_plugins)
    cache_before = timing_cache.stat().st_size if timing_cache is not None and timing_cache.is_file() else 0
    if timing_cache is not None:
        timing_cache.parent.mkdir(parents=True, exist_ok=True)  # trtexec writes the file, not its folder
    try:
        seconds = run_trtexec(argv, log_path, timeout_s=timeout_s)
        if not engine_path.is_file() or engine_path.stat().st_size == 0:
            raise JetsonError(f"trtexec exited 0 but wrote no engine at {engine_path}; its output: {log_path}",
                              found="\n    " + _tail(log_path), fix="run the command at the top of the log by hand")
        engine = engine_path.read_bytes()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    honoured = {"workspace_mib": spec.workspace_mib, "optimization_level": spec.optimization_level, "tf32": spec.tf32}
    if spec.tiling_optimization_level is not None and "--tilingOptimizationLevel" not in notes:
        honoured["tiling_optimization_level"] = spec.tiling_optimization_level
    not_available = {knob: notes[note] for knob, note in (("tactic_dram_mib", "tactic_dram_mib"),
                                                          ("tiling_optimization_level", "--tilingOptimizationLevel"))
                     if note in notes}
    knobs = {"honoured": honoured, "not_available": not_available}  # in the Python builder's terms (jetson.engine)
    facts = {"builder": "trtexec", "knobs": knobs,
             "trtexec": {"path": binary, "version": ".".join(map(str, version)),
                         "argv": argv, "log": str(log_path), "not_available": notes},
             "timing_cache": {"path": str(timing_cache) if timing_cache else None, "loaded_bytes": cache_before},
             "build_seconds": round(seconds, 2)}
    return engine, facts
