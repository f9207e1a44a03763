"""``edge profile``: latency percentiles of a model on ONNX Runtime or PyTorch, or (``--latency-table``) the
latency table of its parts (edge.latency)."""

from __future__ import annotations

from edge.cli.common import add_command, add_field, add_model_options, add_number, add_threads_option, emit
from edge.cli.options import Device, OutputFile
from edge.config import MAX_BATCH

EXAMPLES = """  edge profile runs/ref.onnx --threads 2 --json          # ONNX Runtime (the default for .onnx)
  edge profile fmnist-deit-tiny --backend torch --iterations 500
  edge profile runs/ref.onnx --duration 10 --warmup 50
  edge profile fmnist-deit-tiny --latency-table tables/cpu-b1.json --threads 2 --iterations 100  # full grid
  edge profile runs/linear-9-10 --latency-table tables/own-b32.json --grid model --batch 32  # its own parts"""


def register(subparsers) -> None:
    from edge.latency.grid import GRIDS, GridConfig
    from edge.profile import ProfileConfig
    from edge.profile.graphs import TimingConfig

    parser = add_command(subparsers, "profile", "measure latency: warm-up, iterations, percentiles, memory",
                         "Prints a trtexec-style summary on stderr and the full result (latency min/mean/median/\n"
                         "p90/p95/p99/max, std, coefficient of variation, throughput, weight bytes, peak RSS,\n"
                         "backend, device, precision, batch, threads, hardware) as JSON on stdout with --json.\n"
                         "--latency-table: instead, export each part of the model's grid (patch embedding,\n"
                         "attention and MLP sub-layers of every width a plan can make, depthwise mixers, span maps,\n"
                         "head, the empty call) as its own graph and time them all side by side on ONNX Runtime;\n"
                         "the table (edge.latency) predicts a model's latency as the sum of its parts.",
                         EXAMPLES)
    add_model_options(parser)
    parser.add_argument("--backend", choices=["ort", "torch", "trt"],
                        help="default: ort for .onnx files, trt for .engine files, else torch")
    parser.add_argument("--cuda-graph", action="store_true", help="trt: replay the inference as a CUDA graph")
    add_number(parser, "--layer-runs", int, default=20, help="trt: runs with per-layer profiling (0: none)",
               minimum=0, maximum=10**6)
    add_number(parser, "--batch", int, help="batch (torch; ONNX files keep their exported batch; default: 1)",
               minimum=1, maximum=MAX_BATCH)
    add_field(parser, "--warmup", ProfileConfig, help="untimed iterations first")
    add_field(parser, "--iterations", ProfileConfig, help="timed iterations (at least)")
    add_field(parser, "--duration", ProfileConfig, help="time for at least this many seconds")
    add_threads_option(parser, "CPU threads, intra-op (default: torch's)")
    parser.add_argument("--device", type=Device(("cpu", "cuda")), default="cpu", help="torch backend: cpu or cuda")
    parser.add_argument("--latency-table", type=OutputFile(".json"), metavar="OUT.json",
                        help="write the latency table of the model's parts (ONNX Runtime, this CPU) instead")
    parser.add_argument("--grid", choices=GRIDS, default=GridConfig.grid,
                        help="--latency-table: the model's own parts, or every part a plan on it can make")
    add_field(parser, "--repeat", GridConfig, help="--latency-table: copies of a sub-layer chained in its graph "
                                                   "(default: as many as the model has blocks)")
    add_field(parser, "--rounds", TimingConfig, help="--latency-table: interleaved rounds (the iterations are split "
                                                     "between them)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from edge.errors import EdgeError
    from edge.profile import OrtBackend, ProfileConfig, TorchBackend, profile, trtexec_summary
    from edge.runtime import resolve_device, set_threads

    if args.latency_table:
        return latency_table(args)
    is_onnx = args.model.endswith(".onnx")
    backend_name = args.backend or ("ort" if is_onnx else "trt" if args.model.endswith(".engine") else "torch")
    threads = set_threads(args.threads)  # the count torch uses; ONNX Runtime is given the same
    if backend_name == "trt":
        from edge.profile.tensorrt import TensorRTBackend

        backend = TensorRTBackend(args.model, batch=args.batch, cuda_graph=args.cuda_graph, layer_runs=args.layer_runs)
    elif backend_name == "ort":
        if not is_onnx:
            raise EdgeError(f"--backend ort needs an ONNX file, got {args.model!r}",
                            fix=f"export it first: edge export {args.model} --out model.onnx")
        backend = OrtBackend(args.model, batch=args.batch, threads=threads)
    else:
        if is_onnx:
            raise EdgeError(f"--backend torch needs a model name or artifact, got the ONNX file {args.model}",
                            fix="use --backend ort for ONNX files")
        from edge.compress.load import load_model
        from edge.models import data_config

        model = load_model(args.model, weights=args.weights, img_size=args.img_size)
        backend = TorchBackend(model, tuple(data_config(model)["input_size"]), batch=args.batch or 1,
                               device=resolve_device(args.device), threads=threads)
    result = profile(backend, ProfileConfig(args.warmup, args.iterations, args.duration))
    result["model"] = args.model
    if hasattr(backend, "report"):  # TensorRT: GPU-event percentiles, device memory, per-layer times
        result.update(backend.report(args.warmup))
    print(trtexec_summary(result), file=sys.stderr)
    if args.json:
        emit(result, True, "")
    return 0


def latency_table(args) -> int:
    import sys

    from edge.compress.load import load_model
    from edge.errors import EdgeError
    from edge.latency.grid import GridConfig
    from edge.latency.measure import measure_table
    from edge.profile.graphs import TimingConfig

    if args.model.endswith((".onnx", ".engine")) or args.backend not in (None, "ort"):
        raise EdgeError(f"--latency-table needs a model or compressed artifact on ONNX Runtime, got {args.model!r}"
                        + (f" with --backend {args.backend}" if args.backend else ""),
                        fix="pass the model name or the artifact folder the graph was exported from")
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    timing = TimingConfig(threads=args.threads or TimingConfig.threads, warmup=args.warmup,
                          iterations=args.iterations, rounds=args.rounds)
    grid = GridConfig(grid=args.grid, batch=args.batch or 1, repeat=args.repeat)
    table = measure_table(model, grid, timing, source=args.model,
                          progress=lambda message: print(message, file=sys.stderr, flush=True))
    table.save(args.latency_table)
    emit(table.to_json(), args.json, f"wrote {args.latency_table} ({table.describe()}; one call's overhead "
                                     f"{table.overhead_ms:.4f} ms)")
    return 0
