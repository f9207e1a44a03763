"""Edge's planned models against Torch-Pruning and token merging at matched measured speed.

    bash scripts/peers-venv.sh        # once: Torch-Pruning 1.6.1 into .venv-peers-site/ (not into .venv)
    python benchmarks/plan_peers.py --edge runs/plan/a runs/plan/b runs/plan/c --data fmnist
    python benchmarks/plan_peers.py --plans linear:6-9,dwconv:blocks=1+10+11 --data fmnist   # compressed here
    # the distillation on a GPU machine, the timing on the CPU that matched:
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
2. **Distillation, same budgets, each model's learning rate chosen on validation images** (``--epochs 1 3``:
   each budget a run of its own from the same start; ``--jobs`` runs at once; ``--stage distil`` writes
   only their records, ``--distilled``, so it can run on a GPU machine and the records travel back; a run
   not started before ``--deadline`` is recorded as skipped and reported as not run). Every model (edge's
   through :func:`edge.compress.finetune.finetune`, what ``edge finetune ARTIFACT`` runs; the peers
   through :func:`edge.compress.finetune.distil`, its entry point for any module) is distilled from the
   same teacher (the original ``--model``) with the same recipe (edge finetune's defaults), batch order
   (``--seed``) and step budget (``--epochs``, or ``--steps`` for a smoke), once per learning rate of
   ``--lrs``, on the training split of ``--data`` minus ``--val-samples`` seeded, class-balanced
   validation images held out of it; each run is scored on those, the rate of the highest validation
   accuracy is chosen (ties: the lower rate), and only then is the chosen model scored, before and after,
   on the full test split (benchmarks/_peers_selection.py). ``--val-samples 0`` with one rate: the whole
   training split, no choice (the recipe before the selection).
3. **Final timing.** All models, one side-by-side interleaved run per batch size with the A/A
   control: the speedups in the tables come from this run, not from the matching. The graphs are the
   models before distillation (distillation changes weights, not shapes; the shapes distilled elsewhere
   are checked against the ones timed here: parameter counts, pruned widths).

Torch-Pruning is not a dependency of edge: ``scripts/peers-venv.sh`` installs the pinned version
(benchmarks/requirements-peers.txt) with ``pip install --target .venv-peers-site --no-deps`` (its
runtime needs, torch and numpy, are the project's pinned ones) and only this process puts that folder
on ``sys.path``, when it prunes. Intermediate results live in ``--work`` (matches in ``state.json``,
pruned modules, the validation split, distilled artifacts with their checkpoints): a stopped run, started
again with the same command, resumes.

Writes benchmarks/results/plan_peers.json, docs/results/plan-peers.md and docs/results/plan-peers.png.
The parts, each in a module of its own beside this command line: the edge models (_peers_edge), Torch-Pruning
(_peers_pruning), the peers (_peers_candidates), exporting and timing (_peers_timing), what the stages share
(_peers_work), speed matching (_peers_matching), distillation (_peers_distil) and its learning rate
(_peers_selection), the final stage (_peers_final), the three in order (_peers_benchmark), the result as rows
(_peers_report), Markdown (_peers_markdown) and the plot (_peers_plot).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _peers_benchmark import Benchmark  # noqa: E402 (benchmarks/ is on sys.path)
from _peers_candidates import FAMILIES, Candidate, tome_rs  # noqa: E402
from _peers_edge import MODEL, edge_artifact, edge_models  # noqa: E402
from _peers_markdown import markdown  # noqa: E402
from _peers_matching import Match, match_speed  # noqa: E402
from _peers_plot import plot  # noqa: E402
from _peers_pruning import SETUP, TORCH_PRUNING, PruneConfig, import_torch_pruning, prune  # noqa: E402
from _peers_report import rows_of, speed_slack, summary, verdict  # noqa: E402
from _peers_selection import LRS, check_rates, choose_rate  # noqa: E402
from _peers_timing import export_graphs, relative_speed  # noqa: E402
from _results import provenance, read_results, write_results  # noqa: E402

from edge.errors import EdgeError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["FAMILIES", "LRS", "MODEL", "SETUP", "TORCH_PRUNING", "Benchmark", "Candidate", "Match", "PruneConfig",
           "choose_rate", "edge_artifact", "edge_models", "export_graphs", "import_torch_pruning", "main",
           "markdown", "match_speed", "parser", "plot", "prune", "relative_speed", "rows_of", "speed_slack",
           "summary", "tome_rs", "verdict"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--edge", nargs="+", default=[], help="edge artifacts (edge compress / edge plan --out folders)")
    p.add_argument("--plans", nargs="+", default=[], help="plans compressed here (cached in --work)")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data", default="fmnist", help="distillation, Taylor batches, validation and the test split")
    p.add_argument("--samples", type=int, default=500, help="calibration images of --plans")
    p.add_argument("--epochs", nargs="+", type=int, default=[1, 3],
                   help="distillation budgets in epochs, each a run of its own from the same start")
    p.add_argument("--steps", type=int, default=None, help="distillation budget in steps (a smoke)")
    p.add_argument("--lrs", nargs="+", type=float, default=list(LRS),
                   help="learning rates each model is distilled at, per budget; the one of the highest accuracy on "
                        "the validation images is kept (ties: the lower rate)")
    p.add_argument("--val-samples", type=int, default=None,
                   help="validation images held out of the training split (seeded, class-balanced, none of the "
                        "calibration or Taylor images) that choose the rate; default 5000, or a twelfth of a "
                        "smaller training split; 0: no validation, one --lrs rate on the whole training split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-threads", type=int, default=None, help="torch threads of the distillation (recorded)")
    p.add_argument("--train-device", default="auto", help="device of the distillation: auto | cpu | cuda[:N]")
    p.add_argument("--stage", choices=("all", "match", "distil", "time"), default="all",
                   help="match: speed matching (CPU timing); distil: every model at every budget and rate, its "
                        "rate chosen, written to --distilled (on a GPU machine, say); time: the final side-by-side "
                        "run and the report; all: the three")
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
    if args.val_samples is not None and args.val_samples < 0:
        p.error(f"--val-samples {args.val_samples}: pass a number of images >= 0")
    if args.val_samples == 0 and len(args.lrs) > 1:
        p.error(f"--val-samples 0 holds no validation images out, so none of the {len(args.lrs)} --lrs can be "
                "chosen: pass one rate with it, or validation images")
    try:
        check_rates(args.lrs)
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
                                                         "taylor_batches", "train_threads", "stage", "jobs", "lrs",
                                                         "val_samples")},
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
