"""edge's TensorRT plugins built where they run: from a bundle's plugin sources with the device's own nvcc and
TensorRT headers (cached), or a library cross-built on the host (docker/Dockerfile.cross), checked against
the device before it is used.

**Built on the device.** ``edge bundle --plugins`` (or a graph with a ``TokenDepthwiseConv`` node) ships
``plugins/`` of the repository (the kernels, the ``IPluginV3`` wrappers, ``edgePlugins.cpp`` and the CMake
files) as ``plugins/src/`` of the bundle. :func:`find_toolchain` finds JetPack's nvcc (``$EDGE_JETSON_NVCC``,
else ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``, where JetPack puts it without adding it to PATH)
and TensorRT's headers (``$EDGE_JETSON_TENSORRT_INCLUDE``, else ``/usr/include/aarch64-linux-gnu``, where
JetPack's ``libnvinfer-dev`` puts them), and reads their versions (``nvcc --version``; ``NvInferVersion.h``).
:func:`compile_argv` is the one command line, also what the cross build runs: every ``.cu`` and ``.cpp``
of the sources into one shared library, ``-shared -Xcompiler -fPIC``, hidden visibility (the library exports
``getCreators``, ``setLoggerFinder`` and the kernels' C ABI), cudart linked statically (nvcc's default), real
code for the device's SM only (``sm_87`` on Orin). It links no ``libnvinfer``: TensorRT calls the plugins
through their interfaces, so only the headers are needed. The library is cached in
``CACHE/plugins/KEY/libedge_plugins.so`` with ``build.json``; KEY is the sha256 of the sources (names and
contents), the TensorRT headers' version, nvcc's CUDA release, the SM and :data:`RECIPE`.

**Loaded before parsing.** The library exports ``getCreators``, which TensorRT's
``IPluginRegistry::loadLibrary`` (Python ``registry.load_library``) calls to register its creators; that is
what the runner's builder and runtime call before parsing or deserialising, and what trtexec's
``--dynamicPlugins`` calls (TensorRT 10.3's ``sampleEngines.cpp``). ``--staticPlugins`` and a
``ctypes.CDLL(..., RTLD_GLOBAL)`` only ``dlopen`` the file: they register the creators of libraries that
register themselves from static initialisers (``REGISTER_TENSORRT_PLUGIN``), which this one does not do.

**Cross-built on the host.** ``python3 -m jetson.plugin_build cross`` (run by docker/Dockerfile.cross in
NVIDIA's JetPack cross-compilation image) compiles the same command line with the aarch64 host compiler and
nvcc's ``aarch64-linux`` target, and writes a stamp beside the library (:data:`STAMP_FORMAT`: the library's
sha256, TensorRT, CUDA, JetPack and L4T versions, SM). ``edge bundle --plugin-lib PATH`` ships both;
:func:`check_prebuilt` refuses the library on a device whose TensorRT, CUDA, L4T (JetPack) or SM differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from jetson.errors import JetsonError

LIBRARY_NAME = "libedge_plugins.so"
#: the op types of edge's plugins: a graph holding one needs the library
PLUGIN_OPS = ("TokenDepthwiseConv",)
#: the files of a plugin source tree that are shipped and hashed (CMakeLists.txt for a CMake build by hand)
SOURCE_SUFFIXES = (".cu", ".cpp", ".h", ".cuh", ".txt")
COMPILED_SUFFIXES = (".cu", ".cpp")
#: the build recipe's version: bump it when :func:`compile_argv` changes, so cached libraries are rebuilt
RECIPE = 1
JETPACK_NVCC = "/usr/local/cuda/bin/nvcc"
#: where TensorRT's headers are on JetPack (libnvinfer-dev), on an x86 Debian/Ubuntu install, and in general
TENSORRT_INCLUDE_DIRS = ("/usr/include/aarch64-linux-gnu", "/usr/include/x86_64-linux-gnu", "/usr/include")
STAMP_FORMAT, STAMP_VERSION = "edge-plugin-library", 1
DEFAULT_SM = "87"  # Jetson Orin (Nano, NX, AGX)
#: JetPack release -> L4T (Jetson Linux) major.minor, for the cross build's stamp (JETSON-TENSORRT.md's table)
JETPACK_L4T = {"6.0": "36.3", "6.1": "36.4", "6.2": "36.4", "6.2.1": "36.4", "7.2": "39.2"}
INSTALL_FIX = ("install JetPack's CUDA toolkit and TensorRT headers: `sudo apt install nvidia-jetpack` (or only "
               "`sudo apt install cuda-nvcc-12-6 libnvinfer-dev`)")
PREBUILT_FIX = ("or cross-build the library on the host (`make -C docker plugins`, docker/README.md) and bundle it "
                "with `edge bundle --plugin-lib plugins/build/aarch64/libedge_plugins.so`")


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def stamp_of(library: str) -> str:
    """The stamp's path beside a library: ``plugins/libedge_plugins.so`` -> ``plugins/libedge_plugins.json``."""
    return str(Path(library).with_suffix(".json").as_posix())


# ---- the sources -------------------------------------------------------------------------------------------

def source_files(folder: Path) -> dict[str, Path]:
    """The plugin source files under ``folder`` by their POSIX path relative to it (build outputs, Python and
    Python's caches left out)."""
    found = {}
    for dirpath, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in ("build", "__pycache__") and not d.startswith("."))
        for name in sorted(names):
            path = Path(dirpath) / name
            if path.suffix in SOURCE_SUFFIXES:
                found[path.relative_to(folder).as_posix()] = path
    return found


def sources_sha256(folder: Path) -> str:
    """One sha256 of the source tree: every file's relative path and content."""
    listing = {name: sha256_file(path) for name, path in source_files(folder).items()}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


def compiled_sources(folder: Path) -> list[Path]:
    """The files compiled into the library: every ``.cu`` and ``.cpp`` of the tree, in a fixed order."""
    sources = [path for name, path in source_files(folder).items() if path.suffix in COMPILED_SUFFIXES]
    if not sources:
        raise JetsonError(f"{folder} holds no plugin sources (.cu, .cpp)",
                          expected="edge's plugins/ folder (edgePlugins.cpp and one folder per plugin)",
                          fix="make the bundle again with `edge bundle --plugins`")
    return sources


# ---- the toolchain -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    """nvcc and TensorRT's headers, with their versions; a host compiler and nvcc target folder for a cross build."""

    nvcc: str
    cuda: str                      # nvcc's release, "12.6"
    tensorrt_include: str
    tensorrt: str                  # the headers' version, "10.3.0"
    host_compiler: str | None = None
    target_dir: str | None = None  # nvcc --target-directory: "aarch64-linux" for a cross build


def find_nvcc(given: str | None = None) -> str | None:
    """``given``, else $EDGE_JETSON_NVCC, else nvcc on PATH, else JetPack's /usr/local/cuda/bin/nvcc; None if none."""
    for candidate in (given, os.environ.get("EDGE_JETSON_NVCC")):
        if candidate:
            return shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
    return shutil.which("nvcc") or (JETPACK_NVCC if os.access(JETPACK_NVCC, os.X_OK) else None)


def nvcc_release(nvcc: str) -> str:
    """nvcc's CUDA release ("Cuda compilation tools, release 12.6, V12.6.68" -> "12.6")."""
    try:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JetsonError(f"{nvcc} --version could not be run", found=str(e), fix=INSTALL_FIX) from e
    match = re.search(r"release (\d+\.\d+)", done.stdout)
    if done.returncode != 0 or match is None:
        raise JetsonError(f"{nvcc} --version printed no CUDA release", found=(done.stdout + done.stderr)[-300:],
                          fix=f"check the CUDA toolkit: {INSTALL_FIX}")
    return match.group(1)


def find_tensorrt_include(given: str | None = None) -> Path | None:
    """The folder holding NvInferRuntime.h: ``given``, else $EDGE_JETSON_TENSORRT_INCLUDE, else
    :data:`TENSORRT_INCLUDE_DIRS`; None if none has it."""
    for candidate in (given, os.environ.get("EDGE_JETSON_TENSORRT_INCLUDE")):
        if candidate:
            return Path(candidate) if (Path(candidate) / "NvInferRuntime.h").is_file() else None
    return next((Path(d) for d in TENSORRT_INCLUDE_DIRS if (Path(d) / "NvInferRuntime.h").is_file()), None)


def header_version(include: Path) -> str:
    """TensorRT's version from ``NvInferVersion.h`` ("10.3.0"): NV_TENSORRT_MAJOR/MINOR/PATCH, which 10.16
    defines through TRT_*_ENTERPRISE."""
    path = include / "NvInferVersion.h"
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise JetsonError(f"TensorRT's {path} cannot be read", found=str(e), fix=INSTALL_FIX) from e
    defines = dict(re.findall(r"#define\s+(\w+)\s+(\w+)", text))

    def value(name: str) -> str | None:
        seen = defines.get(name)
        return defines.get(seen, seen) if seen in defines else seen

    parts = [value(f"NV_TENSORRT_{p}") for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(p and p.isdigit() for p in parts):
        raise JetsonError(f"{path} defines no NV_TENSORRT_MAJOR/MINOR/PATCH", found=f"{parts}",
                          fix="check the TensorRT headers (libnvinfer-dev)")
    return ".".join(str(p) for p in parts)


def find_toolchain(nvcc: str | None = None, tensorrt_include: str | None = None, *, host_compiler: str | None = None,
                   target_dir: str | None = None) -> Toolchain:
    """nvcc and TensorRT's headers, or a JetsonError naming where they were looked for and how to install them."""
    found_nvcc = find_nvcc(nvcc)
    if found_nvcc is None:
        where = nvcc or os.environ.get("EDGE_JETSON_NVCC") or f"nvcc on PATH or {JETPACK_NVCC}"
        raise JetsonError(f"nvcc was not found ({where}): the bundle's plugin sources are compiled on this device",
                          expected=f"JetPack's CUDA compiler at {JETPACK_NVCC}",
                          fix=f"{INSTALL_FIX}; if it is installed elsewhere, set EDGE_JETSON_NVCC=/path/to/nvcc; "
                              + PREBUILT_FIX)
    include = find_tensorrt_include(tensorrt_include)
    if include is None:
        where = tensorrt_include or os.environ.get("EDGE_JETSON_TENSORRT_INCLUDE") or ", ".join(TENSORRT_INCLUDE_DIRS)
        raise JetsonError(f"TensorRT's headers (NvInferRuntime.h) were not found in {where}: the plugins' IPluginV3 "
                          "wrappers are compiled against them",
                          expected="JetPack's libnvinfer-dev in /usr/include/aarch64-linux-gnu",
                          fix=f"{INSTALL_FIX}; if they are elsewhere, set EDGE_JETSON_TENSORRT_INCLUDE=/that/folder; "
                              + PREBUILT_FIX)
    return Toolchain(nvcc=found_nvcc, cuda=nvcc_release(found_nvcc), tensorrt_include=str(include),
                     tensorrt=header_version(include), host_compiler=host_compiler, target_dir=target_dir)


# ---- the build ---------------------------------------------------------------------------------------------

def compile_argv(toolchain: Toolchain, sources: Path, output: Path, sm: str = DEFAULT_SM) -> list[str]:
    """nvcc's argv to compile the plugin sources under ``sources`` into the shared library ``output``."""
    argv = [toolchain.nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
            "-gencode", f"arch=compute_{sm},code=sm_{sm}"]
    if toolchain.host_compiler:
        argv += ["-ccbin", toolchain.host_compiler]
    if toolchain.target_dir:
        argv += ["--target-directory", toolchain.target_dir]
    argv += ["-isystem", toolchain.tensorrt_include, "-I", str(sources),
             *map(str, compiled_sources(sources)), "-o", str(output)]
    return argv


def build_key(sources_digest: str, toolchain: Toolchain, sm: str) -> str:
    """The cache key of a library: sources, TensorRT headers, CUDA release, SM, cross target and recipe."""
    text = json.dumps({"sources": sources_digest, "tensorrt": toolchain.tensorrt, "cuda": toolchain.cuda, "sm": sm,
                       "target": toolchain.target_dir, "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class PluginLibrary:
    """A plugin library ready to load: where it is, what it is and how it came (``built``, ``cached``: built
    before on this device; ``prebuilt``: cross-built on a host, its stamp checked)."""

    path: str
    sha256: str
    origin: str
    cache_key: str | None
    tensorrt: str
    cuda: str
    sm: str
    build_seconds: float | None = None
    stamp: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)


def run_compiler(argv: list[str], log_path: Path, timeout_s: float = 900) -> float:
    """Run nvcc with its output into ``log_path`` (the argv on its first line); the seconds it took."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        log.write(("# " + " ".join(argv) + "\n").encode())
        log.flush()
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)
        except OSError as e:
            raise JetsonError(f"{argv[0]} could not be started", found=str(e), fix=INSTALL_FIX) from e
        except subprocess.TimeoutExpired as e:
            raise JetsonError(f"nvcc did not finish within {timeout_s:g} s; its output: {log_path}") from e
    if done.returncode != 0:
        tail = "\n    ".join(log_path.read_text(errors="replace").rstrip().splitlines()[-15:])
        raise JetsonError(f"nvcc failed (exit {done.returncode}) compiling the plugins; its whole output: {log_path}",
                          found="\n    " + tail,
                          fix="the log names the file and line; a TensorRT whose plugin API differs from 10.3's "
                              "(IPluginV3) cannot compile them: report it with the log")
    return time.perf_counter() - started


def build_library(sources: Path, cache_root: Path, toolchain: Toolchain, *, sm: str = DEFAULT_SM,
                  log_path: Path | None = None, log=print) -> PluginLibrary:
    """The library of ``sources`` for this toolchain: from ``cache_root/KEY/`` when built before (its sha256
    checked), else compiled into a temporary folder there and renamed into place (never half written).
    nvcc's output goes to ``log_path`` (default ``cache_root/KEY.nvcc.log``), kept whether it succeeds or not."""
    key = build_key(sources_sha256(sources), toolchain, sm)
    folder = cache_root / key
    library, record_path = folder / LIBRARY_NAME, folder / "build.json"
    if library.is_file() and record_path.is_file():
        try:
            record = json.loads(record_path.read_text())
        except ValueError:
            record = {}
        if record.get("sha256") == sha256_file(library):
            log(f"plugin library from the cache: {library}")
            return PluginLibrary(str(library), record["sha256"], "cached", key, toolchain.tensorrt, toolchain.cuda, sm)
        log(f"the cached plugin library {library} does not match its build.json: building it again")
    cache_root.mkdir(parents=True, exist_ok=True)
    log_path = log_path or cache_root / f"{key}.nvcc.log"
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root))
    try:
        argv = compile_argv(toolchain, sources, work / LIBRARY_NAME, sm)
        log(f"compiling the plugins with {toolchain.nvcc} (CUDA {toolchain.cuda}, TensorRT {toolchain.tensorrt} "
            f"headers, sm_{sm}): {len(compiled_sources(sources))} files")
        seconds = run_compiler(argv, log_path)
        built = work / LIBRARY_NAME
        if not built.is_file() or built.stat().st_size == 0:
            raise JetsonError(f"nvcc exited 0 but wrote no library; its output: {log_path}")
        digest = sha256_file(built)
        record = {"key": key, "sha256": digest, "tensorrt": toolchain.tensorrt, "cuda": toolchain.cuda, "sm": sm,
                  "argv": argv, "sources": str(sources), "log": str(log_path),
                  "build_seconds": round(seconds, 2), "recipe": RECIPE,
                  "built": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (work / "build.json").write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"plugin library built in {seconds:.1f} s: {library} (sha256 {digest[:16]})")
    return PluginLibrary(str(library), digest, "built", key, toolchain.tensorrt, toolchain.cuda, sm,
                         build_seconds=round(seconds, 2))


# ---- a prebuilt library and its stamp ----------------------------------------------------------------------

def write_stamp(library: Path, toolchain: Toolchain, *, jetpack: str, sm: str, image: str | None = None) -> Path:
    """The stamp beside ``library``: what it was built for, with its sha256."""
    stamp = {"format": STAMP_FORMAT, "format_version": STAMP_VERSION, "library": library.name,
             "sha256": sha256_file(library), "tensorrt": toolchain.tensorrt, "cuda": toolchain.cuda,
             "jetpack": jetpack, "l4t": JETPACK_L4T.get(jetpack), "sm": sm, "target": toolchain.target_dir,
             "image": image, "recipe": RECIPE, "built": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = Path(stamp_of(str(library)))
    path.write_text(json.dumps(stamp, indent=1) + "\n")
    return path


def read_stamp(path: Path) -> dict:
    try:
        stamp = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise JetsonError(f"the plugin library's stamp {path} cannot be read", found=str(e),
                          fix="bundle the library with the stamp the cross build wrote beside it") from e
    if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT:
        raise JetsonError(f"{path} is not a plugin library stamp", expected=f"format {STAMP_FORMAT!r}",
                          found=f"{stamp.get('format') if isinstance(stamp, dict) else type(stamp).__name__!r}",
                          fix="bundle the library with the stamp that `make -C docker plugins` wrote beside it")
    missing = [f for f in ("library", "sha256", "tensorrt", "cuda", "jetpack", "sm") if not stamp.get(f)]
    if missing:
        raise JetsonError(f"the stamp {path} lacks {', '.join(missing)}",
                          fix="cross-build the library again (`make -C docker plugins`)")
    return stamp


def _major_minor(version: str | None) -> str | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def prebuilt_mismatches(stamp: dict, *, tensorrt: str | None, cuda: str | None, l4t: str | None,
                        sm: str | None) -> list[str]:
    """How a stamp differs from the device (each as "what: stamp X, device Y"); an unknown device fact is no
    mismatch (the caller says it could not be checked)."""
    found = []
    for name, built, here in (("TensorRT", stamp.get("tensorrt"), tensorrt), ("CUDA", stamp.get("cuda"), cuda),
                              ("L4T (JetPack)", stamp.get("l4t"), l4t)):
        if built and here and _major_minor(built) != _major_minor(here):
            found.append(f"{name}: library {built}" + (f" (JetPack {stamp['jetpack']})" if name.startswith("L4T")
                                                       else "") + f", device {here}")
    if sm and str(stamp.get("sm")) != sm:
        found.append(f"GPU: library sm_{stamp.get('sm')}, device sm_{sm}")
    return found


def check_prebuilt(library: Path, *, tensorrt: str | None, cuda: str | None, l4t: str | None,
                   sm: str | None, log=print) -> PluginLibrary:
    """A cross-built library, refused when its stamp names another TensorRT, CUDA, L4T (JetPack) or SM than the
    device's, or its sha256 is not the stamp's."""
    stamp_path = Path(stamp_of(str(library)))
    stamp = read_stamp(stamp_path)
    digest = sha256_file(library)
    if digest != stamp["sha256"]:
        raise JetsonError(f"the plugin library {library} is not the one its stamp {stamp_path.name} describes",
                          expected=stamp["sha256"], found=digest,
                          fix="bundle the library and the stamp written by the same cross build")
    different = prebuilt_mismatches(stamp, tensorrt=tensorrt, cuda=cuda, l4t=l4t, sm=sm)
    if different:
        raise JetsonError(f"the bundle's prebuilt plugin library {library.name} was built for another device "
                          "software: a plugin compiled against other TensorRT headers or another CUDA does not load "
                          "(or crashes) here", found="; ".join(different),
                          fix=f"rebuild it for this device: on the device itself, bundle the sources instead "
                              f"(`edge bundle --plugins`, the runner compiles them here), or cross-build with the "
                              f"device's JetPack tag (JETPACK_CROSS_IMAGE in docker/tags.env, e.g. "
                              f"nvcr.io/nvidia/jetpack-linux-aarch64-crosscompile-x86:<JetPack>) and "
                              f"`make -C docker plugins`")
    unknown = [name for name, value in (("TensorRT", tensorrt), ("CUDA", cuda), ("L4T", l4t)) if not value]
    if unknown:
        log(f"the prebuilt plugin library {library.name}: this device's {', '.join(unknown)} is unknown, not checked")
    return PluginLibrary(str(library), digest, "prebuilt", None, tensorrt=stamp["tensorrt"], cuda=stamp["cuda"],
                         sm=str(stamp["sm"]), stamp=stamp)


# ---- command line (the cross build, and a build by hand on the device) -------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m jetson.plugin_build",
                                     description="Compile edge's TensorRT plugins into libedge_plugins.so.")
    parser.add_argument("command", choices=("build", "cross"),
                        help="build: for this machine, into --out; cross: for aarch64 (NVIDIA's JetPack "
                             "cross-compilation image), into --out with its stamp")
    parser.add_argument("--sources", type=Path, required=True, help="edge's plugins/ folder")
    parser.add_argument("--out", type=Path, required=True, help="the folder the library (and stamp) go to")
    parser.add_argument("--sm", default=DEFAULT_SM, help="the GPU's SM (87: Jetson Orin)")
    parser.add_argument("--nvcc", help="nvcc (default: $EDGE_JETSON_NVCC, PATH, /usr/local/cuda/bin/nvcc)")
    parser.add_argument("--tensorrt-include", help="the folder of NvInferRuntime.h")
    parser.add_argument("--jetpack", help="cross: the JetPack release the library is for (the image's tag)")
    parser.add_argument("--image", help="cross: the image it was built in (recorded in the stamp)")
    parser.add_argument("--host-compiler", default="aarch64-linux-gnu-g++", help="cross: the aarch64 C++ compiler")
    parser.add_argument("--target-dir", default="aarch64-linux", help="cross: nvcc's target folder")
    args = parser.parse_args(argv)
    cross = args.command == "cross"
    try:
        if cross and not args.jetpack:
            raise JetsonError("cross: --jetpack is missing", expected="the JetPack release, e.g. 6.1")
        toolchain = find_toolchain(args.nvcc, args.tensorrt_include,
                                   host_compiler=args.host_compiler if cross else None,
                                   target_dir=args.target_dir if cross else None)
        args.out.mkdir(parents=True, exist_ok=True)
        library = args.out / LIBRARY_NAME
        partial = args.out / f".{LIBRARY_NAME}.partial"
        run_compiler(compile_argv(toolchain, args.sources, partial, args.sm), args.out / "nvcc.log")
        os.replace(partial, library)
        print(f"wrote {library} (TensorRT {toolchain.tensorrt} headers, CUDA {toolchain.cuda}, sm_{args.sm})")
        if cross:
            print(f"wrote {write_stamp(library, toolchain, jetpack=args.jetpack, sm=args.sm, image=args.image)}")
    except JetsonError as e:
        print(f"jetson.plugin_build: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
