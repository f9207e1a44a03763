"""edge's own TensorRT plugins in a bundle: their sources (compiled on the device) or a library cross-built on the
host with its stamp (docker/Dockerfile.cross), checked before anything is written."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import jetson
from edge.errors import EdgeError
from jetson.bundle import PLUGINS
from jetson.errors import JetsonError


def plugins_source_folder() -> Path:
    """``plugins/`` of the repository edge runs from (the plugin sources are not part of the installed package)."""
    folder = Path(jetson.__file__).resolve().parents[1] / "plugins"
    if not (folder / "CMakeLists.txt").is_file():
        raise EdgeError(f"edge's plugin sources are not at {folder}", expected="plugins/ of the edge repository "
                        "(CMakeLists.txt, edgePlugins.cpp, one folder per plugin)",
                        fix="run edge from a clone of its repository (pip install -e .), or ship a library "
                            "cross-built on the host: --plugin-lib")
    return folder


def holds_plugin_ops(graph: Path) -> bool:
    """Whether the graph holds a node of edge's plugin ops (jetson.plugin_build.PLUGIN_OPS)."""
    import onnx

    from jetson.plugin_build import PLUGIN_OPS

    model = onnx.load(str(graph), load_external_data=False)
    return any(node.op_type in PLUGIN_OPS for node in model.graph.node)


def check_plugin_library(library: str, sources: bool) -> None:
    from jetson.plugin_build import read_stamp, sha256_file, stamp_of

    if sources:
        raise EdgeError(f"--plugins with --plugin-lib {library}", expected="one of them: the sources, compiled on "
                        "the device, or a library cross-built on the host", fix="drop one of the two options")
    if not Path(library).is_file():
        raise EdgeError(f"--plugin-lib {library} does not exist",
                        expected="the library `make -C docker plugins` writes "
                                 "(plugins/build/aarch64/libedge_plugins.so)",
                        fix="run `make -C docker plugins` (docker/README.md), or bundle the sources: --plugins")
    stamp_path = Path(stamp_of(library))
    if not stamp_path.is_file():
        raise EdgeError(f"--plugin-lib {library} has no stamp beside it", expected=f"{stamp_path} (the JSON the cross "
                        "build writes: TensorRT, CUDA and JetPack versions, sha256)",
                        fix="ship the library with its stamp: both come from `make -C docker plugins`")
    try:
        stamp = read_stamp(stamp_path)
    except JetsonError as e:
        raise EdgeError(e.what, expected=e.expected, found=e.found, fix=e.fix) from e
    if stamp["sha256"] != sha256_file(library) or stamp["library"] != Path(library).name:
        raise EdgeError(f"--plugin-lib {library} is not the library its stamp {stamp_path.name} describes",
                        expected=f"{stamp['library']} with sha256 {stamp['sha256']}",
                        fix="ship the library and the stamp written by the same `make -C docker plugins`")


def ship_edge_plugins(plugin_library: str | None, sources: bool, needed: bool, out: Path,
                      progress: Callable[[str], None]) -> dict:
    """Ship edge's plugins into the bundle folder ``out``: the prebuilt ``plugin_library`` with its stamp, else
    the sources when asked (``sources``) or when a graph needs them; the build config's fields
    (jetson.bundle.BuildSpec plugin_sources or plugin_library), empty when none are shipped."""
    from jetson.bundle import PLUGIN_SOURCES
    from jetson.plugin_build import source_files, stamp_of

    if plugin_library:
        relative = f"{PLUGINS}/{Path(plugin_library).name}"
        (out / PLUGINS).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plugin_library, out / relative)
        shutil.copyfile(stamp_of(plugin_library), out / stamp_of(relative))
        progress(f"edge's plugins: the prebuilt {Path(plugin_library).name} and its stamp")
        return {"plugin_library": relative}
    if not (sources or needed):
        return {}
    folder = plugins_source_folder()
    files = source_files(folder)
    for name, path in files.items():
        (out / PLUGIN_SOURCES / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / PLUGIN_SOURCES / name)
    progress(f"edge's plugins: {len(files)} source files from {folder}, compiled on the device"
             + ("" if sources else " (a graph holds a plugin node)"))
    return {"plugin_sources": PLUGIN_SOURCES}

