"""Exporting and timing for plan_peers: ``edge export`` graphs at each batch, timed side by side on ONNX Runtime."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from _peers_names import slug
from torch import nn

from edge.errors import EdgeError
from edge.models import data_config

ORIGINAL = "original"


@dataclass(frozen=True)
class Timing:
    threads: int = 2
    batches: tuple[int, ...] = (1, 32)
    warmup: int = 10
    rounds: int = 20
    sessions: int = 4
    iterations: int = 20
    seed: int = 0


def export_graphs(model: nn.Module, name: str, folder: Path, batches: tuple[int, ...], source: str,
                  plan: str | None, *, ranks_tokens: bool = False,
                  data: str = "fmnist") -> tuple[dict[int, Path], dict]:
    """``model`` exported by ``edge export`` at every batch (verified against PyTorch); paths and the check.

    ``ranks_tokens`` (ToMe): the merge ranks token similarities, so where two of them are equal to
    float rounding PyTorch and ONNX Runtime may merge different tokens. Random-noise images are full
    of such near-ties (at r = 2, 2 of 32 images differed by 0.19); real ones are not. Such a graph is
    verified on real test images of ``data`` with edge's tolerance, and the share of random images
    whose outputs differ is recorded, not refused.
    """
    from edge.export import ExportConfig, export

    paths, checks = {}, {}
    for batch in batches:
        paths[batch] = folder / f"{slug(name)}-b{batch}.onnx"
        report = export(model.eval(), paths[batch], source=source, plan=plan, data_config=data_config(model),
                        config=ExportConfig(batch=batch, verify=not ranks_tokens))
        if ranks_tokens:
            report["verification"] = verify_ranking_graph(model, paths[batch], batch, data)
        checks[batch] = {"nodes": report["nodes"], "verification": report["verification"]}
    return paths, checks


@torch.no_grad()
def verify_ranking_graph(model: nn.Module, path: Path, batch: int, data: str) -> list[dict]:
    """Real test images must agree within edge's tolerance (else EdgeError); random ones are only counted."""
    from edge.check.compare import Tolerance, compare_arrays, ort_session, run_ort
    from edge.data import load_dataset
    from edge.data.preprocess import InputSpec

    session = ort_session(str(path))
    images = load_dataset(data, "test").inputs(InputSpec.from_data_config(data_config(model)), max(batch, 32))
    real = [images[i:i + batch] for i in range(0, len(images) - batch + 1, batch)]
    results = [compare_arrays(model(x).float().numpy(), run_ort(session, x.numpy()), Tolerance(), "real")
               for x in real]
    worst = max(results, key=lambda c: c.max_abs)
    if not all(c.passed for c in results):
        raise EdgeError(f"ONNX Runtime disagrees with PyTorch on real images through {path.name}",
                        expected=f"max abs error <= {Tolerance().max_abs}", found=f"max abs {worst.max_abs:.3e}",
                        fix="report this model as a bug")
    noise = torch.randn(batch, *data_config(model)["input_size"], generator=torch.Generator().manual_seed(0))
    differ = np.abs(model(noise).numpy() - run_ort(session, noise.numpy())).max(axis=-1) > Tolerance().max_abs
    return [{**worst.as_dict(), "inputs": "real", "images": len(real) * batch},
            {"inputs": "random (near-ties in the merge ranking)", "images": batch,
             "images_differing": int(differ.sum())}]


def time_models(graphs: dict[str, dict[int, Path]], timing: Timing) -> dict[int, dict]:
    """All graphs side by side per batch, reference :data:`ORIGINAL` and its A/A copy: batch -> summary."""
    from edge.profile import OrtBackend
    from edge.profile.sidebyside import SideBySideConfig, side_by_side

    config = SideBySideConfig(warmup=timing.warmup, rounds=max(2, timing.rounds), sessions=timing.sessions,
                              iterations=timing.iterations, seed=timing.seed)
    out = {}
    for batch in timing.batches:
        factories = {name: functools.partial(OrtBackend, paths[batch], batch=batch, threads=timing.threads,
                                             spinning=False) for name, paths in graphs.items()}
        out[batch] = compact(side_by_side(factories, ORIGINAL, config))
    return out


def compact(summary: dict) -> dict:
    """What the record keeps of a side-by-side summary: per model its latency and speedup; the A/A control."""
    variants = {name: {"median_ms": v["latency"]["median_ms"], "p90_ms": v["latency"]["p90_ms"],
                       "speedup": v["speedup"]["speedup"], "low": v["speedup"]["low"], "high": v["speedup"]["high"],
                       "verdict": v["speedup"]["verdict"]} for name, v in summary["variants"].items()}
    aa = summary["aa_control"]
    return {"variants": variants, "aa_control": {"speedup": aa["speedup"], "low": aa["low"], "high": aa["high"],
                                                 "deviation": aa["deviation"]},
            "noisy": summary["noisy"], "contention": summary["contention"], "seconds": round(summary["seconds"], 1),
            "iterations_per_round": summary["iterations_per_round"]}


def relative_speed(timed: dict[int, dict], name: str, reference: str) -> float:
    """Geometric mean over the batches of ``name``'s speedup over the original divided by ``reference``'s."""
    logs = [math.log(t["variants"][name]["speedup"] / t["variants"][reference]["speedup"]) for t in timed.values()]
    return math.exp(sum(logs) / len(logs))

