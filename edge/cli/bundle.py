"""``edge bundle``: the graphs, build configs and device runner a Jetson needs, in one checked folder."""

from __future__ import annotations

from edge.cli.common import add_command, emit
from edge.cli.options import ChoiceList, Data, ExistingFile, ExistingPath, OutputFolder, Text, config_type
from edge.errors import plural

EXAMPLES = """  edge bundle runs/demo --out bundles/demo        # every variant of a pipeline run, fp32 + fp16
  edge bundle runs/demo --out bundles/demo-int8 --precision fp16,int8 --data fmnist --samples 500 --tar
  edge bundle runs/ref.onnx runs/small.onnx --out bundles/two --precision fp16 --iterations 500
  edge bundle their.onnx --out bundles/their --precision fp32,fp16,int8 --input-size 1x28x28 --mean 0.286 --std 0.353
  # ship graphs edge quantize already made (and gated) instead of making them again
  edge bundle runs/m.onnx --graph int8=runs/m.int8.onnx --out bundles/m --precision fp32,int8
  # on the device: cd demo && python3 -m jetson run   (or: edge deploy bundles/demo --host user@jetson)"""


def register(subparsers) -> None:
    from edge.bundle import BundleConfig
    from edge.check.tensorrt_support import PARSERS
    from edge.cli.quantize import add_input_options
    from jetson.bundle import PRECISIONS, Protocol

    parser = add_command(
        subparsers, "bundle", "pack model variants for a Jetson: graphs per precision, build configs, the runner",
        "Takes pipeline run folders (each variant's cleaned graph) and ONNX files. Writes, per variant and\n"
        "precision, the graph (fp16 and int8 Q/DQ made with `edge quantize`'s conversion; int8 calibrates on\n"
        "--data), its TensorRT build config, the benchmark protocol defaults, a manifest with the sha256 of every\n"
        "file, and the device-side runner (python3 -m jetson run: Python 3.10 + numpy + JetPack's TensorRT).\n"
        "A graph from another exporter records no preprocessing: int8 needs --mean and --std (and --input-size\n"
        "where its input shape is not static); fp16 is then checked on seeded random inputs.\n"
        "Written to a temporary folder and renamed at the end: an error leaves no partial bundle.", EXAMPLES)
    parser.add_argument("inputs", nargs="+", metavar="RUN_DIR_OR_ONNX", type=ExistingPath(),
                        help="pipeline run folders or .onnx files")
    parser.add_argument("--out", required=True, type=OutputFolder(), help="the bundle folder to write")
    parser.add_argument("--precision", type=ChoiceList(PRECISIONS), default=",".join(BundleConfig.precisions),
                        help=f"comma-separated, of {', '.join(PRECISIONS)}")
    parser.add_argument("--data", type=Data(), default=BundleConfig.data,
                        help="int8 calibration and the fp16 range check: your images (a folder with train/ and "
                             "val/), fmnist or fmnist-mini; default: a bundled model's data set, any other graph "
                             "needs it")
    parser.add_argument("--gate-data", type=Data(), default=BundleConfig.check_data,
                        help="accuracy gates (host and device): the data set whose test split the graphs are "
                             "compared on; default: --data, else a bundled model's check set (fmnist-mini)")
    parser.add_argument("--samples", type=config_type(BundleConfig, "--samples"), default=BundleConfig.samples,
                        help="int8: calibration samples")
    parser.add_argument("--graph", action="append", default=[], metavar="[NAME.]PRECISION=FILE",
                        type=Text(_graph_item, keep_text=True),
                        help="a graph `edge quantize` already made (and gated) at PRECISION (fp16, int8) from the "
                             "input graph NAME (the file's stem; needed only with several inputs): shipped as it "
                             "is instead of made again; again for each")
    add_input_options(parser)
    parser.add_argument("--workspace", type=config_type(BundleConfig, "--workspace", "workspace_mib"),
                        default=BundleConfig.workspace_mib, help="TensorRT workspace, MiB")
    parser.add_argument("--tactic-dram", type=config_type(BundleConfig, "--tactic-dram", "tactic_dram_mib"),
                        default=BundleConfig.tactic_dram_mib,
                        help="TensorRT tactic memory (TACTIC_DRAM, all the optimiser holds, workspace included), MiB")
    parser.add_argument("--opt-level", type=config_type(BundleConfig, "--opt-level", "optimization_level"),
                        default=BundleConfig.optimization_level, help="TensorRT builder optimisation level")
    parser.add_argument("--tiling-level", type=config_type(BundleConfig, "--tiling-level", "tiling_optimization_level"),
                        help="TensorRT 10.8+: tiling optimisation level (default: TensorRT's)")
    parser.add_argument("--timing-cache", type=ExistingFile(),
                        help="a TensorRT timing cache to ship (seeds the device's own)")
    parser.add_argument("--plugin", action="append", default=[], type=ExistingFile(),
                        help="a TensorRT plugin library to ship (repeatable)")
    parser.add_argument("--plugins", dest="edge_plugins", action="store_true",
                        help="ship edge's plugin sources (plugins/), compiled on the device by the runner with "
                             "JetPack's nvcc and TensorRT headers, for the graphs holding a TokenDepthwiseConv node "
                             "(done without asking when a graph holds one)")
    parser.add_argument("--plugin-lib", type=ExistingFile(), metavar="PATH",
                        help="ship edge's plugin library cross-built on the host (`make -C docker plugins`) with "
                             "the stamp beside it, instead of the sources; the device refuses it if its "
                             "TensorRT, CUDA or JetPack differ")
    parser.add_argument("--warmup", type=config_type(Protocol, "--warmup"), default=Protocol.warmup,
                        help="device default: warm-up calls, at least")
    parser.add_argument("--warmup-time", type=config_type(Protocol, "--warmup-time", "warmup_s"),
                        default=Protocol.warmup_s, help="device default: warm-up seconds, at least (trtexec's 0.2)")
    parser.add_argument("--iterations", type=config_type(Protocol, "--iterations"), default=Protocol.iterations,
                        help="device default: timed calls, at least (trtexec's 10)")
    parser.add_argument("--duration", type=config_type(Protocol, "--duration", "duration_s"),
                        default=Protocol.duration_s, help="device default: time for at least this many seconds "
                                                          "(trtexec's 3)")
    parser.add_argument("--energy-duration", type=config_type(Protocol, "--energy-duration", "energy_duration_s"),
                        default=Protocol.energy_duration_s,
                        help="device default: time for at least this many seconds when energy is measured (10: "
                             "about 100 tegrastats samples; under 20 samples the energy is marked unreliable)")
    parser.add_argument("--idle", type=config_type(Protocol, "--idle", "idle_s"), default=Protocol.idle_s,
                        help="device default: idle power window, s")
    parser.add_argument("--no-tf32", dest="tf32", action="store_false",
                        help="build configs with TF32 off: fp32 matrix products in full fp32 (TensorRT's default "
                             "TF32 is about 1e-3 relative from ONNX Runtime)")
    parser.add_argument("--trt", choices=sorted(PARSERS), default=BundleConfig.tensorrt,
                        help="the TensorRT whose ONNX parser rules every packed graph must pass (edge check)")
    parser.add_argument("--no-trt-check", dest="check_tensorrt", action="store_false",
                        help="pack graphs that break those rules (the findings are still counted in the manifest)")
    parser.add_argument("--gate-images", type=config_type(BundleConfig, "--gate-images", "gate_images"),
                        default=BundleConfig.gate_images,
                        help="accuracy gate: held-out images the device runs each engine on, compared with the "
                             "source graph's float32 ONNX Runtime outputs; a variant outside its precision's "
                             "thresholds is marked wrong (0: no gate)")
    parser.add_argument("--tar", action="store_true", help="also write OUT.tar.gz")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from edge.bundle import BundleConfig, make_bundle
    from edge.cli.quantize import input_options
    from edge.errors import EdgeError
    from jetson.bundle import Protocol
    from jetson.errors import JetsonError

    try:
        protocol = Protocol(warmup=args.warmup, warmup_s=args.warmup_time, iterations=args.iterations,
                            duration_s=args.duration, energy_duration_s=args.energy_duration, idle_s=args.idle)
    except JetsonError as e:
        raise EdgeError(e.what, expected=e.expected) from e
    config = BundleConfig(precisions=args.precision, data=args.data, check_data=args.gate_data, samples=args.samples,
                          workspace_mib=args.workspace, tactic_dram_mib=args.tactic_dram,
                          optimization_level=args.opt_level,
                          tiling_optimization_level=args.tiling_level, timing_cache=args.timing_cache,
                          plugins=tuple(args.plugin), edge_plugins=args.edge_plugins,
                          plugin_library=args.plugin_lib, protocol=protocol, tf32=args.tf32, tensorrt=args.trt,
                          check_tensorrt=args.check_tensorrt, gate_images=args.gate_images,
                          input_options=input_options(args))
    graphs, source = bundle_inputs(args.inputs, args.graph)
    manifest = make_bundle(graphs, args.out, config, source=source, tar=args.tar, force=args.force,
                           progress=lambda message: print(message, file=sys.stderr))
    ids = ", ".join(f"{v['name']}.{v['precision']}" for v in manifest["variants"])
    emit(manifest, args.json, f"wrote {args.out} ({plural(len(manifest['variants']), 'variant')}: {ids}; "
                              f"{plural(len(manifest['files']), 'file')})"
                              + (f" and {manifest['tar']}" if args.tar else ""))
    return 0


def bundle_inputs(inputs: list[str], made: list[str] = ()) -> tuple[list, dict]:
    """The graphs the inputs name, in order (a pipeline run folder: each variant's cleaned graph, as
    edge.pipeline lists them; an .onnx file: itself), each with the graphs ``made`` (``--graph``) gives it,
    and the manifest's source (its kind, the inputs)."""
    import dataclasses
    from pathlib import Path

    from edge.bundle import SourceGraph, onnx_graph
    from edge.errors import EdgeError
    from edge.pipeline import deployed_graphs

    graphs = []
    for item in map(Path, inputs):
        if item.is_dir():
            graphs += [SourceGraph(name, path) for name, path in deployed_graphs(item)]
        elif item.suffix == ".onnx" and item.is_file():
            graphs.append(onnx_graph(item))
        else:
            raise EdgeError(f"{item} is neither a pipeline run folder nor an ONNX file",
                            fix="pass the --out folder of `edge pipeline`, or .onnx files")
    kind = "pipeline" if any(Path(i).is_dir() for i in inputs) else "onnx"
    given = _made_graphs(made, [g.name for g in graphs])
    graphs = [dataclasses.replace(g, made={**g.made, **given.get(g.name, {})}) for g in graphs]
    return graphs, {"kind": kind, "paths": [str(i) for i in inputs]}


def _graph_item(item: str) -> tuple[str, str, str]:
    """One ``--graph [NAME.]PRECISION=FILE`` value: (name or '', precision, path); refused when malformed."""
    from edge.errors import EdgeError

    key, sep, path = item.partition("=")
    name, _, precision = key.rpartition(".")
    if not sep or precision not in ("fp16", "int8") or not path:
        raise EdgeError(f"--graph {item}", expected="[NAME.]PRECISION=FILE with PRECISION fp16 or int8, e.g. "
                        "--graph int8=runs/m.int8.onnx")
    return name, precision, path


def _made_graphs(items: list[str], names: list[str]) -> dict[str, dict]:
    """``--graph [NAME.]PRECISION=FILE`` values: input name -> {precision: path}."""
    from pathlib import Path

    from edge.errors import EdgeError

    out: dict[str, dict] = {}
    for item in items:
        name, precision, path = _graph_item(item)
        if not name and len(names) != 1:
            raise EdgeError(f"--graph {item} names no input graph, and there are {len(names)}",
                            expected=f"NAME.{precision}=FILE with NAME one of {', '.join(names)}")
        name = name or names[0]
        if name not in names:
            raise EdgeError(f"--graph {item}: no input graph is called {name}", expected=f"one of {', '.join(names)}")
        if not Path(path).is_file():
            raise EdgeError(f"--graph {item}: {path} does not exist", expected="an ONNX file made by edge quantize")
        out.setdefault(name, {})[precision] = Path(path)
    return out
