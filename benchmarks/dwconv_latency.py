"""Drop-in depthwise convolution: ONNX Runtime CPU latency, original vs attention replaced, side by side.

    python benchmarks/dwconv_latency.py                       # vit_base_patch16_224, 224 and 336, 6/12 blocks
    python benchmarks/dwconv_latency.py --model vit_tiny_patch16_224 --sizes 224 --warmup 2 --iterations 5 \\
        --out /tmp/dwconv_latency.json                        # a quick look while something else runs

Random weights (nothing is downloaded; latency does not depend on the weights' values). For each
input size: the original model and the model with ``--blocks`` attention blocks replaced
(``dwconv:blocks=...:init=gaussian``; ``prefix=pool`` reads 4 fmnist-mini images) are exported with ``edge export``
(verified against PyTorch) and cleaned with ``edge clean`` (verified against the raw export),
then timed with ``edge profile``'s ONNX Runtime backend at batch 1, the two models alternated
``--rounds`` times so drifting machine load hits both alike.

Reported per size: p50/p90/p99 latency of both, the measured speedup ``t_orig / t_dw`` (p50), the
FLOPs-ideal speedup ``F_orig / F_dw`` (matrix products, convolutions and attention, counted by
``FlopCounterMode`` and checked against the analytic count) and the realisation
``(1 - t_dw / t_orig) / (1 - F_dw / F_orig)``: the share of the FLOP saving that shows up as time
(1.0 = all of it; above 1 when the removed softmax and reshapes, which FLOPs do not count, cost
time too). Do not run it while other heavy work shares the CPU; the JSON records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from edge.compress.cost import analytic_flops, measured_flops
from edge.compress.dwconv_apply import build_dwconv, place_dwconv
from edge.compress.plan import parse_plan
from edge.data import InputSpec, calibration_set
from edge.export import ExportConfig, export, write_atomic
from edge.graph.clean import clean_file
from edge.models import create_model, data_config
from edge.profile import OrtBackend, latency_stats
from edge.progress import log
from edge.runtime import hardware, set_threads

ROOT = Path(__file__).resolve().parents[1]


def build(arch: str, size: int, blocks: tuple[int, ...] | None, variant: str, prefix: str, seed: int = 0):
    torch.manual_seed(seed)
    model = create_model(f"timm:{arch}", img_size=size)
    plan = None
    if blocks:
        plan = f"dwconv:blocks={'+'.join(map(str, blocks))}:init=gaussian:variant={variant}:prefix={prefix}"
        # prefix=pool reads mean attention rows: 4 images are enough for a graph of the right shape
        images = calibration_set("fmnist-mini", 4) if prefix == "pool" else None
        steps, modules, _ = build_dwconv(model, parse_plan(plan).dwconv, images,
                                         InputSpec.from_data_config(data_config(model)))
        place_dwconv(model, modules)
    return model, plan


def export_clean(model, plan: str | None, source: str, folder: Path, name: str) -> Path:
    raw, clean = folder / f"{name}.raw.onnx", folder / f"{name}.onnx"
    export(model, raw, source=source, plan=plan, data_config=data_config(model), config=ExportConfig())
    clean_file(raw, clean)
    raw.unlink()
    return clean


def measure(paths: dict[str, Path], threads: int, warmup: int, iterations: int, rounds: int) -> dict[str, dict]:
    """Warm every model up, then alternate them ``rounds`` times, ``iterations`` timed calls each; pool."""
    backends = {k: OrtBackend(p, batch=1, threads=threads) for k, p in paths.items()}
    for backend in backends.values():
        for _ in range(warmup):
            backend.infer()
    pooled: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for key, backend in backends.items():
            for _ in range(iterations):
                t0 = time.perf_counter()
                backend.infer()
                pooled[key].append((time.perf_counter() - t0) * 1000.0)
    out = {}
    for key, backend in backends.items():
        out[key] = {**backend.describe(), "latency": latency_stats(pooled[key], 1),
                    "clock": "time.perf_counter, synchronous session.run"}
        backend.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 336])
    parser.add_argument("--blocks", default="0+2+4+6+8+10", help="replaced blocks (6 of 12 by default)")
    parser.add_argument("--variant", default="unensembled", choices=("unensembled", "ensembled", "full"))
    parser.add_argument("--prefix", default="pool", choices=("mean", "pool", "attend", "drop"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dwconv_latency.json")
    args = parser.parse_args()
    set_threads(args.threads)
    blocks = tuple(int(b) for b in args.blocks.split("+"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="dwconv-latency.") as tmp:
        for size in args.sizes:
            log(f"{args.model} at {size}: export + clean (original, dwconv:blocks={args.blocks})")
            original, _ = build(args.model, size, None, args.variant, args.prefix)
            replaced, plan = build(args.model, size, blocks, args.variant, args.prefix)
            flops = {"original": measured_flops(original, (3, size, size)),
                     "dwconv": measured_flops(replaced, (3, size, size))}
            assert flops["dwconv"] == analytic_flops(replaced) and flops["original"] == analytic_flops(original)
            paths = {"original": export_clean(original, None, args.model, Path(tmp), f"orig{size}"),
                     "dwconv": export_clean(replaced, plan, args.model, Path(tmp), f"dw{size}")}
            del original, replaced
            log(f"{args.model} at {size}: timing ({args.rounds} rounds x {args.iterations} iterations each)")
            timed = measure(paths, args.threads, args.warmup, args.iterations, args.rounds)
            t_orig, t_dw = timed["original"]["latency"]["median_ms"], timed["dwconv"]["latency"]["median_ms"]
            ideal = flops["original"] / flops["dwconv"]
            row = {"size": size, "plan": plan, "flops": flops, "flops_ideal_speedup": ideal,
                   "measured_speedup_p50": t_orig / t_dw,
                   "realisation": (1 - t_dw / t_orig) / (1 - 1 / ideal),
                   **{k: {"latency": v["latency"], "threads": v["threads"], "onnxruntime": v["onnxruntime"]}
                      for k, v in timed.items()}}
            rows.append(row)
            log(f"  p50 {t_orig:.2f} ms -> {t_dw:.2f} ms: speedup {row['measured_speedup_p50']:.3f} "
                f"(FLOPs-ideal {ideal:.3f}, realisation {row['realisation']:.2f})")
    result = {"benchmark": "dwconv_latency", "model": args.model, "weights": "random (seed 0)",
              "replaced_blocks": list(blocks), "variant": args.variant, "prefix": args.prefix,
              "backend": "onnxruntime CPU, batch 1",
              "graphs": "edge export (opset 17, verified) + edge clean (verified)",
              "warmup": args.warmup, "iterations_per_round": args.iterations, "rounds": args.rounds,
              "threads": args.threads, "load_average": os.getloadavg(), "hardware": hardware(),
              "torch": torch.__version__, "rows": rows}
    write_atomic((json.dumps(result, indent=1) + "\n").encode(), args.out)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
