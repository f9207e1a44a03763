"""``edge build``: a TensorRT engine from an ONNX graph, with its manifest and layer information."""

from __future__ import annotations

from edge.cli.common import add_command, add_data_option, add_field, add_out_file, emit
from edge.cli.options import ExistingFile, OutputFile

EXAMPLES = """  edge build runs/ref.onnx --out runs/ref.engine                          # fp32, strongly typed
  edge build runs/ref.onnx --precision fp16 --out runs/ref.fp16.engine   # fp16 variant made in memory
  edge build runs/ref.int8.onnx --precision int8 --out runs/ref.int8.engine --timing-cache runs/orin.cache
  edge build runs/ref.int8.onnx --precision best --out runs/ref.best.engine   # = int8: INT8 + FP16 elsewhere
  edge build runs/ref.dyn.onnx --min-batch 1 --opt-batch 8 --max-batch 32 --out runs/ref.dyn.engine
  edge build runs/ref.onnx --precision fp16 --weakly-typed --out runs/ref.engine   # TensorRT 10.x only
  edge build runs/ref.onnx --precision fp16 --out runs/ref.engine --trtexec          # the trtexec equivalent"""


def register(subparsers) -> None:
    from edge.trt.builder import PRECISIONS, BuildConfig

    parser = add_command(
        subparsers, "build", "build a TensorRT engine on this device (writes ENGINE, ENGINE.json, ENGINE.layers.json)",
        "Strongly typed by default: the precision comes from the ONNX (edge quantize writes the fp16 and\n"
        "int8 Q/DQ variants, the int8 one float16 where it is not quantized; --precision fp16 converts a\n"
        "float32 graph in memory; best is the int8 Q/DQ graph: INT8+FP16). --weakly-typed uses TensorRT\n"
        "10.x builder flags instead (removed in TensorRT 11). The manifest records the ONNX sha256,\n"
        "TensorRT/CUDA versions, GPU, compute capability, SM count, memory and board, precision, shapes,\n"
        "the knobs honoured and the build time; `edge profile` refuses an engine built for another\n"
        "TensorRT or device. cuda-python and the device are checked before the build starts.\n"
        "Needs TensorRT (JetPack on a Jetson; NVIDIA's packages on x86).", EXAMPLES)
    parser.add_argument("model", type=ExistingFile(),
                        help="an ONNX graph (float32, or the fp16/int8 output of edge quantize)")
    add_out_file(parser, "the engine file", ".engine")
    parser.add_argument("--precision", default=BuildConfig.precision, choices=PRECISIONS,
                        help="strongly typed: which ONNX variant to expect (best = the int8 Q/DQ graph, INT8+FP16); "
                             "weakly typed: the builder flags")
    parser.add_argument("--weakly-typed", dest="strongly_typed", action="store_false",
                        help="TensorRT 10.x builder precision flags instead of a strongly typed network")
    add_field(parser, "--workspace", BuildConfig, "workspace_mib",
              help="workspace memory-pool limit, MiB (2 GiB suits an 8 GB Orin Nano)")
    add_field(parser, "--opt-level", BuildConfig, "optimization_level", help="builder optimisation level")
    add_field(parser, "--tiling-level", BuildConfig, "tiling_optimization_level",
              help="tiling optimisation level (TensorRT 10.8+; default: TensorRT's)")
    parser.add_argument("--timing-cache", type=OutputFile(), metavar="FILE",
                        help="timing cache file: loaded when present, saved after the build")
    parser.add_argument("--plugin", action="append", default=[], type=ExistingFile(), metavar="SO",
                        help="plugin library (.so) to load (repeatable)")
    add_field(parser, "--batch", BuildConfig, help="fixed batch for a dynamic-batch graph (default: the graph's)")
    add_field(parser, "--min-batch", BuildConfig, help="optimisation profile of a dynamic-batch graph: smallest batch")
    add_field(parser, "--opt-batch", BuildConfig, help="optimisation profile: the batch TensorRT tunes for")
    add_field(parser, "--max-batch", BuildConfig, help="optimisation profile: largest batch")
    add_data_option(parser, None, "--weakly-typed int8 only: data for TensorRT's legacy calibrator")
    add_field(parser, "--samples", BuildConfig, "calibration_samples",
              help="--weakly-typed int8 only: calibration samples")
    parser.add_argument("--trtexec", action="store_true",
                        help="print the equivalent trtexec command (run it and parse its results where trtexec "
                             "exists); a graph the builder would convert first (e.g. --precision fp16 of a float32 "
                             "graph) is written beside the engine as OUT.VARIANT.onnx for trtexec to read")
    parser.add_argument("--no-tf32", dest="tf32", action="store_false",
                        help="fp32 matrix products in full fp32, not TF32 (TensorRT's default, about 1e-3 relative "
                             "from ONNX Runtime); recorded in the manifest")
    parser.add_argument("--verbose", action="store_true", help="TensorRT's verbose log")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from edge.trt.builder import BuildConfig, PhaseDisplay, build_engine

    config = BuildConfig(precision=args.precision, strongly_typed=args.strongly_typed, workspace_mib=args.workspace,
                         optimization_level=args.opt_level, tiling_optimization_level=args.tiling_level,
                         timing_cache=args.timing_cache, plugins=tuple(args.plugin), batch=args.batch,
                         min_batch=args.min_batch, opt_batch=args.opt_batch, max_batch=args.max_batch,
                         calibration_data=args.data, calibration_samples=args.samples, verbose=args.verbose,
                         tf32=args.tf32)
    config.check()
    if args.trtexec:
        return _trtexec(args, config)
    manifest = build_engine(args.model, args.out, config, display=PhaseDisplay(sys.stderr),
                            calibration_images=_calibration_images)
    knobs = manifest["knobs"]
    missing = ", ".join(f"{k} ({why})" for k, why in knobs["not_available"].items())
    emit(manifest, args.json, f"wrote {args.out} ({manifest['engine']['bytes'] / 1e6:.1f} MB, {args.precision}, "
                              f"TensorRT {manifest['runtime']['tensorrt']}, {manifest['build_seconds']:.1f} s)\n"
                              f"manifest {args.out}.json, layers {args.out}.layers.json"
                              + (f"\nnot available in this TensorRT: {missing}" if missing else ""))
    return 0


def _calibration_images(model, source: str, data: str, samples: int):
    """--weakly-typed int8: the seeded, class-balanced images `edge quantize` calibrates on (imported when used)."""
    from edge.precision.calibration import calibration_images

    return calibration_images(model, source, data, samples)


def _trtexec(args, config) -> int:
    import subprocess
    import sys
    from pathlib import Path

    from edge.fileio import write_atomic
    from edge.profile.trtexec_output import trtexec_result
    from edge.trt.builder import select_onnx
    from edge.trt.trtexec_command import as_shell, find_trtexec, left_out, shape_arguments, trtexec_command

    binary = find_trtexec()
    version = _trtexec_version(binary)
    # trtexec --stronglyTyped takes the precision from the ONNX: the variant the builder would parse
    # (e.g. the fp16 conversion of a float32 export) is written beside the engine and passed instead.
    graph, variant, conversion = select_onnx(Path(args.model), config, config.strongly_typed)
    onnx_path = args.model
    if conversion.get("conversion"):
        onnx_path = str(Path(args.out).with_suffix(f".{variant}.onnx"))
        write_atomic(graph.SerializeToString(), Path(onnx_path))
        print(f"wrote {onnx_path} ({conversion['conversion']}) for trtexec", file=sys.stderr)
    first = graph.graph.input[0]
    argv = trtexec_command(onnx_path, args.out, config, binary or "trtexec", input_name=first.name, version=version)
    dims = [d.dim_value for d in first.type.tensor_type.shape.dim]
    argv = shape_arguments(argv, dims)
    notes = left_out(config, version)
    shown = ".".join(map(str, version)) if version else "unknown"
    comments = "".join(f"# left out {flag}: {why}\n" for flag, why in notes.items())
    if binary is None:
        emit({"trtexec": None, "trtexec_version": shown, "command": argv, "left_out": notes,
              "onnx_written": onnx_path if onnx_path != args.model else None}, args.json,
             f"# trtexec not found here (on JetPack: {Path('/usr/src/tensorrt/bin/trtexec')}); the equivalent:\n"
             f"{comments}{as_shell(argv)}")
        return 0
    print(f"{comments}running (trtexec {shown}): {as_shell(argv)}", file=sys.stderr)
    # one stream, in order: trtexec writes its [W] lines (the coefficient-of-variance warning) to stderr
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        from edge.errors import EdgeError

        raise EdgeError(f"trtexec failed (exit {done.returncode})", found=done.stdout[-3000:])
    stem = str(Path(args.out).with_suffix(""))
    # trtexec benchmarks at --shapes, or at the opt shape of a profile
    batch = config.batch or config.opt_batch or (dims[0] if dims and dims[0] > 0 else 1)
    result = trtexec_result(done.stdout, f"{stem}.times.json", f"{stem}.profile.json", precision=args.precision,
                            batch=batch)
    result.update({"command": argv, "trtexec_version": shown, "left_out": notes,
                   "onnx_written": onnx_path if onnx_path != args.model else None})
    latency = result["latency"]
    warned = "".join(f"\ntrtexec warned: {w}" for w in result.get("warnings", []))
    emit(result, args.json, f"trtexec: median {latency['median_ms']:.3f} ms, p99 {latency['p99_ms']:.3f} ms, "
                            f"{latency['throughput_images_per_s']:.1f} images/s (batch {batch}){warned}")
    return 0


def _trtexec_version(binary: str | None) -> tuple[int, ...] | None:
    """trtexec's version from its banner; else the TensorRT this Python loads (JetPack ships them together)."""
    from edge.trt.trtexec_command import trtexec_version

    if binary is not None:
        version = trtexec_version(binary)
        if version is not None:
            return version
    try:
        import tensorrt
    except (ImportError, OSError):
        return None
    from edge.trt.features import parse_version

    return parse_version(tensorrt.__version__) if hasattr(tensorrt, "__version__") else None
