"""Edge's planned models against Torch-Pruning and token merging at matched measured speed (issue 20, point 4).

    bash scripts/peers-venv.sh        # once: Torch-Pruning 1.6.1 into .venv-peers-site/ (not into .venv)
    python benchmarks/plan_peers.py --edge runs/plan/a runs/plan/b runs/plan/c --data fmnist
    python benchmarks/plan_peers.py --plans linear:6-9,dwconv:blocks=1+10+11 --data fmnist   # compressed here
    # the distillation on a GPU machine, the timing on the CPU that matched (what issue 33's table ran):
    python benchmarks/plan_peers.py --plans P1 P2 P3 P4 --samples 512 --stage match --reuse-matches OLD.json
    python benchmarks/plan_peers.py --plans P1 P2 P3 P4 --samples 512 --stage distil --jobs 14 \
        --train-device cuda --deadline 160 --distilled distilled.json     # there, with WORK/state.json carried
    python benchmarks/plan_peers.py --plans P1 P2 P3 P4 --samples 512 --stage time --distilled distilled.json
    # smoke: one artifact, 2 distillation steps, few timing calls
    python benchmarks/plan_peers.py --edge /tmp/peers-edge-a --data fmnist-mini --steps 2 --rounds 2 \
        --iterations 3 --match-rounds 2 --match-iterations 3 --work /tmp/peers-work

Each edge model (an artifact of ``edge compress`` / ``edge plan`` given with ``--edge``, or made here
from ``--plans`` by :func:`_artifacts.cached_artifact`) fixes one speed. Against it:

1. **Speed matching, measured.** Every candidate is exported by ``edge export`` (static batch, verified
   against PyTorch with ONNX Runtime) at each of ``--batches`` and timed on ONNX Runtime (CPU,
   ``--threads`` intra-op threads) side by side with the original and the edge model, interleaved, with
   an A/A copy of the original (:func:`edge.profile.sidebyside.side_by_side`). A candidate's *relative
   speed* is the geometric mean over the batches of its speedup over the original divided by the edge
   model's, both from the same run (1.0 = matched). The peers:

   * **Torch-Pruning 1.6.1**, its timm ViT example's configuration: ``GroupTaylorImportance`` from the
     cross-entropy gradients of ``--taylor-batches`` seeded, class-balanced training batches of 64,
     ``num_heads={attn.qkv: heads}``, ``prune_head_dims=True``, ``prune_num_heads=False``,
     ``ignored_layers=[model.head]``; widths rounded to multiples of 8 (``round_to=8``; the example
     uses 2); ``global_pruning`` False (uniform) and True (global), both. The example replaces
     ``Attention.forward`` to allow a pruned width; timm 1.0.31's own forward already reshapes with
     ``attn_dim``, so here nothing is patched: each attention's ``num_heads``, ``head_dim``,
     ``attn_dim`` and ``scale`` (1/sqrt(pruned head_dim), what the example's fused attention computes)
     and the model's ``embed_dim`` / ``num_features`` are set from the pruned weights. The ratio is
     searched by measuring: a scan over ``--ratios``, then ``--refine`` bisection steps inside the
     bracket that crosses 1.0 (:func:`match_speed`).
   * **Token merging** (benchmarks/tome.py, bipartite soft matching, proportional attention, a fixed
     merge count ``r`` in every block; static shapes): every feasible ``r`` is timed and the nearest
     kept.

   The match error (relative speed - 1) of the chosen candidate is recorded, with every point measured.
2. **Distillation, same budgets** (``--epochs 1 3``: each budget a run of its own from the same start;
   ``--jobs`` runs at once; ``--stage distil`` writes only their records, ``--distilled``, so it can run
   on a GPU machine and the records travel back; a run not started before ``--deadline`` is recorded as
   skipped and reported as not run). Every model (edge's through :func:`edge.compress.finetune.finetune`,
   what ``edge finetune ARTIFACT`` runs; the peers through :func:`edge.compress.finetune.distil`, its
   entry point for any module) is distilled from the same teacher (the original ``--model``) with
   the same recipe (edge finetune's defaults), batch order (``--seed``) and step budget (``--epochs``,
   or ``--steps`` for a smoke), and scored before and after on the full test split of ``--data``.
3. **Final timing.** All models, one side-by-side interleaved run per batch size with the A/A
   control: the speedups in the tables come from this run, not from the matching. The graphs are the
   models before distillation (distillation changes weights, not shapes; the shapes distilled elsewhere
   are checked against the ones timed here: parameter counts, pruned widths).

Torch-Pruning is not a dependency of edge: ``scripts/peers-venv.sh`` installs the pinned version
(benchmarks/requirements-peers.txt) with ``pip install --target .venv-peers-site --no-deps`` (its
runtime needs, torch and numpy, are the project's pinned ones) and only this process puts that folder
on ``sys.path``, when it prunes. Intermediate results live in ``--work`` (matches in ``state.json``,
pruned modules, distilled artifacts with their checkpoints): a stopped run, started again with the
same command, resumes.

Writes benchmarks/results/plan_peers.json, docs/results/plan-peers.md and docs/results/plan-peers.png.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _artifacts import cached_artifact  # noqa: E402 (benchmarks/ is on sys.path)
from _results import provenance, read_results, write_results  # noqa: E402
from tome import apply_tome, token_counts  # noqa: E402

from edge.compress import CompressConfig, is_artifact  # noqa: E402
from edge.compress.artifact import MANIFEST, read_manifest  # noqa: E402
from edge.compress.load import load_model  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.fileio import write_atomic  # noqa: E402
from edge.models import data_config  # noqa: E402
from edge.progress import log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = "fmnist-deit-tiny"
TORCH_PRUNING = "1.6.1"
PEERS_SITE = Path(os.environ.get("EDGE_PEERS_SITE", ROOT / ".venv-peers-site"))
SETUP = "bash scripts/peers-venv.sh"
ROUND_TO = 8
TAYLOR_BATCH = 64   # the example's --train_batch_size
FAMILIES = ("edge", "torch-pruning uniform", "torch-pruning global", "tome")
ORIGINAL = "original"


# ---------------------------------------------------------------- the edge models

def edge_artifact(path: str | Path, model: str) -> dict:
    """The manifest of the edge artifact at ``path``, or an EdgeError naming the path and what is wrong."""
    path = Path(path)
    expected = f"a folder written by `edge compress` or `edge plan` (holding {MANIFEST}) from {model}"
    if not path.exists():
        raise EdgeError(f"--edge {path} does not exist", expected=expected, fix="check the path")
    if not path.is_dir() or not is_artifact(path):
        raise EdgeError(f"--edge {path} is not an edge artifact", expected=expected,
                        found="a file" if path.is_file() else f"a folder without {MANIFEST}",
                        fix="pass the --out folder of `edge compress` / `edge plan`")
    manifest = read_manifest(path)
    source = (manifest.get("source") or {}).get("model")
    if source != model:
        raise EdgeError(f"--edge {path} was compressed from {source}, not from {model}", expected=expected,
                        fix=f"pass artifacts of {model}, or --model {source}")
    if manifest.get("finetune"):
        raise EdgeError(f"--edge {path} is already fine-tuned", expected="an artifact before any distillation: "
                        "every model gets the same distillation budget here",
                        fix="pass the artifact `edge compress` / `edge plan` wrote, before `edge finetune`")
    return manifest


def edge_models(args) -> list[dict]:
    """``{"key", "label", "path", "plan"}`` per edge model: the ``--edge`` artifacts, then the ``--plans``."""
    found = []
    for path in args.edge:
        manifest = edge_artifact(path, args.model)
        found.append({"path": str(Path(path)), "plan": manifest.get("plan")})
    for plan in args.plans:
        folder = Path(args.work) / "edge" / slug(plan)
        config = CompressConfig(plan=plan, data=args.data, samples=args.samples, seed=args.seed)
        manifest = cached_artifact(args.model, config, folder)
        # named by what made it, not where it lies: another machine (--stage distil) finds the same key
        found.append({"path": str(folder), "plan": manifest.get("plan"),
                      "made_by": json.dumps({"model": args.model, **asdict(config)}, sort_keys=True)})
    if not found:
        raise EdgeError("no edge model to compare", expected="--edge ARTIFACT ... or --plans PLAN ...",
                        fix="pass the folders `edge plan` wrote with --edge")
    for item in found:
        origin = item.pop("made_by", None) or str(Path(item["path"]).resolve())
        item["key"] = f"edge-{slug(item['plan'] or 'none')}-{short_hash(origin)}"
        item["label"] = f"edge `{item['plan']}`"
    return found


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:60]


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


# ---------------------------------------------------------------- Torch-Pruning

def import_torch_pruning(site: Path = PEERS_SITE):
    """``torch_pruning`` from ``site`` (or wherever it is installed), the pinned version, or an EdgeError."""
    if site.is_dir() and str(site) not in sys.path:
        sys.path.append(str(site))
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    try:
        import torch_pruning
    except ImportError as e:
        raise EdgeError(f"Torch-Pruning is not installed (looked in {site} and the environment)",
                        expected=f"torch-pruning=={TORCH_PRUNING} in {site}",
                        fix=f"run `{SETUP}` (pip --target, nothing goes into .venv)") from e
    from importlib import metadata

    try:   # the installed distribution's version (1.6.1's own __version__ still says 1.6.0)
        version = metadata.version("torch-pruning")
    except metadata.PackageNotFoundError:
        version = getattr(torch_pruning, "__version__", "unknown")
    if version != TORCH_PRUNING:
        raise EdgeError(f"Torch-Pruning {version} is installed", expected=f"version {TORCH_PRUNING}",
                        fix=f"run `{SETUP}`")
    return torch_pruning


@dataclass(frozen=True)
class PruneConfig:
    """Torch-Pruning's timm ViT example, as this benchmark runs it (see the module docstring)."""

    ratio: float
    global_pruning: bool
    data: str = "fmnist"
    taylor_batches: int = 10
    seed: int = 0
    round_to: int = ROUND_TO


def taylor_batches(data: str, batches: int, seed: int, spec_config: dict):
    """``batches`` seeded, class-balanced training batches of 64, preprocessed as the model takes them."""
    from edge.data import calibration_set
    from edge.data.preprocess import ArrayPreprocess, InputSpec

    images = calibration_set(data, batches * TAYLOR_BATCH, seed)
    return list(images.batches(TAYLOR_BATCH, ArrayPreprocess(InputSpec.from_data_config(spec_config))))


def prune(model: nn.Module, config: PruneConfig, batches: list | None = None) -> tuple[nn.Module, dict]:
    """``model`` (a timm ViT) pruned in place by Torch-Pruning; returns it and a record of its widths."""
    tp = import_torch_pruning()
    if not 0 <= config.ratio < 1:
        raise EdgeError(f"pruning ratio {config.ratio}", expected="a ratio in [0, 1)")
    spec = data_config(model)
    batches = batches if batches is not None else taylor_batches(config.data, config.taylor_batches, config.seed, spec)
    example = torch.zeros(1, *spec["input_size"])
    heads = {block.attn.qkv: block.attn.num_heads for block in model.blocks}
    model.eval()
    pruner = tp.pruner.MetaPruner(model, example, importance=tp.importance.GroupTaylorImportance(),
                                  global_pruning=config.global_pruning, pruning_ratio=config.ratio,
                                  ignored_layers=[model.head], num_heads=heads, prune_num_heads=False,
                                  prune_head_dims=True, round_to=config.round_to)
    model.zero_grad()
    for x, y in batches:
        nn.functional.cross_entropy(model(x), y).backward()
    pruner.step()
    model.zero_grad(set_to_none=True)
    set_pruned_metadata(model, {block.attn.qkv: pruner.num_heads[block.attn.qkv] for block in model.blocks})
    return model, {"config": asdict(config), "widths": widths(model), "params": sum(p.numel() for p in
                                                                                  model.parameters())}


def set_pruned_metadata(model: nn.Module, num_heads: dict) -> None:
    """Make every attention's and the model's width attributes true to the pruned weights (and check them)."""
    embed = model.patch_embed.proj.out_channels
    for name in ("embed_dim", "num_features", "head_hidden_size"):
        if hasattr(model, name):
            setattr(model, name, embed)
    for i, block in enumerate(model.blocks):
        attn = block.attn
        heads = int(num_heads[attn.qkv])
        if attn.qkv.out_features % (3 * heads):
            raise RuntimeError(f"block {i}: qkv width {attn.qkv.out_features} is not 3 x {heads} heads")
        attn.num_heads, attn.head_dim = heads, attn.qkv.out_features // (3 * heads)
        attn.attn_dim = heads * attn.head_dim
        attn.scale = attn.head_dim ** -0.5
        assert attn.proj.in_features == attn.attn_dim and attn.qkv.in_features == embed, f"block {i}"


def widths(model: nn.Module) -> dict:
    """The embedding width and, per block, the attention's heads x head dim and the MLP's hidden width."""
    return {"embed": int(model.patch_embed.proj.out_channels),
            "blocks": [{"heads": int(b.attn.num_heads), "head_dim": int(b.attn.head_dim),
                        "mlp": int(b.mlp.fc1.out_features)} for b in model.blocks]}


def widths_text(w: dict) -> str:
    heads = sorted({b["heads"] * b["head_dim"] for b in w["blocks"]})
    mlps = sorted({b["mlp"] for b in w["blocks"]})
    span = lambda v: str(v[0]) if len(v) == 1 else f"{v[0]}-{v[-1]}"  # noqa: E731
    return f"embed {w['embed']}, attn {span(heads)}, MLP {span(mlps)}"


# ---------------------------------------------------------------- token merging

def tome_rs(model: nn.Module) -> list[int]:
    """Every merge count ``r >= 1`` the model's token count allows in all of its blocks."""
    tokens = model.patch_embed.num_patches + int(getattr(model, "num_prefix_tokens", 1))
    feasible, r = [], 1
    while True:
        try:
            token_counts(tokens, len(model.blocks), r)
        except ValueError:
            return feasible
        feasible.append(r)
        r += 1


# ---------------------------------------------------------------- speed matching

@dataclass
class Match:
    """The candidate whose measured relative speed (1.0 = the edge model's) is nearest 1, and every point."""

    parameter: float
    relative_speed: float
    reachable: bool                      # some measured candidates were at least as fast as the edge model
    history: dict[float, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.relative_speed - 1.0


def match_speed(measure: Callable[[list[float]], dict[float, float]], grid: list[float], *, refine: int = 0,
                integer: bool = False, tolerance: float = 0.01) -> Match:
    """Search the parameter (ratio, merge count) whose relative speed is nearest 1.0, by measuring.

    ``measure(params)`` times the candidates of ``params`` side by side with the edge model and returns
    each one's relative speed. Speed grows with the parameter: after the scan over ``grid``, ``refine``
    bisection steps measure the midpoint of the bracket whose ends lie on either side of 1.0 (integers:
    the middle integer; none left, the search stops) until one lies within ``tolerance`` of 1.0 (in log
    speed). The nearest point in log speed wins.
    """
    history = dict(measure(sorted(set(grid))))
    for _ in range(refine):
        if min(abs(math.log(s)) for s in history.values()) <= tolerance:
            break
        points = sorted(history)
        bracket = next(((a, b) for a, b in zip(points, points[1:], strict=False)
                        if history[a] <= 1.0 <= history[b]), None)
        if bracket is None:
            break
        mid = (bracket[0] + bracket[1]) // 2 if integer else round((bracket[0] + bracket[1]) / 2, 6)
        if mid in history or not bracket[0] < mid < bracket[1]:
            break
        history.update(measure([mid]))
    best = min(history, key=lambda p: abs(math.log(history[p])))
    return Match(best, history[best], max(history.values()) >= 1.0, dict(sorted(history.items())))


# ---------------------------------------------------------------- exporting and timing

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
    from edge.export import real_inputs

    session = ort_session(str(path))
    images = real_inputs(load_dataset(data, "test"), data_config(model), max(batch, 32))
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


# ---------------------------------------------------------------- the benchmark

@dataclass
class Candidate:
    """One peer model: its family, parameter (ratio or r) and how to build it from the original."""

    family: str
    parameter: float
    build: Callable[[], tuple[nn.Module, dict]]

    @property
    def key(self) -> str:
        p = int(self.parameter) if self.family == "tome" else f"{self.parameter:.4f}"
        return f"{slug(self.family)}-{p}"

    @property
    def label(self) -> str:
        return f"ToMe r={int(self.parameter)}" if self.family == "tome" else \
            f"Torch-Pruning {self.family.split()[-1]} {100 * self.parameter:.1f} %"


class Benchmark:
    """The three stages of the module docstring over ``--work``, resuming from what it holds."""

    def __init__(self, args) -> None:
        self.args = args
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.timing = Timing(threads=args.threads, batches=tuple(args.batches), warmup=args.warmup,
                             rounds=args.rounds, sessions=args.sessions, iterations=args.iterations, seed=args.seed)
        self.match_timing = Timing(threads=args.threads, batches=tuple(args.batches), warmup=args.warmup,
                                   rounds=args.match_rounds, sessions=args.match_sessions,
                                   iterations=args.match_iterations, seed=args.seed)
        self.state_path = self.work / "state.json"
        self.settings = {"model": args.model, "data": args.data, "seed": args.seed, "batches": args.batches,
                         "threads": args.threads, "taylor_batches": args.taylor_batches, "ratios": args.ratios,
                         "refine": args.refine, "torch_pruning": TORCH_PRUNING, "round_to": ROUND_TO}
        self.state = self._load_state()
        self._taylor: list | None = None

    def _load_state(self) -> dict:
        if self.state_path.is_file():
            state = json.loads(self.state_path.read_text())
            if state.get("settings") == self.settings:
                return state
            log(f"{self.state_path}: other settings than this run's; its matches are not reused")
        return {"settings": self.settings, "matches": {}}

    def save_state(self) -> None:
        write_atomic(json.dumps(self.state, indent=1).encode(), self.state_path)

    # ---- candidates
    def taylor(self) -> list:
        if self._taylor is None:
            self._taylor = taylor_batches(self.args.data, self.args.taylor_batches, self.args.seed,
                                          data_config(load_model(self.args.model)))
        return self._taylor

    def candidate(self, family: str, parameter: float) -> Candidate:
        if family == "tome":
            def build() -> tuple[nn.Module, dict]:
                return apply_tome(load_model(self.args.model).eval(), int(parameter)), {"r": int(parameter)}
        else:
            config = PruneConfig(ratio=parameter, global_pruning=family.endswith("global"), data=self.args.data,
                                 taylor_batches=self.args.taylor_batches, seed=self.args.seed)

            def build() -> tuple[nn.Module, dict]:
                return prune(load_model(self.args.model), config, self.taylor())
        return Candidate(family, parameter, build)

    def pruned_module(self, candidate: Candidate) -> tuple[nn.Module, dict]:
        """The candidate's model before distillation, saved once (Torch-Pruning) so a resumed run finds it."""
        if candidate.family == "tome":
            return candidate.build()
        path = self.work / "pruned" / f"{candidate.key}.pt"
        if path.is_file():
            saved = torch.load(path, weights_only=False)
            return saved["model"], saved["record"]
        model, record = candidate.build()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model, "record": record}, tmp)
        tmp.replace(path)
        return model, record

    # ---- stage 1: matching
    def match(self, item: dict, original_graphs: dict[int, Path], tmp: Path) -> dict:
        """The matched peers of one edge model; each family's match is saved to ``state.json`` once found."""
        done = self.state["matches"].setdefault(item["key"], {"peers": {}, "runs": []})
        if "edge" in done:
            log(f"{item['label']}: matches reused from {self.state_path}")
            return done
        edge_graphs, edge_check = export_graphs(load_model(item["path"]), item["key"], tmp, self.timing.batches,
                                                self.args.model, item["plan"])
        checks: dict[str, dict] = {}

        def measure(family: str, params: list[float]) -> dict[float, float]:
            graphs = {ORIGINAL: original_graphs, item["key"]: edge_graphs}
            names = {}
            for p in params:
                cand = self.candidate(family, p)
                model, record = cand.build()
                graphs[cand.key], checks[cand.key] = export_graphs(model, cand.key, tmp, self.timing.batches,
                                                                   self.args.model, None, data=self.args.data,
                                                                   ranks_tokens=family == "tome")
                checks[cand.key]["record"] = record
                names[p] = cand.key
            timed = {str(b): t for b, t in time_models(graphs, self.match_timing).items()}
            done["runs"].append({"family": family, "params": params, "timed": timed})
            speeds = {p: relative_speed(timed, names[p], item["key"]) for p in params}
            log(f"{item['label']} vs {family}: " + ", ".join(f"{p:g} -> {s:.3f}" for p, s in speeds.items()))
            return speeds

        for family in FAMILIES[1:]:
            if family in done["peers"]:
                continue
            if family == "tome":
                grid, refine, integer = tome_rs(load_model(self.args.model)), 0, True
            else:
                grid, refine, integer = self.args.ratios, self.args.refine, False
            found = match_speed(functools.partial(measure, family), grid, refine=refine, integer=integer)
            cand = self.candidate(family, found.parameter)
            done["peers"][family] = {"parameter": found.parameter, "relative_speed": found.relative_speed,
                                     "error": found.error, "reachable": found.reachable,
                                     "history": {str(k): v for k, v in found.history.items()},
                                     "key": cand.key, "label": cand.label, "check": checks[cand.key]}
            log(f"{item['label']}: {cand.label} matches at relative speed {found.relative_speed:.3f}")
            self.save_state()
        # the edge model's speedup over the original: the median over every matching run it was timed in
        speedups = {str(b): float(np.median([run["timed"][str(b)]["variants"][item["key"]]["speedup"]
                                             for run in done["runs"]])) for b in self.timing.batches}
        done["edge"] = {**item, "check": edge_check, "speedup": speedups}
        self.save_state()
        return done

    def reuse_matches(self, items: list[dict], path: str | Path) -> None:
        """Seed ``state.json`` with the matches of an earlier record (``--reuse-matches``) for the same plans.

        A match is an input (which ratio, which r): the final timing re-measures every model side by
        side, so a reused match changes no reported speed, only which peer is compared. Each reused
        group says where it came from."""
        old = json.loads(Path(path).read_text())
        by_plan = {g["edge"]["plan"]: g for g in old.get("groups", [])}
        for item in items:
            group = by_plan.get(item["plan"])
            done = self.state["matches"].get(item["key"])
            if group is None or (done and "edge" in done):
                continue
            speedups = group["edge"]["speedup"]
            self.state["matches"][item["key"]] = {
                "peers": group["peers"], "runs": [], "reused_from": {"file": str(path), "command": old.get("command"),
                                                                     "edge_speedup": speedups},
                "edge": {**item, "check": group["edge"].get("check"), "speedup": speedups}}
            log(f"{item['label']}: matches reused from {path}")
        self.save_state()

    def matched(self, items: list[dict]) -> list[dict]:
        """The matches of every item from ``state.json``, or an EdgeError naming the first one missing."""
        missing = [item["label"] for item in items if "edge" not in self.state["matches"].get(item["key"], {})]
        if missing:
            raise EdgeError(f"no speed match for {missing[0]} in {self.state_path}",
                            expected="the matches of `--stage match` (measured on the CPU that times the models)",
                            fix="run the same command with --stage match first (or --stage all)")
        return [self.state["matches"][item["key"]] for item in items]

    # ---- stage 2: distillation
    def budgets(self) -> list[str]:
        """The distillation budgets, as record keys: epochs (``"1"``, ``"3"``), or ``"N steps"`` for a smoke."""
        return [f"{self.args.steps} steps"] if self.args.steps else [str(e) for e in self.args.epochs]

    def recipe(self, budget: str, **extra):
        from edge.compress.finetune import FinetuneConfig

        steps = self.args.steps if budget.endswith(" steps") else None
        epochs = 1 if steps else int(budget)
        return FinetuneConfig(data=self.args.data, epochs=epochs, steps=steps, seed=self.args.seed,
                              threads=self.args.train_threads, device=self.args.train_device, **extra)

    def distilled_dir(self, budget: str, key: str) -> Path:
        return self.work / "distilled" / slug(budget) / key

    def finished(self, out: Path, config) -> dict | None:
        """The fine-tune record of a finished run of this recipe at ``out``, if there is one."""
        from edge.train.checkpoint import RUN_ONLY

        if not is_artifact(out):
            return None
        stages = read_manifest(out).get("finetune") or []
        want = {k: v for k, v in asdict(config).items() if k not in RUN_ONLY}
        if stages and all(stages[-1]["recipe"].get(k) == v for k, v in want.items()):
            return stages[-1]
        return None

    def distil_edge(self, item: dict, budget: str) -> dict:
        from edge.compress.finetune import finetune

        out = self.distilled_dir(budget, item["key"])
        config = self.recipe(budget)
        record = self.finished(out, config)
        if record is None:
            log(f"distilling {item['label']} ({budget_text(budget)})")
            record = finetune(item["path"], out, config)
        return {"out": str(out), **summary_of(record), "params": sum(p.numel() for p in
                                                                      load_model(item["path"]).parameters())}

    def distil_peer(self, candidate: Candidate, budget: str) -> dict:
        from edge.compress.finetune import distil

        out = self.distilled_dir(budget, candidate.key)
        config = self.recipe(budget, teacher=self.args.model)
        model, pruned = self.pruned_module(candidate)
        record = self.finished(out, config)
        if record is None:
            log(f"distilling {candidate.label} ({budget_text(budget)})")
            recipe = {k: v for k, v in asdict(config).items() if k in ("epochs", "steps", "seed", "threads", "device")}
            record = distil(model, out=out, teacher=self.args.model, data=self.args.data, name=candidate.label,
                            **recipe)
        return {"out": str(out), **summary_of(record), "widths": pruned.get("widths"),
                "params": sum(p.numel() for p in model.parameters())}

    def models_of(self, group: dict) -> list[tuple[str, str, float | None, dict | None]]:
        """``(family, key, parameter, edge item)`` of a matched group's models, the edge model first. Its item
        is this machine's entry of its key (``self.items``): the matches may have been made where it lay
        elsewhere."""
        here = {item["key"]: item for item in self.items}
        edge = group["edge"]
        return [("edge", edge["key"], None, here.get(edge["key"], edge))] + \
            [(f, p["key"], p["parameter"], None) for f, p in group["peers"].items()]

    def jobs(self, groups: list[dict]) -> list[dict]:
        """Every (budget, model) to distil once, the last group (the fastest edge model) and the longest budget
        first: what a run stopped by ``--deadline`` leaves undone is the least needed."""
        jobs, seen = [], set()
        for budget in reversed(ordered(self.budgets())):
            for group in reversed(groups):
                for family, key, parameter, item in self.models_of(group):
                    if (budget, key) not in seen:
                        seen.add((budget, key))
                        jobs.append({"budget": budget, "family": family, "key": key, "parameter": parameter,
                                     "item": item})
        return jobs

    def distil_job(self, job: dict) -> dict:
        if job["family"] == "edge":
            return self.distil_edge(job["item"], job["budget"])
        return self.distil_peer(self.candidate(job["family"], job["parameter"]), job["budget"])

    def distil_all(self, groups: list[dict]) -> dict:
        """Every model at every budget (``--jobs`` processes at once), written to ``--distilled`` as each ends.

        Models are distilled from what this machine builds (the plans compressed, Torch-Pruning run on
        the CPU); each record keeps its parameter count and pruned widths, so the machine that times
        them checks it times the same shapes."""
        path = self.distilled_path
        record = {"budgets": {b: {} for b in self.budgets()}, "skipped": [], "failed": [], "settings": self.settings,
                  "command": " ".join(sys.argv), "jobs": self.args.jobs, "deadline_s": self.args.deadline}
        jobs = self.jobs(groups)
        for job in jobs:                        # built once here: parallel jobs must not race to write them
            if job["family"] not in ("edge", "tome"):
                self.pruned_module(self.candidate(job["family"], job["parameter"]))
        started = time.monotonic()

        def done(job: dict, summary: dict | BaseException | None) -> None:
            if isinstance(summary, BaseException):    # one failed run does not lose the others' records
                record["failed"].append({"budget": job["budget"], "key": job["key"], "error": str(summary)})
                log(f"{job['key']} ({budget_text(job['budget'])}) failed: {summary}")
            elif summary is None:
                record["skipped"].append({k: job[k] for k in ("budget", "key")})
                log(f"{job['key']} ({budget_text(job['budget'])}): not started before the deadline")
            else:
                record["budgets"][job["budget"]][job["key"]] = summary
            record["seconds"] = round(time.monotonic() - started, 1)
            write_atomic(json.dumps(record, indent=1).encode(), path)

        deadline = None if self.args.deadline is None else time.time() + self.args.deadline
        if self.args.jobs <= 1:
            for job in jobs:
                done(job, None if deadline and time.time() > deadline else self.distil_job(job))   # raises
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(self.args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(distil_worker, vars(self.args), job, deadline): job for job in jobs}
                for future in as_completed(futures):
                    error = future.exception()
                    done(futures[future], error if error is not None else future.result())
        log(f"distillation records: {path}")
        if record["failed"]:
            raise EdgeError(f"{len(record['failed'])} of {len(jobs)} distillations failed (recorded in {path})",
                            found=record["failed"][0]["error"], fix="fix the first error and run again (it resumes)")
        return record

    @property
    def distilled_paths(self) -> list[Path]:
        return [Path(p) for p in self.args.distilled] if self.args.distilled else [self.work / "distilled.json"]

    @property
    def distilled_path(self) -> Path:
        """Where ``--stage distil`` writes: the first ``--distilled``."""
        return self.distilled_paths[0]

    def read_distilled(self, groups: list[dict]) -> dict:
        """``--distilled``'s records merged and checked: every model at every budget (or skipped at a
        deadline), one teacher, the shapes timed here. A later file fills only what the earlier ones lack,
        and may be an earlier results file of this benchmark (its distillations of the same plans and
        peers, each entry saying where it came from)."""
        sources = [self.read_source(Path(path)) for path in self.distilled_paths]
        record = {"budgets": {b: {} for b in self.budgets()}, "skipped": [],
                  "sources": [{k: src.get(k) for k in ("file", "command", "jobs", "seconds")} for src in sources]}
        for job in self.jobs(groups):
            found = next(((src, src["budgets"][job["budget"]][job["key"]]) for src in sources
                          if job["key"] in src["budgets"].get(job["budget"], {})), None)
            if found is None and {"budget": job["budget"], "key": job["key"]} in sources[0].get("skipped", []):
                record["skipped"].append({"budget": job["budget"], "key": job["key"]})
                continue                        # not started before --deadline: the report says "not run"
            if found is None:
                raise EdgeError(f"{', '.join(map(str, self.distilled_paths))} hold no {budget_text(job['budget'])} "
                                f"distillation of {job['key']}", expected="every model at every budget of this command",
                                fix="run --stage distil again with the same command (it resumes)")
            src, summary = found
            record["budgets"][job["budget"]][job["key"]] = summary
            if job["family"] == "edge":
                params = sum(p.numel() for p in load_model(job["item"]["path"]).parameters())
                theirs = summary.get("params")
                if theirs is None and summary.get("plan"):          # an earlier results file: the same plan
                    params, theirs = job["item"]["plan"], summary["plan"]
            elif job["family"] == "tome":
                continue
            else:
                model, pruned = self.pruned_module(self.candidate(job["family"], job["parameter"]))
                params, theirs = pruned.get("widths"), summary.get("widths")
            if params != theirs:
                raise EdgeError(f"{job['key']} was distilled with other shapes than the model timed here",
                                expected=f"{params}", found=f"{theirs} in {src['file']}",
                                fix="distil and time models built by the same code and settings")
        return record

    def read_source(self, path: Path) -> dict:
        """A distillation record (``--stage distil``), or an earlier results file turned into one."""
        if not path.is_file():
            raise EdgeError(f"no distillation records at {path}", expected="the file `--stage distil` writes",
                            fix="run --stage distil (on the machine that trains), or pass --distilled FILE")
        record = json.loads(path.read_text())
        if "budgets" in record:
            return {**record, "file": str(path)}
        if "final_timing" not in record:
            raise EdgeError(f"{path} is neither a distillation record nor a results file of plan_peers.py",
                            expected="the --distilled file of --stage distil, or a --json-out of this benchmark")
        here = {item["plan"]: item["key"] for item in self.items}
        keys, widths, plans = {}, {}, {}
        for group in record["groups"]:              # an edge model's key names where it lay: map it by its plan
            edge = group["edge"]
            if edge["plan"] in here:
                keys[edge["key"]], plans[edge["key"]] = here[edge["plan"]], edge["plan"]
            for peer in group["peers"].values():
                widths[peer["key"]] = peer["check"]["record"].get("widths")
        origin = {"file": str(path), "command": record.get("command")}
        budgets = {}
        for budget, entries in budgets_of(record).items():
            budgets[budget] = {}
            for key, summary in entries.items():
                if key.startswith("edge-") and key not in keys:
                    continue                        # a plan this command does not compare
                budgets[budget][keys.get(key, key)] = {
                    **summary, "from": origin, "hardware": summary.get("hardware") or record.get("hardware"),
                    "plan": plans.get(key), "widths": summary.get("widths", widths.get(key))}
        return {"budgets": budgets, "skipped": [], "file": str(path), "command": record.get("command")}

    def final_model(self, family: str, key: str, parameter: float | None, item: dict | None) -> nn.Module:
        """The model whose graph is timed: the one that was distilled, before distillation. Distillation
        changes weights, never shapes (``read_distilled`` checks the shapes), and an fp32 graph's speed on
        ONNX Runtime does not depend on its weights' values, so the graphs timed here need no distilled
        weights (which may stay on the machine that trained)."""
        if family == "edge":
            return load_model(item["path"])
        if family == "tome":
            return self.candidate(family, parameter).build()[0]
        return self.pruned_module(self.candidate(family, parameter))[0]

    # ---- the stages
    def run(self, items: list[dict]) -> dict | None:
        stage, self.items = self.args.stage, items
        torch.set_num_threads(self.args.train_threads or 1)
        if self.args.reuse_matches:
            self.reuse_matches(items, self.args.reuse_matches)
        if stage in ("match", "all"):
            original = load_model(self.args.model)
            with tempfile.TemporaryDirectory(prefix="edge-plan-peers-") as tmp:
                original_graphs, _ = export_graphs(original, ORIGINAL, Path(tmp), self.timing.batches,
                                                   self.args.model, None)
                for item in items:
                    self.match(item, original_graphs, Path(tmp))
            if stage == "match":
                log(f"matches: {self.state_path}; next: the same command with --stage distil, then --stage time")
                return None
        groups = self.matched(items)
        if stage in ("distil", "all"):
            self.distil_all(groups)
            if stage == "distil":
                return None
        distilled = self.read_distilled(groups)
        original = load_model(self.args.model)
        teacher_accuracy = self.original_accuracy(original)
        final, original_check = self.final_timing(groups, original)
        return {"original": {"accuracy": teacher_accuracy, "check": original_check}, "groups": groups,
                "distilled": distilled["budgets"],
                "distillation": {"sources": distilled["sources"], "skipped": distilled["skipped"],
                                 **{k: distilled["sources"][0].get(k) for k in ("command", "jobs", "seconds")}},
                "final_timing": final}

    def original_accuracy(self, original: nn.Module) -> dict:
        from edge.compress.finetune import held_out_set
        from edge.data.preprocess import InputSpec
        from edge.train import held_out_accuracy

        result = held_out_accuracy(original, held_out_set(self.recipe(self.budgets()[0])), InputSpec.from_data_config(
            data_config(original)), torch.device("cpu"))
        return {k: result[k] for k in ("data", "samples", "accuracy", "loss")}

    def final_timing(self, groups: list[dict], original: nn.Module) -> tuple[dict, dict]:
        """Every model and the original, one interleaved side-by-side run per batch."""
        with tempfile.TemporaryDirectory(prefix="edge-plan-peers-final-") as tmp:
            folder = Path(tmp)
            original_graphs, check = export_graphs(original, ORIGINAL, folder, self.timing.batches,
                                                   self.args.model, None)
            graphs = {ORIGINAL: original_graphs}
            for group in groups:
                for family, key, parameter, item in self.models_of(group):
                    if key not in graphs:
                        plan = item["plan"] if item else None
                        graphs[key] = export_graphs(self.final_model(family, key, parameter, item), key, folder,
                                                    self.timing.batches, self.args.model, plan, data=self.args.data,
                                                    ranks_tokens=family == "tome")[0]
            log(f"final timing: {len(graphs)} models side by side at batch " +
                " and ".join(map(str, self.timing.batches)))
            return {str(b): t for b, t in time_models(graphs, self.timing).items()}, check


def distil_worker(args: dict, job: dict, deadline: float | None) -> dict | None:
    """One distillation in a worker process (``--jobs``); None when the deadline passed before it started."""
    if deadline is not None and time.time() > deadline:
        return None
    import_torch_pruning()              # a spawned process: the peers' folder on sys.path, timm's shim first
    return Benchmark(argparse.Namespace(**args)).distil_job(job)


def budget_text(budget: str) -> str:
    return budget if budget.endswith(" steps") else f"{budget} epoch{'s' * (budget != '1')}"


def summary_of(record: dict) -> dict:
    """What the benchmark keeps of a fine-tune record."""
    return {"before": record["eval_before"], "after": record["eval"], "steps": record["steps"],
            "epochs": record["epochs"], "teacher_sha256": record["teacher"]["sha256"],
            "recipe": {k: record["recipe"].get(k) for k in ("data", "epochs", "steps", "seed", "batch_size", "lr",
                                                            "temperature", "alpha", "augment")},
            "wall_time_s": record["wall_time_s"], "hardware": record.get("hardware")}


# ---------------------------------------------------------------- the result

def budgets_of(record: dict) -> dict[str, dict]:
    """``{budget: {key: distillation}}`` (records written before several budgets held one: its epochs)."""
    distilled = record["distilled"]
    if distilled and all("before" in v for v in distilled.values()):
        s = record["settings"]
        return {f"{s['steps']} steps" if s.get("steps") else str(s["epochs"]): distilled}
    return distilled


def rows_of(record: dict) -> list[dict]:
    """One row per model and matched speed, with its final speedups and its accuracy before distillation and
    after each budget (the tables and the plot)."""
    base = record["original"]["accuracy"]["accuracy"]
    final = record["final_timing"]
    budgets = budgets_of(record)
    batches = list(final)
    rows = []
    for g, group in enumerate(record["groups"]):
        edge = group["edge"]
        entries = [("edge", edge["key"], edge["label"], None)] + \
                  [(f, p["key"], p["label"], p) for f, p in group["peers"].items()]
        for family, key, label, peer in entries:
            after = {b: d[key]["after"]["accuracy"] if key in d else None for b, d in budgets.items()}  # None: not run
            rows.append({"group": g, "family": family, "key": key, "label": label,
                         "speedup": {b: final[b]["variants"][key]["speedup"] for b in batches},
                         "interval": {b: [final[b]["variants"][key]["low"], final[b]["variants"][key]["high"]]
                                      for b in batches},
                         "vs_edge": relative_speed(final, key, edge["key"]),
                         "match_error": None if peer is None else peer["error"],
                         "reachable": True if peer is None else peer["reachable"],
                         "before": next(d[key] for d in budgets.values() if key in d)["before"]["accuracy"],
                         "after": after, "drop": {b: None if a is None else base - a for b, a in after.items()},
                         "earlier": {b: bool(d.get(key, {}).get("from")) for b, d in budgets.items()},
                         "widths": None if peer is None else peer["check"]["record"].get("widths")})
    return rows


SPEED_SLACK = 0.03   # a peer this much slower than the edge model (or within the A/A deviation) counts as matched


def speed_slack(record: dict) -> float:
    """How much slower than the edge model a peer may run and still count as at its speed."""
    return max([SPEED_SLACK] + [t["aa_control"]["deviation"] for t in record["final_timing"].values()])


def verdict(rows: list[dict], slack: float = SPEED_SLACK, budget: str | None = None) -> str:
    """Plain sentences: who keeps the most accuracy after ``budget`` (default: the longest) at this speed (peers
    at least as fast as the edge model, within ``slack``), by how much edge wins or loses, and any slower peer
    that keeps more."""
    edge = next(r for r in rows if r["family"] == "edge")
    budget = budget or longest(edge["after"])
    after = lambda r: r["after"][budget]  # noqa: E731
    when = f" ({budget_text(budget)})" if len(edge["after"]) > 1 else ""
    if after(edge) is None:
        return f"Not distilled at this speed{when}: the edge model's run was not made."
    peers = [r for r in rows if r["family"] != "edge" and after(r) is not None]
    fast = [r for r in peers if r["vs_edge"] >= 1.0 - slack]
    slower = sorted((r for r in peers if r["vs_edge"] < 1.0 - slack and after(r) > after(edge)), key=lambda r: -after(r))
    note = "".join(f" {r['label']} keeps {100 * after(r):.2f} % but runs at {r['vs_edge']:.2f} of the edge "
                   "model's speed (not matched)." for r in slower)
    if not fast:
        return f"No peer reached the edge model's speed (within {100 * slack:.0f} %).{note}"
    best = max(fast, key=after)
    gap = 100 * (after(edge) - after(best))
    if gap > 0:
        text = (f"Edge wins at this speed{when}: {edge['label']} keeps {100 * after(edge):.2f} %, {gap:.2f} pt more "
                f"than the best peer as fast ({best['label']}, {100 * after(best):.2f} %).")
    elif gap == 0:
        text = f"A tie at this speed{when}: {edge['label']} and {best['label']} both keep {100 * after(edge):.2f} %."
    else:
        text = (f"Edge loses at this speed{when}: {best['label']} keeps {100 * after(best):.2f} %, "
                f"{-gap:.2f} pt more than {edge['label']} ({100 * after(edge):.2f} %).")
    return text + note


def longest(after: dict[str, float]) -> str:
    return ordered(after)[-1]


def ordered(budgets) -> list[str]:
    """Budget keys from the shortest to the longest (``"1"``, ``"3"``; ``"2 steps"``)."""
    return sorted(budgets, key=lambda b: float(b.split()[0]))


def summary(rows: list[dict], batches: list[str], slack: float) -> list[str]:
    """One line per matched speed and budget: edge's accuracy against the best peer of each family as fast
    (within ``slack``)."""
    families = [f for f in dict.fromkeys(row["family"] for row in rows) if f != "edge"]
    budgets = ordered(rows[0]["after"])
    lines = ["", "## Summary", "",
             f"Per matched speed, the best model of each family at least as fast as edge's (within {100 * slack:.0f} "
             "%, final run), or where none was its fastest, with its speed relative to edge's (slower: not a match). "
             "Accuracy after distillation; the difference is edge's minus the peer's.", "",
             "| edge speedup " + " / ".join(f"b{b}" for b in batches) + " | distillation | edge | "
             + " | ".join(families) + " |",
             "|---|---|---|" + "---|" * len(families)]
    for g in sorted({row["group"] for row in rows}):
        mine = [row for row in rows if row["group"] == g]
        edge = next(row for row in mine if row["family"] == "edge")
        speeds = " / ".join(f"{edge['speedup'][b]:.2f}x" for b in batches)
        for budget in budgets:
            if edge["after"][budget] is None:
                lines.append(f"| {speeds} | "
                             f"{budget_text(budget)} | not run |" + " not run |" * len(families))
                continue
            cells = []
            for family in families:
                theirs = [row for row in mine if row["family"] == family and row["after"][budget] is not None]
                if not theirs:
                    cells.append("not run")
                    continue
                fast = [row for row in theirs if row["vs_edge"] >= 1.0 - slack]
                best = max(fast, key=lambda row: row["after"][budget]) if fast else \
                    max(theirs, key=lambda row: row["vs_edge"])
                slower = "" if fast else f" at {best['vs_edge']:.3f} of edge's speed"
                cells.append(f"{100 * best['after'][budget]:.2f} %{slower} "
                             f"({100 * (edge['after'][budget] - best['after'][budget]):+.2f} pt)")
            lines.append(f"| {speeds} | {budget_text(budget)} | {100 * edge['after'][budget]:.2f} % | "
                         + " | ".join(cells) + " |")
    return lines


def markdown(r: dict) -> str:
    s, v, hw, load = r["settings"], r["versions"], r["hardware"], r["load_average"]
    rows = rows_of(r)
    batches = list(r["final_timing"])
    base = r["original"]["accuracy"]
    budgets = ordered(budgets_of(r))
    budget = " and ".join(budget_text(b) for b in budgets)
    def machine(d: dict) -> str:
        hw = d.get("hardware") or {}
        return hw.get("gpu") or (f"{hw['cpu']} CPU" if hw.get("cpu") else "unrecorded")

    trained = sorted({machine(d) for per in budgets_of(r).values() for d in per.values() if not d.get("from")})
    earlier: dict[str, dict] = {}
    for each, per in budgets_of(r).items():
        for d in per.values():
            if d.get("from"):
                e = earlier.setdefault(d["from"]["file"], {"command": d["from"]["command"], "n": 0, "budgets": set(),
                                                           "machines": set()})
                e["n"] += 1
                e["budgets"].add(budget_text(each))
                e["machines"].add(machine(d))
    lines = [
        "# Edge's planned models against Torch-Pruning and token merging, at matched measured speed", "",
        f"Generated by `{r['command']}` ({r['seconds'] / 60:.1f} min). Model `{r['model']}`, original accuracy "
        f"**{100 * base['accuracy']:.2f} %** on {base['samples']:,} test images of `{base['data']}`. Every model "
        f"distilled from the original with edge's recipe (`edge finetune` defaults), the same batch order (seed "
        f"{s['seed']}) and budget ({budget}, each budget a run of its own from the same start) on `{s['data']}`; "
        f"accuracy before and after on the same test images. Distilled on {', '.join(trained)}"
        + (f" (`{r['distillation']['command']}`, {r['distillation']['jobs']} at once)"
           if r.get("distillation") and r["distillation"].get("command") else "") + "."
        + "".join(f" {e['n']} distillations ({', '.join(sorted(e['budgets']))}) come from an earlier run, `{e['command']}`"
                  f" ({file}), on {', '.join(sorted(e['machines']))}: the same teacher, recipe, batch order and models "
                  "(plans, ratios, r), another machine; marked † in the tables."
                  for file, e in earlier.items()),
        "",
        f"Peers: Torch-Pruning {v.get('torch_pruning', TORCH_PRUNING)} with its timm ViT example's settings "
        f"(GroupTaylorImportance on {s['taylor_batches']} seeded batches of {TAYLOR_BATCH}, head dims pruned, the "
        f"head ignored, widths rounded to {ROUND_TO}), uniform and global; token merging (ToMe, r merges in every "
        "block, training-free before distillation). Each peer's ratio or r was searched by measuring its speed "
        "against the edge model's, side by side (match error = relative speed - 1, geometric mean over the "
        "batches); the speedups below come from one final interleaved run of all models per batch, and `speed vs "
        "edge` is the same ratio in that run (1.000 = as fast as the edge model). The graphs timed are the models "
        "before distillation, which changes weights and not shapes (the shapes distilled and timed are checked "
        "equal). Every graph is `edge export`'s, "
        "verified against PyTorch; ToMe's on real test images (its merge ranks token similarities, and near-ties "
        "in random-noise inputs flip between PyTorch and ONNX Runtime).", "",
        f"Hardware (timing): {hw['cpu']} ({hw['cpu_count']} logical CPUs), load average before/after "
        f"{load['before'][0]:.2f} / {load['after'][0]:.2f}. ONNX Runtime {v.get('onnxruntime')} (CPU, "
        f"{s['threads']} intra-op threads, fp32, static batch); final timing: {s['rounds']} rounds in "
        f"{s['sessions']} session sets, {s['iterations']} calls per model and round, {s['warmup']} warm-up calls.",
        ""]
    reused = [g for g in r["groups"] if g.get("reused_from")]
    if reused:
        lines += [f"Matches reused (`--reuse-matches`) for {len(reused)} of {len(r['groups'])} speeds, from "
                  f"`{reused[0]['reused_from']['command']}`: which ratio and r were compared came from that run; "
                  "every speed below was measured again in this one.", ""]
    skipped = (r.get("distillation") or {}).get("skipped") or []
    if skipped:
        lines += [f"Not run: {len(skipped)} distillations ({', '.join(sorted({budget_text(x['budget']) for x in skipped}))}"
                  ") did not start before the distillation run's deadline (`--deadline`); their cells say `not "
                  "run`.", ""]
    for b in batches:
        t = r["final_timing"][b]
        aa = t["aa_control"]
        lines.append(f"- Batch {b}: A/A control (a second session of the original) {aa['speedup']:.3f}x "
                     f"[{aa['low']:.3f}, {aa['high']:.3f}]; other processes used "
                     f"{100 * (t['contention'].get('other_cpu_share') or 0):.0f} % of the CPUs"
                     + (" (**noisy: speed differences within the A/A deviation are not resolved**)"
                        if t["noisy"] else "") + ".")
    lines += summary(rows, batches, speed_slack(r))
    lines += ["", "What this does not show:", "",
              f"- One seed; distillation budgets of {budget}. Torch-Pruning's models lose most before distillation "
              "and recover most of it in training, so longer budgets may narrow the gaps further.",
              "- One small model on small inputs, timed with ONNX Runtime on this CPU. Token merging gains with the "
              "token count (its paper reports up to 2x throughput on ImageNet ViTs of 197 tokens and more); with "
              "this model's 50 tokens its largest merge never reaches the edge models' speed at batch 1. Under "
              "TensorRT on a Jetson the ranking is not measured.",
              "- The edge models were planned on a latency table of this CPU at batch 1."]
    for g in range(len(r["groups"])):
        mine = [row for row in rows if row["group"] == g]
        edge = mine[0]
        speeds = " / ".join(f"{edge['speedup'][b]:.2f}x" for b in batches)
        lines += ["", f"## {edge['label']}: {speeds} (batch {' / '.join(batches)})", "",
                  "| model | method | speedup " + " | speedup ".join(f"b{b}" for b in batches)
                  + " | speed vs edge (final run) | match error (search) | accuracy before | "
                  + " | ".join(f"after {budget_text(b)}" for b in budgets) + f" | drop vs original ({budget_text(budgets[-1])}) |",
                  "|---|---|" + "---|" * len(batches) + "---|---|---|" + "---|" * len(budgets) + "---|"]
        for row in mine:
            what = widths_text(row["widths"]) if row["widths"] else ("token merging" if row["family"] == "tome"
                                                                     else "planned")
            speed = " | ".join(f"{row['speedup'][b]:.2f}x [{row['interval'][b][0]:.2f}, {row['interval'][b][1]:.2f}]"
                               for b in batches)
            error = "" if row["match_error"] is None else f"{100 * row['match_error']:+.1f} %" + \
                ("" if row["reachable"] else " (never as fast)")
            after = " | ".join("not run" if row["after"][b] is None else
                               f"**{100 * row['after'][b]:.2f} %**" + (" †" if row["earlier"][b] else "")
                               for b in budgets)
            lines.append(f"| {row['label']} | {row['family']}: {what} | {speed} | {row['vs_edge']:.3f} | {error} | "
                         f"{100 * row['before']:.2f} % | {after} | "
                         + ("not run |" if row["drop"][budgets[-1]] is None else f"{100 * row['drop'][budgets[-1]]:.2f} pt |"))
        lines += [""] + [verdict(mine, speed_slack(r), b) for b in budgets]
        for row in (row for row in mine if not row["reachable"]):
            lines.append(f"{row['label']} is the fastest of its family that was measured and is still slower than "
                         "the edge model in the search.")
    lines += ["", "![accuracy against measured speedup](plan-peers.png)", ""]
    return "\n".join(lines)


def plot(r: dict, png: str | Path) -> None:
    """Accuracy after distillation against the final measured speedup, one panel per batch (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rows_of(r)
    batches = list(r["final_timing"])
    style = {"edge": ("tab:red", "o"), "torch-pruning uniform": ("tab:blue", "s"),
             "torch-pruning global": ("tab:cyan", "D"), "tome": ("tab:green", "^")}
    budgets = ordered(rows[0]["after"])
    # the axis spans the distilled accuracies (the comparison); training-free points below it are left off
    low = math.floor(min(100 * a for row in rows for a in row["after"].values() if a is not None) - 1.0)
    high = math.ceil(max([100 * a for row in rows for a in row["after"].values() if a is not None]
                         + [100 * r["original"]["accuracy"]["accuracy"]]) + 0.5)
    off = len({row["key"] for row in rows if 100 * row["before"] < low})
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4.8), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        for family, (color, marker) in style.items():
            mine = [row for row in rows if row["family"] == family]
            if not mine:
                continue
            x = [row["speedup"][b] for row in mine]
            for i, budget in enumerate(budgets):       # the longest budget solid, shorter ones fainter and smaller
                last = i == len(budgets) - 1
                ran = [(xi, row) for xi, row in zip(x, mine, strict=True) if row["after"][budget] is not None]
                ax.scatter([xi for xi, _ in ran], [100 * row["after"][budget] for _, row in ran], c=color, marker=marker,
                           alpha=1.0 if last else 0.45, s=36 if last else 22,
                           label=f"{family}, {budget_text(budget)}")
            ax.scatter(x, [100 * row["before"] for row in mine], facecolors="none", edgecolors=color, marker=marker,
                       alpha=0.6, label=f"{family}, before")
        ax.axhline(100 * r["original"]["accuracy"]["accuracy"], color="gray", ls="--", lw=1, label="original")
        ax.set_xlabel(f"measured speedup over the original, batch {b} (ONNX Runtime CPU)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_ylim(low, high)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)
    title = f"{r['model']}: accuracy against measured speedup"
    if off:
        title += f"\n({off} model{'s' * (off != 1)} below {low} % before distillation, off the axis: see the table)"
    fig.suptitle(title, fontsize=10 if off else 12)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- command line

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--edge", nargs="+", default=[], help="edge artifacts (edge compress / edge plan --out folders)")
    p.add_argument("--plans", nargs="+", default=[], help="plans compressed here (cached in --work)")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data", default="fmnist", help="distillation, Taylor batches and the test split")
    p.add_argument("--samples", type=int, default=500, help="calibration images of --plans")
    p.add_argument("--epochs", nargs="+", type=int, default=[1, 3],
                   help="distillation budgets in epochs, each a run of its own from the same start")
    p.add_argument("--steps", type=int, default=None, help="distillation budget in steps (a smoke)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-threads", type=int, default=None, help="torch threads of the distillation (recorded)")
    p.add_argument("--train-device", default="auto", help="device of the distillation: auto | cpu | cuda[:N]")
    p.add_argument("--stage", choices=("all", "match", "distil", "time"), default="all",
                   help="match: speed matching (CPU timing); distil: every model at every budget, written to "
                        "--distilled (on a GPU machine, say); time: the final side-by-side run and the report; "
                        "all: the three")
    p.add_argument("--jobs", type=int, default=1, help="distillations at once (processes; a GPU takes several)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds after which no further distillation starts (those left are recorded as skipped)")
    p.add_argument("--distilled", nargs="+", default=None,
                   help="the distillation records (default: WORK/distilled.json); --stage distil writes the "
                        "first; --stage time merges them in order, each filling what the earlier lack (an "
                        "earlier --json-out of this benchmark counts: its distillations of the same plans)")
    p.add_argument("--reuse-matches", default=None,
                   help="an earlier results file whose matches (ratio, r) are taken for the same plans")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
                   help="Torch-Pruning ratios scanned before bisection")
    p.add_argument("--refine", type=int, default=2, help="bisection steps after the scan")
    p.add_argument("--taylor-batches", type=int, default=10, help="batches of 64 for GroupTaylorImportance")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20, help="final timing: interleaved rounds")
    p.add_argument("--sessions", type=int, default=4, help="final timing: session sets")
    p.add_argument("--iterations", type=int, default=20, help="final timing: calls per model and round")
    p.add_argument("--match-rounds", type=int, default=8)
    p.add_argument("--match-sessions", type=int, default=2)
    p.add_argument("--match-iterations", type=int, default=10)
    p.add_argument("--work", default=str(ROOT / "runs/plan-peers"), help="intermediate results (resumable)")
    p.add_argument("--json-out", default=str(ROOT / "benchmarks/results/plan_peers.json"))
    p.add_argument("--md-out", default=str(ROOT / "docs/results/plan-peers.md"))
    p.add_argument("--png-out", default=str(ROOT / "docs/results/plan-peers.png"))
    p.add_argument("--render", action="store_true", help="only write --md-out and --png-out again from --json-out")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    if args.render:
        publish(read_results(p, args.json_out), args)
        return
    if args.steps and len(args.epochs) > 1:
        p.error("--steps is one budget: pass a single --epochs with it")
    try:
        run(args, p)
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from e


def run(args, p: argparse.ArgumentParser) -> dict:
    started, load_before = time.perf_counter(), os.getloadavg()
    items = edge_models(args)           # bad input refused before any work
    import_torch_pruning()
    benchmark = Benchmark(args)
    result = benchmark.run(items)
    if result is None:                  # --stage match / distil: their files are written, no report yet
        return {}
    keys = {d["teacher_sha256"] for per in result["distilled"].values() for d in per.values()}
    if len(keys) != 1:
        raise RuntimeError(f"the models were distilled from {len(keys)} different teachers")
    record = {"model": args.model, **result,
              "settings": {k: getattr(args, k) for k in ("data", "epochs", "steps", "seed", "threads", "batches",
                                                         "warmup", "rounds", "sessions", "iterations", "match_rounds",
                                                         "match_sessions", "match_iterations", "ratios", "refine",
                                                         "taylor_batches", "train_threads", "stage", "jobs")},
              **provenance("plan_peers.py", args, p, started=started, load_before=load_before,
                           skip=("json_out", "md_out", "png_out", "work", "deadline"))}
    record["versions"]["torch_pruning"] = TORCH_PRUNING
    publish(record, args)
    return record


def publish(record: dict, args) -> None:
    """The plot, the JSON record and its table, at ``--png-out``, ``--json-out`` and ``--md-out``."""
    plot(record, args.png_out)
    write_results(record, args.json_out, args.md_out, markdown)


if __name__ == "__main__":
    main()
