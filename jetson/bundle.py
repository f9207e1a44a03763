"""The bundle: everything a device needs to build and benchmark a set of model variants, and nothing else.

``edge bundle`` (edge.bundle) writes it on the host; the device runner (jetson.runner) reads it.
Both go through this module, so the format has one definition. A bundle is a folder (``edge bundle
--tar`` also packs it into ``BUNDLE.tar.gz`` holding the folder ``BUNDLE/``)::

    BUNDLE/
      manifest.json            this module's format (below)
      graphs/NAME/PRECISION.onnx   one ONNX graph per variant and precision, its precision inside
      caches/...               timing caches and INT8 calibration caches shipped with it, if any
      plugins/...              TensorRT plugin libraries (.so), if any; edge's own plugins as sources
                               (plugins/src/: compiled on the device, jetson.plugin_build) or cross-built
                               (plugins/libedge_plugins.so with its stamp plugins/libedge_plugins.json)
      gate/...                 the accuracy gate's images and reference outputs (.npy; jetson.accuracy_gate)
      jetson/...               the device-side package itself (run with `python3 -m jetson run`)

``manifest.json`` (format ``edge-jetson-bundle``, version :data:`FORMAT_VERSION`)::

    {"format": "edge-jetson-bundle", "format_version": 1,
     "created_by": {"edge": "0.4.0", "created": "2025-01-01T00:00:00+00:00"},
     "source": {"kind": "pipeline" | "onnx", "paths": [...]},
     "protocol": {"warmup": 1, "warmup_s": 0.2, "iterations": 10, "duration_s": 3.0, "energy_duration_s": 10.0,
                  "cuda_graph": true, "idle_s": 2.0, "tegrastats_interval_ms": 100},
     "variants": [{"name": "baseline", "precision": "fp16", "graph": "graphs/baseline/fp16.onnx",
                   "graph_sha256": "...", "inputs": [{"name": "input", "shape": [1, 1, 28, 28],
                   "dtype": "float32"}], "calibration": null | {...how the int8 graph was calibrated},
                   "source": "runs/x/variants/baseline/model.clean.onnx",
                   "gate": null | {"inputs": {"input": "gate/inputs/....npy"}, "reference": {"logits":
                            "gate/baseline/reference_0.npy"}, "images": 32, "data": "fmnist-mini:test",
                            "source": "...", "thresholds": {"min_top1_agreement": 0.9, "max_rel_error": 0.05,
                            "max_abs_error": null},
                            "host": null | {...edge quantize's gate of the graph: edge.accuracy_gate}},
                   "build": {"precision": "fp16", "strongly_typed": true, "workspace_mib": 2048,
                             "optimization_level": 3, "tiling_optimization_level": null,
                             "tactic_dram_mib": 3072, "batch": null,
                             "min_batch": null, "opt_batch": null, "max_batch": null,
                             "timing_cache": null | "caches/...", "plugins": ["plugins/x.so"],
                             "calibration_cache": null | "caches/...", "tf32": true,
                             "plugin_sources": null | "plugins/src",
                             "plugin_library": null | "plugins/libedge_plugins.so"}}],
     "files": {"graphs/baseline/fp16.onnx": {"sha256": "...", "bytes": 12345}, "jetson/runner.py": {...}}}

``files`` lists every file of the bundle but ``manifest.json``, with its sha256 and size. The runner
refuses a bundle where a listed file is missing, has another size or sha256, or where a file that
is not listed sits in one of the bundle's own folders (:data:`OWNED`; Python's ``__pycache__`` aside),
naming the file. Anything else in the folder (``results/``, which the runner writes by default) is
not the bundle's and is not checked. The sha256 of ``manifest.json``'s bytes identifies the bundle
in results (``bundle_sha256``): a variant's result counts as done only for the same bundle.

A variant's id is ``NAME.PRECISION`` (names are ``[A-Za-z0-9_.-]``, no leading dot).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jetson.accuracy_gate import GATE, GateSpec
from jetson.errors import JetsonError
from jetson.plugin_build import sha256_file, stamp_of

FORMAT = "edge-jetson-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
GRAPHS, CACHES, PLUGINS, PACKAGE = "graphs", "caches", "plugins", "jetson"
PLUGIN_SOURCES = f"{PLUGINS}/src"  # edge's plugin sources (plugins/ of the repository), built on the device
OWNED = (GRAPHS, CACHES, PLUGINS, PACKAGE, GATE)
PRECISIONS = ("fp32", "fp16", "int8")
#: the ONNX precision (edge.precision metadata) each bundle precision's graph has
GRAPH_PRECISION = {"fp32": "float32", "fp16": "float16", "int8": "int8"}
#: The build's memory limits on an 8 GB Orin Nano, where CPU and GPU share one LPDDR5 (about 7.4 GiB visible,
#: 1.5-2 GiB of it taken by JetPack's desktop) and TensorRT's own defaults are sized for the whole device
#: (WORKSPACE: the device's total memory; TACTIC_DRAM: 75 % of it on an embedded GPU, about 5.6 GiB):
#: a build that takes them runs the board out of memory and the kernel kills it.
#: WORKSPACE, the scratch one layer's tactic may use: 2 GiB (Ultralytics' advice for Jetson; larger tactics
#: are skipped, not failed).
DEFAULT_WORKSPACE_MIB = 2048
#: TACTIC_DRAM (TensorRT 8.6+), all the memory the optimiser holds while timing tactics, workspace included:
#: 3 GiB = 7.4 GiB - 2 GiB (desktop) - about 1.5 GiB for the builder's own host memory (the parsed network,
#: its weights, the serialised engine: about 4 times the weights of a ViT-B) - about 1 GiB left free.
DEFAULT_TACTIC_DRAM_MIB = 3072
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class BuildSpec:
    """How the device builds a variant's engine (strongly typed: the precision is the graph's own).
    Paths are relative to the bundle."""

    precision: str
    strongly_typed: bool = True
    workspace_mib: int = DEFAULT_WORKSPACE_MIB
    optimization_level: int = 3
    tiling_optimization_level: int | None = None
    #: MemoryPoolType.TACTIC_DRAM in MiB (None: TensorRT's default, 75 % of the device's memory on a Jetson)
    tactic_dram_mib: int | None = DEFAULT_TACTIC_DRAM_MIB
    batch: int | None = None
    min_batch: int | None = None
    opt_batch: int | None = None
    max_batch: int | None = None
    timing_cache: str | None = None
    plugins: tuple[str, ...] = ()
    calibration_cache: str | None = None
    #: fp32 matrix products in TF32 (TensorRT's default; about 1e-3 relative from ONNX Runtime); False clears
    #: BuilderFlag.TF32 (trtexec --noTF32)
    tf32: bool = True
    #: edge's plugin sources (a folder of the bundle, :data:`PLUGIN_SOURCES`), compiled on the device into the
    #: library the build loads (jetson.plugin_build); None: the graph needs none
    plugin_sources: str | None = None
    #: or edge's plugin library cross-built on a host, with its stamp beside it (jetson.plugin_build.stamp_of)
    plugin_library: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise JetsonError(f"build precision {self.precision!r}", expected=f"one of {', '.join(PRECISIONS)}")
        if self.workspace_mib < 1:
            raise JetsonError(f"workspace {self.workspace_mib} MiB", expected="a positive size in MiB")
        if self.tactic_dram_mib is not None and self.tactic_dram_mib < self.workspace_mib:
            raise JetsonError(f"tactic memory {self.tactic_dram_mib} MiB below the workspace {self.workspace_mib} MiB",
                              expected="TACTIC_DRAM (all the build's tactic memory) at least the workspace",
                              fix=f"raise tactic_dram_mib or lower workspace_mib (defaults {DEFAULT_TACTIC_DRAM_MIB} "
                                  f"and {DEFAULT_WORKSPACE_MIB} MiB)")
        if not 0 <= self.optimization_level <= 5:
            raise JetsonError(f"optimisation level {self.optimization_level}", expected="0..5 (TensorRT's default 3)")
        if self.plugin_sources and self.plugin_library:
            raise JetsonError(f"a build config with plugin sources {self.plugin_sources} and the prebuilt library "
                              f"{self.plugin_library}", expected="one of them",
                              fix="make the bundle again with either --plugins or --plugin-lib")

    @property
    def needs_edge_plugins(self) -> bool:
        """Whether the graph needs edge's plugin library (built from the sources or shipped prebuilt)."""
        return bool(self.plugin_sources or self.plugin_library)

    def to_json(self) -> dict:
        return {**asdict(self), "plugins": list(self.plugins)}


#: trtexec's defaults (samples/common/sampleOptions.h, TensorRT 10.3: defaultWarmUp 200 ms, defaultDuration
#: 3 s, defaultIterations 10): warm up for 200 ms, then time for at least 3 s and at least 10 calls
TRTEXEC_WARMUP_S, TRTEXEC_DURATION_S, TRTEXEC_ITERATIONS = 0.2, 3.0, 10
#: the timed window when energy is measured: tegrastats gives one sample per 100 ms, and 10 s gives about
#: 100 samples, five times jetson.energy's minimum of 20 (its docstring says why 20)
ENERGY_DURATION_S = 10.0


@dataclass(frozen=True)
class Protocol:
    """The benchmark's defaults, which the runner's command line may override: trtexec's protocol.

    Warm-up runs until both ``warmup`` calls and ``warmup_s`` seconds are done (time, not a count, is what
    lets the GPU clock ramp up and the caches fill whatever one call costs: 200 ms, as trtexec; no
    measurement of an Orin Nano's clock ramp was at hand to justify more: lock the clocks, or pass a
    longer warm-up). The timed window runs until both ``iterations`` calls and ``duration_s`` seconds are
    done, and, when energy is measured, ``energy_duration_s`` seconds (tegrastats samples every
    ``tegrastats_interval_ms``). None turns a time off.
    """

    # ranges as plain metadata (edge.config.bounds reads them; the device side imports no edge)
    warmup: int = field(default=1, metadata={"minimum": 0, "maximum": 10**8})
    iterations: int = field(default=TRTEXEC_ITERATIONS, metadata={"minimum": 1, "maximum": 10**8})
    duration_s: float | None = field(default=TRTEXEC_DURATION_S, metadata={"above": 0, "maximum": 86400})
    cuda_graph: bool = True
    idle_s: float = field(default=2.0, metadata={"minimum": 0, "maximum": 3600})
    tegrastats_interval_ms: int = 100
    warmup_s: float | None = field(default=TRTEXEC_WARMUP_S, metadata={"minimum": 0, "maximum": 3600})
    energy_duration_s: float | None = field(default=ENERGY_DURATION_S, metadata={"above": 0, "maximum": 86400})

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.iterations < 1:
            raise JetsonError(f"warm-up {self.warmup}, iterations {self.iterations}",
                              expected="warm-up 0 or more and 1 iteration or more")
        for name, value in (("duration", self.duration_s), ("energy duration", self.energy_duration_s)):
            if value is not None and value <= 0:
                raise JetsonError(f"{name} {value} s", expected="a positive number of seconds")
        if self.warmup_s is not None and self.warmup_s < 0:
            raise JetsonError(f"warm-up time {self.warmup_s} s", expected="0 s or more")
        if self.idle_s < 0 or self.tegrastats_interval_ms < 1:
            raise JetsonError(f"idle window {self.idle_s} s, tegrastats interval {self.tegrastats_interval_ms} ms",
                              expected="an idle window of 0 s or more and an interval of 1 ms or more")

    def timed_s(self, energy: bool) -> float:
        """The least time the timed window lasts: the duration, and with energy the energy duration."""
        return max(self.duration_s or 0.0, (self.energy_duration_s or 0.0) if energy else 0.0)


@dataclass(frozen=True)
class Variant:
    """One graph to build and benchmark: a model variant at one precision."""

    name: str
    precision: str
    graph: str
    graph_sha256: str
    build: BuildSpec
    inputs: tuple[dict, ...] = ()
    calibration: dict | None = None
    source: str | None = None
    gate: GateSpec | None = None  # the accuracy gate (jetson.accuracy_gate); None: the engine is not checked

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise JetsonError(f"variant name {self.name!r}", expected="letters, digits, _ . - (no leading dot)")

    @property
    def id(self) -> str:
        return f"{self.name}.{self.precision}"

    def to_json(self) -> dict:
        return {"name": self.name, "precision": self.precision, "graph": self.graph,
                "graph_sha256": self.graph_sha256, "inputs": list(self.inputs), "calibration": self.calibration,
                "source": self.source, "build": self.build.to_json(),
                "gate": self.gate.to_json() if self.gate else None}

    @classmethod
    def from_json(cls, data: dict) -> Variant:
        build = dict(data["build"])
        build["plugins"] = tuple(build.get("plugins", ()))
        return cls(name=data["name"], precision=data["precision"], graph=data["graph"],
                   graph_sha256=data["graph_sha256"], build=BuildSpec(**build), inputs=tuple(data.get("inputs", ())),
                   calibration=data.get("calibration"), source=data.get("source"),
                   gate=GateSpec.from_json(data["gate"], f"variant {data['name']}") if data.get("gate") else None)


@dataclass(frozen=True)
class Bundle:
    """A bundle read from its folder (checked against its manifest by :func:`verify_bundle`)."""

    root: Path
    sha256: str
    variants: tuple[Variant, ...]
    protocol: Protocol
    created_by: dict
    source: dict
    files: dict[str, dict] = field(repr=False, default_factory=dict)

    def path(self, relative: str) -> Path:
        return self.root / relative


def _skipped(relative: Path) -> bool:
    """Files Python writes beside the package when it runs it (never part of a bundle)."""
    return "__pycache__" in relative.parts or relative.suffix == ".pyc"


def bundle_files(root: Path) -> dict[str, dict]:
    """sha256 and size of every file in the bundle's own folders (:data:`OWNED`), by relative path."""
    files = {}
    for folder in OWNED:
        base = root / folder
        if not base.is_dir():
            continue
        for dirpath, _, names in os.walk(base):
            for name in names:
                path = Path(dirpath) / name
                relative = path.relative_to(root)
                if not _skipped(relative):
                    files[relative.as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return dict(sorted(files.items()))


def manifest_json(root: Path, variants: list[Variant], protocol: Protocol, created_by: dict, source: dict) -> dict:
    """The manifest of a bundle folder whose files are all in place (called last by the writer)."""
    ids = [v.id for v in variants]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise JetsonError(f"the bundle would hold variant {', '.join(duplicated)} twice",
                          fix="give the graphs distinct variant names")
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created_by": created_by, "source": source,
            "protocol": asdict(protocol), "variants": [v.to_json() for v in variants],
            "files": bundle_files(root)}


def read_bundle(root: str | Path) -> Bundle:
    """The bundle in ``root`` from its manifest (format checked; files not yet: :func:`verify_bundle`)."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise JetsonError(f"{root} is not a bundle: {MANIFEST} is missing",
                          expected="a folder written by `edge bundle`", fix="copy the whole bundle folder again")
    return parse_manifest(path.read_bytes(), root, path)


def parse_manifest(raw: bytes, root: Path, path: str | Path) -> Bundle:
    """The bundle whose ``manifest.json`` holds ``raw`` (read from ``path``, named in errors), rooted at ``root``."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise JetsonError(f"{path} is not valid JSON", found=str(e),
                          fix="the bundle is damaged: copy it again from the host") from e
    if data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        raise JetsonError(f"{path} is not a bundle manifest this runner reads",
                          expected=f"format {FORMAT!r} version {FORMAT_VERSION}",
                          found=f"format {data.get('format')!r} version {data.get('format_version')!r}",
                          fix="make the bundle and run it with the same edge version")
    try:
        variants = tuple(Variant.from_json(v) for v in data["variants"])
        protocol = Protocol(**data["protocol"])
        files = dict(data["files"])
    except (KeyError, TypeError) as e:
        raise JetsonError(f"{path} lacks a field of the bundle format", found=f"{type(e).__name__}: {e}",
                          fix="the bundle is damaged: make it again with `edge bundle`") from e
    return Bundle(root=root, sha256=hashlib.sha256(raw).hexdigest(), variants=variants, protocol=protocol,
                  created_by=dict(data.get("created_by", {})), source=dict(data.get("source", {})), files=files)


def owned(relative: str) -> bool:
    """Whether a path inside a bundle lies in one of its own folders (:data:`OWNED`) and is not Python's cache."""
    path = Path(relative)
    return bool(path.parts) and path.parts[0] in OWNED and not _skipped(path)


def verify_bundle(bundle: Bundle, found: dict[str, dict] | None = None) -> None:
    """Refuse a partial or altered bundle: every listed file present with its size and sha256, no
    unlisted file in the bundle's own folders, every graph the variants name listed. ``found``: the
    files as :func:`bundle_files` gives them (by default read from ``bundle.root``; an archive's
    from jetson.archive)."""
    found = bundle_files(bundle.root) if found is None else {k: v for k, v in found.items() if owned(k)}
    for relative, expected in bundle.files.items():
        path = bundle.root / relative
        if relative not in found:
            raise JetsonError(f"the bundle is incomplete: {relative} is missing", found=f"no file {path}",
                              fix="copy the whole bundle again (an interrupted copy leaves files out)")
        if found[relative]["bytes"] != expected["bytes"]:
            raise JetsonError(f"the bundle is incomplete or altered: {relative} has {found[relative]['bytes']} bytes",
                              expected=f"{expected['bytes']} bytes (manifest.json)",
                              fix="copy the whole bundle again")
        if found[relative]["sha256"] != expected["sha256"]:
            raise JetsonError(f"the bundle was altered: {relative} does not match its sha256 in manifest.json",
                              expected=expected["sha256"], found=found[relative]["sha256"],
                              fix="copy the bundle again, or make it again with `edge bundle`")
    extra = sorted(set(found) - set(bundle.files))
    if extra:
        raise JetsonError(f"the bundle was altered: {extra[0]} is not in manifest.json"
                          + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""),
                          fix="remove the file, or make the bundle again with `edge bundle`")
    for variant in bundle.variants:
        named = [variant.graph, *variant.build.plugins, variant.build.timing_cache, variant.build.calibration_cache,
                 *(variant.gate.files() if variant.gate else ()), *_edge_plugin_files(variant.build, bundle.files)]
        for relative in filter(None, named):
            if relative not in bundle.files:
                raise JetsonError(f"variant {variant.id} names {relative}, which manifest.json does not list",
                                  fix="make the bundle again with `edge bundle`")
        if bundle.files[variant.graph]["sha256"] != variant.graph_sha256:
            raise JetsonError(f"variant {variant.id}: the sha256 of {variant.graph} differs from the one listed",
                              fix="make the bundle again with `edge bundle`")


def _edge_plugin_files(build: BuildSpec, files: dict[str, dict]) -> list[str]:
    """The bundle files a build config's edge plugins need: a prebuilt library and its stamp, or (the sources
    folder) at least one listed file under it."""
    if build.plugin_library:
        return [build.plugin_library, stamp_of(build.plugin_library)]
    if build.plugin_sources:
        prefix = build.plugin_sources.rstrip("/") + "/"
        return [next((name for name in files if name.startswith(prefix)), prefix)]
    return []
