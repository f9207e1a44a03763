"""``edge profile``: latency percentiles of a model on ONNX Runtime or PyTorch."""

from __future__ import annotations

from edge.cli.common import add_command, add_field, add_model_options, add_number, add_threads_option, emit
from edge.cli.options import Device
from edge.config import MAX_BATCH

EXAMPLES = """  edge profile runs/ref.onnx --threads 2 --json          # ONNX Runtime (the default for .onnx)
  edge profile fmnist-deit-tiny --backend torch --iterations 500
  edge profile runs/ref.onnx --duration 10 --warmup 50"""


def register(subparsers) -> None:
    from edge.profile import ProfileConfig

    parser = add_command(subparsers, "profile", "measure latency: warm-up, iterations, percentiles, memory",
                         "Prints a trtexec-style summary on stderr and the full result (latency min/mean/median/\n"
                         "p90/p95/p99/max, std, coefficient of variation, throughput, weight bytes, peak RSS,\n"
                         "backend, device, precision, batch, threads, hardware) as JSON on stdout with --json.",
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
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys

    from edge.errors import EdgeError
    from edge.profile import OrtBackend, ProfileConfig, TorchBackend, profile, trtexec_summary
    from edge.runtime import resolve_device, set_threads

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
