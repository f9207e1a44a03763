"""``edge bundle``: what a Jetson needs to build and benchmark model variants, in one folder.

The inputs are graphs: ONNX files (the variant is the file's name) or :class:`SourceGraph` (a name
and a file). A bundle packages files and knows no pipeline run folder: the CLI asks edge.pipeline
for a run's graphs (each variant's cleaned static-batch graph) and passes them on, with the
manifest's ``source`` saying where they came from. Each variant is written at every precision asked
for: fp32 is the graph itself, fp16 and int8 (Q/DQ) are made by edge.precision.quantize (int8
calibrates on ``--data``/``--samples``, recorded in the manifest; each passes its accuracy gate, whose
figures the graph records and the variant's device gate carries as ``host``), and each carries its
TensorRT build config. The device-side package ``jetson/`` is copied in, so the bundle runs with
``cd BUNDLE && python3 -m jetson run``. The format (manifest, checksums, folders)
is defined once, in :mod:`jetson.bundle`.

The bundle is written into a temporary folder beside ``--out`` and renamed at the end, so an
error leaves no half-written bundle; ``--tar`` also writes ``OUT.tar.gz`` (the folder inside), the
same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import jetson
from edge.bundle.plugins import check_plugin_library, holds_plugin_ops, ship_edge_plugins
from edge.check.tensorrt_support import DEFAULT_TENSORRT
from edge.config import MAX_SAMPLES, option
from edge.errors import EdgeError
from edge.fileio import atomic_folder, sha256_file
from edge.precision.calibration import InputOptions
from edge.trt.builder import check_tactic_memory
from jetson.accuracy_gate import DEFAULT_GATE_IMAGES
from jetson.bundle import (
    CACHES,
    DEFAULT_TACTIC_DRAM_MIB,
    DEFAULT_WORKSPACE_MIB,
    GRAPH_PRECISION,
    GRAPHS,
    MANIFEST,
    PACKAGE,
    PLUGINS,
    PRECISIONS,
    BuildSpec,
    Protocol,
    Variant,
    manifest_json,
)
from jetson.errors import JetsonError

DEFAULT_PRECISIONS = ("fp32", "fp16")


@dataclass(frozen=True)
class BundleConfig:
    """What goes into a bundle besides the graphs: precisions, the build config, the benchmark protocol."""

    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    # int8 calibration and the fp16 range check (training split); None: a bundled model's data set, else refused
    data: str | None = None
    samples: int = option(500, minimum=1, maximum=MAX_SAMPLES)  # int8 calibration / fp16 range-check samples
    # the accuracy gates' images (test split): of the fp16/int8 graphs before they are written, and on the device;
    # None: the test split of ``data``, else a bundled model's check set (fmnist-mini), else refused
    check_data: str | None = None
    workspace_mib: int = option(DEFAULT_WORKSPACE_MIB, minimum=1, maximum=1 << 20)
    tactic_dram_mib: int = option(DEFAULT_TACTIC_DRAM_MIB, minimum=1, maximum=1 << 20)  # jetson.bundle says why
    optimization_level: int = option(3, minimum=0, maximum=5)
    tiling_optimization_level: int | None = option(None, minimum=0, maximum=3)
    timing_cache: str | None = None     # a TensorRT timing cache to ship (seeds the device's own)
    plugins: tuple[str, ...] = ()       # TensorRT plugin libraries (.so) to ship
    # edge's own plugins (plugins/ of the repository, jetson.plugin_build): True ships their sources, compiled on
    # the device (also done without asking for a graph holding a plugin node); plugin_library ships instead a
    # library cross-built on the host (docker/Dockerfile.cross) with its stamp beside it. Only the variants whose
    # graph holds a plugin node build with them: a plain twin's engine needs no nvcc and records no library
    edge_plugins: bool = False
    plugin_library: str | None = None
    protocol: Protocol = field(default_factory=Protocol)
    tf32: bool = True                   # False: every build config clears TF32 (edge bundle --no-tf32)
    tensorrt: str = DEFAULT_TENSORRT    # the TensorRT whose ONNX parser rules every packed graph must pass
    check_tensorrt: bool = True         # False: pack graphs that break those rules (edge bundle --no-trt-check)
    # held-out images (of check_data) the device runs each engine on, against the source graph's float32 ONNX
    # Runtime outputs (jetson.accuracy_gate); 0: no accuracy gate
    gate_images: int = option(DEFAULT_GATE_IMAGES, minimum=0, maximum=1024)
    # the preprocessing of graphs that record none (another exporter's): int8 calibration and the checks on images
    input_options: InputOptions | None = None

    def check(self) -> None:
        if not self.precisions:
            raise EdgeError("no --precision given", expected=f"some of {', '.join(PRECISIONS)}")
        check_tactic_memory(self.workspace_mib, self.tactic_dram_mib)
        unknown = [p for p in self.precisions if p not in PRECISIONS]
        if unknown:
            raise EdgeError(f"--precision {','.join(unknown)}", expected=f"some of {', '.join(PRECISIONS)}",
                            fix="pass e.g. --precision fp32,fp16,int8")
        for path in (self.timing_cache, *self.plugins):
            if path is not None and not Path(path).is_file():
                raise EdgeError(f"{path} does not exist", expected="a file to ship in the bundle")
        if self.plugin_library is not None:
            check_plugin_library(self.plugin_library, self.edge_plugins)


@dataclass(frozen=True)
class SourceGraph:
    """A graph to bundle, and the name its variant gets."""

    name: str
    path: Path
    precisions: tuple[str, ...] | None = None   # None: every precision of the bundle's config
    # precision -> a graph of this one that edge quantize already made at that precision (edge pipeline's, the
    # graphs its report evaluated): shipped as it is, not made a second time; it must have passed its gate
    made: dict[str, Path] = field(default_factory=dict)


def _precisions(graph: SourceGraph, config: BundleConfig) -> tuple[str, ...]:
    """The precisions ``graph`` is packed in: its own, else the config's (edge pipeline leaves out a graph's
    precision whose conversion fell below the accuracy gate)."""
    return tuple(graph.precisions) if graph.precisions is not None else tuple(config.precisions)


def _variant_name(path: Path) -> str:
    name = path.name.removesuffix(".onnx").removesuffix(".clean")
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name).lstrip(".") or "model"


def onnx_graph(path: str | Path) -> SourceGraph:
    """The ONNX file ``path`` as a graph to bundle, its variant named by the file's name."""
    path = Path(path)
    if not (path.suffix == ".onnx" and path.is_file()):
        raise EdgeError(f"{path} is not an ONNX file", expected="an existing .onnx file to bundle",
                        fix="pass .onnx files")
    return SourceGraph(_variant_name(path), path)


def source_graphs(graphs: Sequence[SourceGraph | str | Path]) -> list[SourceGraph]:
    """Every graph to bundle (paths: ONNX files); a name given twice is an error (variants are named uniquely)."""
    found = [g if isinstance(g, SourceGraph) else onnx_graph(g) for g in graphs]
    names = [g.name for g in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise EdgeError(f"two graphs would be variant {twice[0]!r}",
                        fix="rename one of the ONNX files, or bundle the runs separately")
    return found


def onnx_source(graphs: Sequence[SourceGraph | str | Path]) -> dict:
    """The manifest's ``source`` of graphs given as they are: ONNX files."""
    return {"kind": "onnx", "paths": [str(g.path if isinstance(g, SourceGraph) else g) for g in graphs]}


def _graph_io(path: Path) -> tuple[tuple[dict, ...], str]:
    """The inputs (name, shape, dtype) and the edge.precision of a graph."""
    import onnx

    from edge.onnx_metadata import source_precision

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        inputs.append({"name": value.name,
                       "shape": [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                 for d in tensor.shape.dim],
                       "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name})
    return tuple(inputs), source_precision(model)


def _write_precision(source: SourceGraph, precision: str, out: Path, config: BundleConfig,
                     progress: Callable[[str], None]) -> dict | None:
    """The graph of ``source`` at ``precision`` in ``out``; how it was made (int8: the calibration)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if _check_convertible(source, precision) == GRAPH_PRECISION[precision]:
        shutil.copyfile(source.path, out)
        return None
    if precision in source.made:
        return _copy_made(source, precision, out)
    from edge.precision.quantize import quantize_file

    progress(f"{source.name}: making the {precision} graph")
    if precision == "fp16":
        from edge.precision.fp16_ranges import RangeCheck

        result = quantize_file(source.path, out, "fp16", check_data=gate_data(config, source.path),
                               ranges=RangeCheck(data=config.data, samples=config.samples),
                               input_options=config.input_options, progress=progress)
        return {"conversion": "edge.quantize fp16", "check": result["check"]}
    from edge.precision.int8 import Int8Config

    result = quantize_file(source.path, out, "int8", int8=Int8Config(data=config.data, samples=config.samples),
                           check_data=gate_data(config, source.path), input_options=config.input_options,
                           progress=progress)
    return {"conversion": "edge.quantize int8 (Q/DQ)", "calibration": result["calibration"], "check": result["check"]}


def _copy_made(source: SourceGraph, precision: str, out: Path) -> dict:
    """The graph ``source.made`` names for ``precision``, checked (its precision, its accuracy gate) and copied."""
    import onnx

    from edge.onnx_metadata import CALIBRATION, metadata_of
    from edge.precision.gate import read_gate_record

    made = Path(source.made[precision])
    _, have = _graph_io(made)
    if have != GRAPH_PRECISION[precision]:
        raise EdgeError(f"{made} is a {have} graph, given as the {precision} graph of {source.name}",
                        expected=f"a {GRAPH_PRECISION[precision]} graph made by edge quantize",
                        fix=f"pass the {precision} graph, or leave it out so that the bundle makes it")
    metadata = metadata_of(onnx.load(str(made), load_external_data=False))
    gate = read_gate_record(metadata)
    if gate is None or gate.get("accepted_loss") or not gate.get("passed", True):
        raise EdgeError(f"{made} ({source.name}.{precision}) did not pass edge quantize's accuracy gate",
                        expected="a graph that passed the gate (edge bundle ships no other)",
                        fix="leave that precision out of the bundle, or make the graph again without --accept-loss")
    shutil.copyfile(made, out)
    made_record = {"conversion": f"edge.quantize {precision} (made before the bundle: {made})", "check": gate}
    if CALIBRATION in metadata:
        made_record["calibration"] = json.loads(metadata[CALIBRATION])
    return made_record


def _check_convertible(source: SourceGraph, precision: str) -> str:
    """The graph's own precision, if the bundle's ``precision`` is it or can be made from it."""
    _, have = _graph_io(source.path)
    if have not in (GRAPH_PRECISION[precision], "float32"):
        raise EdgeError(f"{source.path} is a {have} graph, which cannot make the {precision} variant",
                        expected=f"a float32 graph (each precision is made from it) or a {GRAPH_PRECISION[precision]}"
                                 " one",
                        fix=f"bundle the float32 graph, or ask only --precision {_bundle_precision(have)}")
    return have


def _with_input_options(source: SourceGraph, config: BundleConfig, folder: Path) -> SourceGraph:
    """``source`` with ``config.input_options`` recorded in its metadata (a float32 graph from another exporter: a
    copy in ``folder``, under its own file name), so that every precision, the checks and the accuracy gate run on
    images preprocessed as the user said; ``source`` itself without input options or when it is converted."""
    given = config.input_options
    if given is None or not given.given() or _graph_io(source.path)[1] != "float32":
        return source
    import onnx

    from edge.precision.calibration import with_input_options

    model = onnx.load(str(source.path))
    with_input_options(model, str(source.path), given)
    path = folder / source.path.name
    onnx.save(model, str(path))
    return SourceGraph(source.name, path, source.precisions, source.made)


def _check_inputs(source: SourceGraph, config: BundleConfig) -> None:
    """A graph that gets calibrated (int8 from float32) must have its preprocessing, recorded or in
    ``config.input_options`` (a graph from another exporter); its input options must fit it."""
    import onnx

    from edge.precision.calibration import input_spec_of

    needs_images = "int8" in _precisions(source, config) and _check_convertible(source, "int8") == "float32"
    given = config.input_options
    if needs_images or (given is not None and given.given()):
        input_spec_of(onnx.load(str(source.path), load_external_data=False), str(source.path), given)


def _bundle_precision(graph_precision: str) -> str:
    return {v: k for k, v in GRAPH_PRECISION.items()}.get(graph_precision, "fp32")


def _copy_package(out: Path) -> None:
    """The device-side package, sources only."""
    source = Path(jetson.__file__).parent
    for path in sorted(source.glob("*.py")):
        target = out / PACKAGE / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _ship(files: tuple[str, ...], folder: str, out: Path) -> list[str]:
    """Copy files into ``out/folder``; their paths relative to the bundle."""
    shipped = []
    for path in map(Path, files):
        relative = f"{folder}/{path.name}"
        if relative in shipped:
            raise EdgeError(f"two files named {path.name} would go to {folder}/", fix="rename one of them")
        (out / folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / relative)
        shipped.append(relative)
    return shipped


def make_bundle(graphs: Sequence[SourceGraph | str | Path], out: str | Path, config: BundleConfig | None = None, *,
                source: dict | None = None, tar: bool = False, force: bool = False,
                progress: Callable[[str], None] | None = None) -> dict:
    """Write the bundle folder ``out`` (and ``out.tar.gz`` with ``tar``) of ``graphs`` (ONNX files or
    SourceGraph); its manifest. ``source``: where the graphs came from, as the manifest records it
    (``{"kind": ..., "paths": [...]}``; default: :func:`onnx_source`)."""
    from edge import __version__

    config = config or BundleConfig()
    config.check()
    progress = progress or (lambda message: None)
    out = Path(out)
    if out.exists() and not force:
        raise EdgeError(f"{out} exists", expected="a new folder for the bundle", fix="pass another --out, or --force")
    source = source or onnx_source(graphs)
    graphs = source_graphs(graphs)
    for graph in graphs:  # before minutes of calibration, not after
        for precision in _precisions(graph, config):
            _check_convertible(graph, precision)
    for graph in graphs:
        _check_inputs(graph, config)
    needs_plugins = {graph.name: holds_plugin_ops(graph.path) for graph in graphs}
    with atomic_folder(out) as tmp, tempfile.TemporaryDirectory(prefix="edge-bundle-inputs-") as prepared:
        plugins = _ship(config.plugins, PLUGINS, tmp)
        edge_plugins = ship_edge_plugins(config.plugin_library, config.edge_plugins, any(needs_plugins.values()), tmp,
                                         progress)
        timing = _ship((config.timing_cache,), CACHES, tmp)[0] if config.timing_cache else None
        variants = []
        for original in graphs:
            graph = _with_input_options(original, config, Path(prepared))
            written = {}
            for precision in _precisions(original, config):  # every graph TensorRT refuses is named before the gate
                relative = f"{GRAPHS}/{graph.name}/{precision}.onnx"
                made = _write_precision(graph, precision, tmp / relative, config, progress)
                _check_tensorrt_rules(tmp / relative, f"{graph.name}.{precision}", config, progress)
                written[precision] = relative, made
            gate = _write_gate(graph, tmp, config, progress)
            gate = gate and dataclasses.replace(gate, source=str(original.path))
            for precision, (relative, made) in written.items():
                inputs_io, _ = _graph_io(tmp / relative)
                build = BuildSpec(precision=precision, workspace_mib=config.workspace_mib,
                                  tactic_dram_mib=config.tactic_dram_mib, optimization_level=config.optimization_level,
                                  tiling_optimization_level=config.tiling_optimization_level,
                                  timing_cache=timing, plugins=tuple(plugins), tf32=config.tf32,
                                  **(edge_plugins if needs_plugins[graph.name] else {}))
                variants.append(Variant(name=graph.name, precision=precision, graph=relative,
                                        graph_sha256=sha256_file(tmp / relative), build=build, inputs=inputs_io,
                                        calibration=(made or {}).get("calibration"), source=str(original.path),
                                        gate=replace(gate.spec(precision, config.tf32), host=host_gate(
                                            tmp / relative, f"{graph.name}.{precision}")) if gate else None))
                progress(f"{graph.name}.{precision}: {relative}")
        _copy_package(tmp)
        try:
            manifest = manifest_json(tmp, variants, config.protocol,
                                     {"edge": __version__, "created": datetime.now(timezone.utc).isoformat(
                                         timespec="seconds")}, source)
        except JetsonError as e:
            raise EdgeError(e.what, fix=e.fix) from e
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if tar:
        manifest["tar"] = str(write_tar(out))
    return manifest


def gate_data(config: BundleConfig, graph: Path) -> str | None:
    """The images every accuracy gate of ``graph`` reads, the host's and the device's alike: ``--gate-data``, else
    ``--data``, else (a graph of a bundled model) that model's check set; None: resolved where images are needed
    (a graph that records no preprocessing is gated on random inputs; any other is refused naming --gate-data)."""
    from edge.models import bundled_source

    bundled = bundled_source(graph)
    return config.check_data or config.data or (bundled.check_data if bundled is not None else None)


def _write_gate(graph: SourceGraph, out: Path, config: BundleConfig, progress: Callable[[str], None]):
    """The accuracy gate's files of ``graph`` (its images, its float32 outputs), shared by its precisions."""
    if not config.gate_images:
        return None
    from edge.precision.device_gate import write_gate

    progress(f"{graph.name}: accuracy gate: {config.gate_images} images and the source graph's outputs")
    try:
        return write_gate(graph.name, graph.path, out, gate_data(config, graph.path), config.gate_images)
    except JetsonError as e:  # the gate's own rules (jetson.accuracy_gate): bad input, not a bug of edge
        raise EdgeError(e.what, expected=e.expected, found=e.found, fix=e.fix) from e


def host_gate(graph: Path, variant: str) -> dict | None:
    """The accuracy gate figures ``edge quantize`` recorded in ``graph`` (edge.precision.gate), which the
    device's gate sets beside its own; None for a graph it did not make (fp32)."""
    import onnx

    from edge.onnx_metadata import metadata_of
    from edge.precision.gate import read_gate_record

    try:
        return read_gate_record(metadata_of(onnx.load(str(graph), load_external_data=False)))
    except ValueError as e:
        raise EdgeError(f"{variant}: the accuracy gate figures recorded in {graph.name} are not JSON",
                        found=str(e)[:200], fix="make the graph again with `edge quantize`") from e


def _check_tensorrt_rules(graph: Path, variant: str, config: BundleConfig, progress: Callable[[str], None]) -> None:
    """The TensorRT parser rules on a packed graph (edge.check.tensorrt_rules): a graph breaking one is refused
    with the findings, before a device spends minutes on a build that fails; with the check off, it is said.
    edge's plugin nodes are the rules' ``plugin`` rule's (a note when well formed: the bundle ships their library
    whenever a graph holds one)."""
    from edge.check.tensorrt_rules import check_file, refusal

    report = check_file(graph, config.tensorrt)
    if report["passed"]:
        return
    if config.check_tensorrt:
        report["graph"] = variant
        raise refusal([report], config.tensorrt,
                      fix="nothing was written; fix the graph (the fix of each finding above), or pack it anyway "
                          "with --no-trt-check")
    progress(f"{variant}: breaks {report['errors']} rule(s) of TensorRT {config.tensorrt}'s ONNX parser; packed "
             f"anyway (--no-trt-check); `edge check` lists them")


def write_tar(folder: Path) -> Path:
    """``FOLDER.tar.gz`` holding ``FOLDER/``, written to a temporary file and renamed."""
    target = folder.with_name(folder.name + ".tar.gz")
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder.parent)
    os.close(handle)
    try:
        with tarfile.open(temporary, "w:gz") as archive:
            archive.add(folder, arcname=folder.name)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


# ---- edge's own TensorRT plugins (jetson.plugin_build) -----------------------------------------------------
