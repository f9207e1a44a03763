"""The token-layout depthwise plugin kernel against PyTorch's layout round trip, on a CUDA GPU.

    python benchmarks/token_depthwise.py                      # builds the kernel for this GPU with nvcc
    python benchmarks/token_depthwise.py --library plugins/build/libedge_plugins.so --iterations 50
    python benchmarks/token_depthwise.py --render             # the table again from the results file

What is timed, per case (shape x batch x dtype x prefix mode):

* ``kernel``: ``tokenDepthwiseConvLaunch`` (plugins/tokenDepthwiseConv) on ``[B, P + H*W, C]``;
* ``torch``: ``plugins/tokenDepthwiseConv/torch_mixer.py``: Slice, Reshape + NHWC->NCHW, ``F.conv2d(groups=C)``,
  NCHW->NHWC + Reshape, the prefix outputs (mean or pool), Concat: what the exported graph runs today;
* ``copy``: ``Tensor.copy_`` of the tokens, the floor for any kernel that reads and writes them once.

Two ways: ``graph`` captures ``--calls`` back-to-back calls in one CUDA graph and replays it
``--iterations`` times (GPU time per call, without Python or launch overhead); ``eager`` records CUDA events
around each single call (what a Python caller sees: launch overhead included). Both after ``--warmup`` calls,
in ``--rounds`` rounds alternating kernel and torch. Reported: median and p90 in microseconds, the kernel's
effective bandwidth (tokens read once + written once, pool weights read once), the speedup of the medians and
the kernel's largest error relative to the largest output (torch in float64 as truth). Timings are never test
assertions. Shapes: the reference model (embed 192, grid 7x7, P = 1) and ViT-B/16 at 224 (768, 14x14, P = 1).

Writes benchmarks/results/token_depthwise.json and docs/results/token-depthwise.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _results import provenance, read_results, write_results  # noqa: E402

from plugins import loader  # noqa: E402
from plugins.tokenDepthwiseConv.torch_mixer import token_depthwise_conv_torch  # noqa: E402

SHAPES = {"reference": (192, (7, 7), 1), "vit_b16": (768, (14, 14), 1)}   # channels, grid, prefix tokens
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def gpu_record() -> dict:
    """GPU name, capability, NVIDIA driver (nvidia-smi), CUDA of torch, nvcc's release and torch's version."""
    record = {"gpu": torch.cuda.get_device_name(), "capability": "%d.%d" % torch.cuda.get_device_capability(),
              "cuda_torch": torch.version.cuda, "torch": torch.__version__, "driver": None, "nvcc": None}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        record["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    nvcc = loader.find_nvcc()
    if nvcc:
        lines = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        record["nvcc"] = lines[-1] if lines else None
    return record


def make_case(channels: int, grid: tuple[int, int], prefix_tokens: int, batch: int, dtype: torch.dtype, mode: str,
              k: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(batch, prefix_tokens + grid[0] * grid[1], channels, generator=g).to("cuda", dtype)
    pool = torch.rand(prefix_tokens, tokens.shape[1], channels, generator=g) / tokens.shape[1]
    return {"tokens": tokens, "weight": torch.randn(channels, 1, k, k, generator=g).cuda(),
            "bias": torch.randn(channels, generator=g).cuda(), "grid": grid, "prefix_tokens": prefix_tokens,
            "prefix_mode": mode, "prefix_weights": pool.cuda() if mode == "pool" else None}


def torch_call(case: dict):
    """The PyTorch round trip with weights already in the tokens' dtype (as an fp16 graph holds them)."""
    dtype = case["tokens"].dtype
    weight, bias = case["weight"].to(dtype), case["bias"].to(dtype)
    pool = None if case["prefix_weights"] is None else case["prefix_weights"].to(dtype)

    def call():
        return token_depthwise_conv_torch(case["tokens"], weight, bias, grid=case["grid"],
                                          prefix_tokens=case["prefix_tokens"], prefix_mode=case["prefix_mode"],
                                          prefix_weights=pool)
    return call


def kernel_call(library, case: dict):
    """Bound on the current stream (re-bound inside a graph capture, whose stream differs)."""
    out = torch.empty_like(case["tokens"])
    return loader.bind_token_depthwise_conv(library, case["tokens"], out, case["weight"], case["bias"],
                                            grid=case["grid"], prefix_tokens=case["prefix_tokens"],
                                            prefix_mode=case["prefix_mode"], prefix_weights=case["prefix_weights"])


def copy_call(case: dict):
    """The bandwidth floor: one device copy of the tokens (read once, written once)."""
    out = torch.empty_like(case["tokens"])
    return lambda: out.copy_(case["tokens"])


def time_eager(make_call, iterations: int) -> list[float]:
    """Microseconds of each single call between two CUDA events."""
    call = make_call()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def time_graph(make_call, calls: int, iterations: int) -> list[float]:
    """Microseconds per call: a CUDA graph of ``calls`` back-to-back calls, each replay timed by CUDA events."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):    # bind (and warm) on the stream the capture will use
        call = make_call()
        call()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph, stream=side):
        for _ in range(calls):
            call()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return times


def summary(times: list[float]) -> dict:
    return {"median_us": float(np.median(times)), "p90_us": float(np.percentile(times, 90)), "samples": len(times)}


def measure(makers: dict, args) -> dict:
    """Timings of every maker, ``--rounds`` alternating rounds each way; a failed capture is recorded, not raised."""
    eager = {name: [] for name in makers}
    graph = {name: [] for name in makers}
    errors = {}
    for make in makers.values():
        call = make()
        for _ in range(args.warmup):
            call()
    torch.cuda.synchronize()
    per_round = max(1, args.iterations // args.rounds)
    for _ in range(args.rounds):
        for name, make in makers.items():
            eager[name] += time_eager(make, per_round)
            if name in errors:
                continue
            try:
                graph[name] += time_graph(make, args.calls, per_round)
            except RuntimeError as e:     # a capture the runtime refuses: keep the eager numbers, say why
                errors[name] = f"{type(e).__name__}: {e}"
                torch.cuda.synchronize()
    return {name: {"eager": summary(eager[name]), "graph": summary(graph[name]) if graph[name] else None,
                   "graph_error": errors.get(name)} for name in makers}


def minimal_bytes(case: dict) -> int:
    tokens = case["tokens"]
    pool = case["prefix_weights"]
    return 2 * tokens.numel() * tokens.element_size() + (0 if pool is None else pool.numel() * 4)


def max_relative_error(library, case: dict) -> float:
    out = loader.token_depthwise_conv(library, case["tokens"], case["weight"], case["bias"], grid=case["grid"],
                                      prefix_tokens=case["prefix_tokens"], prefix_mode=case["prefix_mode"],
                                      prefix_weights=case["prefix_weights"])
    pool = case["prefix_weights"]
    truth = token_depthwise_conv_torch(case["tokens"].double(), case["weight"].double(), case["bias"].double(),
                                       grid=case["grid"], prefix_tokens=case["prefix_tokens"],
                                       prefix_mode=case["prefix_mode"],
                                       prefix_weights=None if pool is None else pool.double())
    return ((out.double() - truth).abs().max() / truth.abs().max()).item()


def run_case(library, shape: str, batch: int, dtype: str, mode: str, args) -> dict:
    channels, grid, prefix_tokens = SHAPES[shape]
    case = make_case(channels, grid, prefix_tokens, batch, DTYPES[dtype], mode, args.k)
    timings = measure({"kernel": lambda: kernel_call(library, case), "torch": lambda: torch_call(case),
                       "copy": lambda: copy_call(case)}, args)
    row = {"shape": shape, "channels": channels, "grid": list(grid), "prefix_tokens": prefix_tokens, "batch": batch,
           "dtype": dtype, "prefix_mode": mode, "k": args.k, "bytes": minimal_bytes(case),
           "max_relative_error": max_relative_error(library, case), **timings}
    for way in ("graph", "eager"):
        if row["kernel"][way] and row["torch"][way]:
            row[f"speedup_{way}"] = row["torch"][way]["median_us"] / row["kernel"][way]["median_us"]
            row[f"kernel_gbps_{way}"] = row["bytes"] / row["kernel"][way]["median_us"] / 1e3
        if row["kernel"][way] and row["copy"][way]:
            row[f"copy_ratio_{way}"] = row["kernel"][way]["median_us"] / row["copy"][way]["median_us"]
    print(f"{shape} b{batch} {dtype} {mode}: kernel {fmt(row['kernel'])}  torch {fmt(row['torch'])}  "
          f"copy {fmt(row['copy'])}  "
          f"err {row['max_relative_error']:.2e}", file=sys.stderr, flush=True)
    return row


def fmt(timing: dict) -> str:
    graph = timing["graph"]
    where = f"graph {graph['median_us']:.2f} us" if graph else "graph -"
    return f"{where}, eager {timing['eager']['median_us']:.2f} us"


def library_for(args, folder: Path):
    if args.library:
        return loader.load_library(args.library)
    major, minor = torch.cuda.get_device_capability()
    return loader.load_library(loader.build_library(folder / loader.LIBRARY_NAME, (f"{major}{minor}",)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--prefix-modes", nargs="+", default=["pool", "mean"], choices=list(loader.PREFIX_MODES))
    parser.add_argument("--k", type=int, default=3, help="kernel size (odd)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls of each before timing")
    parser.add_argument("--iterations", type=int, default=200, help="timed samples of each way, all rounds together")
    parser.add_argument("--rounds", type=int, default=4, help="rounds alternating kernel and torch")
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph replay")
    parser.add_argument("--library", type=Path, help="a built libedge_plugins.so (default: build one with nvcc)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "token_depthwise.json")
    parser.add_argument("--md-out", type=Path, default=ROOT / "docs" / "results" / "token-depthwise.md")
    parser.add_argument("--render", action="store_true", help="write the table again from --out, timing nothing")
    args = parser.parse_args()
    if args.render:
        record = read_results(parser, args.out)
        write_results(record, args.out, args.md_out, markdown)
        return
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU (torch.cuda.is_available() is False): this benchmark times a CUDA kernel")
    started, load_before = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="token-depthwise.") as tmp:
        library = library_for(args, Path(tmp))
        rows = [run_case(library, shape, batch, dtype, mode, args) for shape in args.shapes
                for batch in args.batches for dtype in args.dtypes for mode in args.prefix_modes]
    record = {
        "benchmark": "token_depthwise", "device": gpu_record(),
        "settings": {"warmup": args.warmup, "iterations": args.iterations, "rounds": args.rounds,
                     "calls_per_graph": args.calls, "k": args.k, "weights": "random (torch seed 0)",
                     "bytes": "tokens read once + written once, pool weights (fp32) read once"},
        "rows": rows,
        **provenance("token_depthwise.py", args, parser, started=started, load_before=load_before,
                     skip=("out", "md_out", "library")),
    }
    write_results(record, args.out, args.md_out, markdown)


def _us(timing: dict | None, key: str = "median_us") -> str:
    return "-" if not timing else f"{timing[key]:.2f}"


def markdown(r: dict) -> str:
    d, s = r["device"], r["settings"]
    lines = [
        "# Token-layout depthwise plugin kernel vs PyTorch's layout round trip",
        "",
        f"Generated by `{r['command']}` ({r['seconds']:.0f} s). GPU: {d['gpu']} (sm {d['capability']}), driver "
        f"{d['driver']}, CUDA {d['cuda_torch']} (torch), nvcc {d['nvcc']}, torch {d['torch']}.",
        "",
        f"`kernel`: `tokenDepthwiseConvLaunch` on `[B, P + H*W, C]`; `torch`: Slice, NHWC->NCHW, "
        f"`F.conv2d(groups=C)`, NCHW->NHWC, prefix outputs, Concat (plugins/tokenDepthwiseConv/torch_mixer.py). "
        f"k = {s['k']}, {s['weights']} weights. {s['warmup']} warm-up calls, then {s['iterations']} samples per way "
        f"in {s['rounds']} alternating rounds. `graph`: microseconds per call from CUDA graphs of "
        f"{s['calls_per_graph']} back-to-back calls (GPU time); `eager`: CUDA events around one call from Python "
        f"(launch overhead included). Median (p90). GB/s: {s['bytes']}, over the kernel's graph median. "
        "`copy`: one device copy of the tokens (`Tensor.copy_`, the bandwidth floor of a kernel that reads and "
        "writes them once); `/copy`: kernel over copy, graph medians. "
        "Error: largest |kernel - float64 truth| over the largest |truth|.",
        "",
        "| shape | B | dtype | prefix | kernel graph us | torch graph us | speedup | kernel GB/s | copy graph us "
        "| /copy | kernel eager us | torch eager us | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        shape = f"{row['channels']} ch, {row['grid'][0]}x{row['grid'][1]}, P={row['prefix_tokens']}"
        k, t, c = row["kernel"], row["torch"], row["copy"]
        speedup = f"{row['speedup_graph']:.2f}x" if "speedup_graph" in row else "-"
        gbps = f"{row['kernel_gbps_graph']:.0f}" if "kernel_gbps_graph" in row else "-"
        ratio = f"{row['copy_ratio_graph']:.2f}" if "copy_ratio_graph" in row else "-"
        lines.append(
            f"| {shape} | {row['batch']} | {row['dtype']} | {row['prefix_mode']} "
            f"| {_us(k['graph'])} ({_us(k['graph'], 'p90_us')}) | {_us(t['graph'])} ({_us(t['graph'], 'p90_us')}) "
            f"| {speedup} | {gbps} | {_us(c['graph'])} | {ratio} | {_us(k['eager'])} ({_us(k['eager'], 'p90_us')}) "
            f"| {_us(t['eager'])} ({_us(t['eager'], 'p90_us')}) | {row['max_relative_error']:.1e} |")
    failed = [f"{row['shape']} b{row['batch']} {row['dtype']} {row['prefix_mode']} {name}: {row[name]['graph_error']}"
              for row in r["rows"] for name in ("kernel", "torch", "copy") if row[name]["graph_error"]]
    if failed:
        lines += ["", "CUDA graph capture failed (eager numbers only):", "", *[f"- {f}" for f in failed]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
