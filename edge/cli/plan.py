"""``edge plan``: the compression plan across every method that meets a latency budget with the most fidelity."""

from __future__ import annotations

import sys
from pathlib import Path

from edge.cli.common import (
    add_command,
    add_data_option,
    add_device_option,
    add_field,
    add_model_options,
    add_out_folder,
    emit,
)
from edge.cli.options import ExistingFile, Share, Text

EXAMPLES = """  # twice as fast as the original on ONNX Runtime here (batch 1, 2 threads): measures the latency
  # table first (about 2 min), then searches (about 10 min on 2 cores); writes runs/plan2x/model
  edge plan fmnist-deit-tiny --budget 0.5x --data fmnist --out runs/plan2x

  # reuse a table (edge profile MODEL --latency-table FILE), then distil the chosen plan for 3 epochs
  edge profile fmnist-deit-tiny --latency-table tables/cpu-b1.json --threads 2 --iterations 100
  edge plan fmnist-deit-tiny --budget 0.5x --table tables/cpu-b1.json --finetune 3 --out runs/plan2x

  # a budget in milliseconds on a Jetson, from the table `edge deploy --latency-table` brought back
  edge plan fmnist-deit-tiny --budget-ms 1.2 --table runs/nano/table.json --backend tensorrt --out runs/plan-nano

  # an Orin Nano without a device table (its estimator, fp16), serving batch 1 three times as long as
  # batch 32; candidates keep head sizes fused attention takes and GEMM widths multiples of 16
  edge plan fmnist-deit-tiny --budget 0.5x --backend estimate --batch 1,32 --batch-weights 3,1 --out runs/orin

  edge eval runs/plan2x/model --data fmnist    # the chosen plan is an ordinary compressed artifact"""


def register(subparsers) -> None:
    from edge.planner.job import PlanJobConfig, TargetConfig
    from edge.planner.objective import parse_batches, parse_weights
    from edge.planner.plans import SHAPE_RULES, SearchConfig

    parser = add_command(subparsers, "plan", "find the plan across all methods that meets a latency budget",
                         "Candidate steps of every compression method (blocks replaced by linear maps, attention\n"
                         "removed or made a depthwise convolution, heads and MLPs narrowed by WPAC) are measured\n"
                         "beside the plan so far: fitted on calibration images, scored by KL to the original on\n"
                         "held-out training images, latency predicted from a table measured on the target. Each\n"
                         "round takes the least KL lost per ms saved until the budget is met. OUT/model is the\n"
                         "chosen plan as a compressed artifact; OUT/plan.json, plan.md and pareto.png record every\n"
                         "round, every measured plan and the Pareto front.", EXAMPLES)
    add_model_options(parser)
    budget = parser.add_mutually_exclusive_group(required=True)
    kind = Share(float, _bounds(SearchConfig, "budget"), "--budget")
    budget.add_argument("--budget", type=kind, metavar="Fx",
                        help="a share of the original's predicted latency, 0 < F <= 1 (0.5x: twice as fast)")
    add_field(budget, "--budget-ms", SearchConfig, help="or a latency in milliseconds on the table's target")
    add_data_option(parser, SearchConfig.data, "calibration and held-out images (training split)")
    add_field(parser, "--samples", SearchConfig, help="calibration images every step is fitted on")
    add_field(parser, "--holdout", SearchConfig, help="held-out training images every plan is scored on")
    add_field(parser, "--seed", SearchConfig, help="random seed (samples, fits, timing order)")
    add_field(parser, "--shortlist", SearchConfig, help="moves re-measured each round (cheapest by their last cost)")
    add_field(parser, "--min-step", SearchConfig, help="a move must save at least this share of the original's "
              "predicted latency while such moves exist (default 0: any saving; e.g. 0.02 on a launch-bound target "
              "such as a small model on the Orin estimate, where width cuts save a fraction of a percent each)")
    add_field(parser, "--refresh", SearchConfig, help="every N rounds every move is measured again")
    add_field(parser, "--min-agreement", SearchConfig, help="the fidelity floor: a plan whose held-out top-1 "
              "agreement with the original falls below it is destroyed, not compressed; the search takes no move "
              "below it and refuses a budget only such plans meet, naming the fastest plan above it (0: no floor)")
    parser.add_argument("--table", type=ExistingFile(), metavar="FILE", action="append",
                        help="a latency table measured on the target (default: measure one here, ONNX Runtime); "
                             "again for each batch of --batch")
    parser.add_argument("--backend", choices=["onnxruntime", "tensorrt", "estimate"], help="the target's backend "
                        "(default: the table's; without --table onnxruntime; estimate: the Orin Nano estimator)")
    parser.add_argument("--target-device", type=Text(), metavar="NAME", help="the target device's name (default: "
                        "the table's, else this machine's CPU)")
    add_device_option(parser, "the search's passes over the images and the fine-tune", SearchConfig.device,
                      hint="the target device's name is --target-device")
    parser.add_argument("--precision", choices=["fp32", "fp16", "int8"], help="the target's precision "
                        "(default: the table's, else fp32)")
    parser.add_argument("--batch", type=Text(parse_batches), metavar="N[,N...]", help="the target's batch, or "
                        "several: a plan's cost is then the weighted sum of its latency ratios to the original's "
                        "at each (default: the tables', else 1)")
    parser.add_argument("--batch-weights", type=Text(parse_weights), metavar="W,W...", help="the weight of each "
                        "batch of --batch in the cost, e.g. each one's share of the device's time (default: equal)")
    parser.add_argument("--shape-rules", choices=SHAPE_RULES, default="auto", help="keep the shapes TensorRT runs "
                        "fastest (fused attention head sizes, GEMM widths multiples of 16) for engines of this "
                        "precision; auto: the target's precision for --backend tensorrt or estimate, off for "
                        "onnxruntime")
    parser.add_argument("--power-mode", choices=_estimate_modes(), help="--backend estimate: the Orin Nano's "
                        "power mode (default: MAXN_SUPER)")
    add_field(parser, "--threads", TargetConfig, help="ONNX Runtime intra-op threads of the target "
              "(default: the table's, else 2)")
    add_field(parser, "--iterations", PlanJobConfig, help="timed calls per part graph of a latency table measured here")
    add_field(parser, "--whole-iterations", PlanJobConfig, help="timed calls per graph of the whole-model check "
              "(the original, its A/A copy and --measure plans, side by side in a fresh process)")
    add_field(parser, "--whole-rounds", PlanJobConfig, help="interleaved rounds of the whole-model check (split "
              "evenly between --whole-sessions session sets; its speedup is the median of the per-round ratios)")
    add_field(parser, "--whole-sessions", PlanJobConfig, help="session sets of the whole-model check, each created "
              "afresh in rotated order")
    add_field(parser, "--measure", PlanJobConfig, help="Pareto-front plans exported and timed whole beside the "
              "original (the chosen one first; 0: none)")
    add_field(parser, "--correct", PlanJobConfig, help="times the budget is tightened when the chosen plan, timed "
              "whole here, misses it (by how optimistic its prediction was; ONNX Runtime here only)")
    add_field(parser, "--finetune", PlanJobConfig, help="then distil the chosen plan for N epochs of --data "
              "(`edge finetune`'s recipe) and report its test accuracy (default: none)")
    add_field(parser, "--finetune-max-steps", PlanJobConfig, help="stop the distillation after N steps (a "
              "shortened run of the same schedule; default: all)")
    add_field(parser, "--train-threads", PlanJobConfig, help="torch threads of the search and the distillation "
              "(default: torch's)")
    add_out_folder(parser, "output folder (written whole, atomically)")
    parser.set_defaults(run=run)


def _estimate_modes() -> list[str]:
    from edge.latency.orin import MODES

    return list(MODES)


def _bounds(config: type, name: str):
    from edge.cli.options import config_type

    return config_type(config, f"--{name}", name).limits


def run(args) -> int:
    from edge.compress.load import load_model
    from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget
    from edge.planner.plans import SearchConfig
    from edge.progress import log
    from edge.runtime import resolve_device, set_threads

    set_threads(args.train_threads)
    resolve_device(args.device)   # a GPU asked for where there is none: said before any work
    search = SearchConfig(budget=args.budget, budget_ms=args.budget_ms, data=args.data, samples=args.samples,
                          holdout=args.holdout, seed=args.seed, shortlist=args.shortlist, refresh=args.refresh,
                          min_step=args.min_step, min_agreement=args.min_agreement,
                          shape_rules=args.shape_rules, device=args.device)
    search.check()
    target = TargetConfig(table=tuple(args.table or ()), backend=args.backend, device=args.target_device,
                          precision=args.precision, batches=args.batch or (), batch_weights=args.batch_weights or (),
                          threads=args.threads, power_mode=args.power_mode)
    config = PlanJobConfig(search=search, target=target, iterations=args.iterations, measure=args.measure,
                           whole_iterations=args.whole_iterations, whole_rounds=args.whole_rounds,
                           whole_sessions=args.whole_sessions,
                           correct=args.correct,
                           finetune=args.finetune, finetune_max_steps=args.finetune_max_steps,
                           train_threads=args.train_threads)
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    source = {"model": args.model, "weights": str(Path(args.weights).resolve()) if args.weights else None,
              "img_size": args.img_size}  # the weights by absolute path: later verbs may run in another folder
    record = plan_to_budget(model, source, args.out, config, progress=log)
    result = record["result"]
    chosen, base = result["chosen"], result["original"]["predicted_ms"]
    human = [f"plan {chosen['plan']}",
             f"predicted {chosen['predicted_ms']:.4g} ms ({base / chosen['predicted_ms']:.2f}x of {base:.4g} ms); "
             f"held-out KL {chosen['kl']:.4g}, agreement {chosen['agreement']:.4f} "
             f"({chosen['floor_margin']:+.4f} above the floor {result['min_agreement']:g})"]
    if record["timed"]:
        row = record["timed"]["plans"][0]
        human.append(f"measured {row['measured_ms']:.4g} ms against the original's {record['timed']['original_ms']:.4g}"
                     f" ms: {row['speedup']:.2f}x (A/A {record['timed']['aa_ratio']:.3f})")
    if record["finetune"]:
        tuned = record["finetune"]
        human.append(f"distilled {tuned['steps']} steps: accuracy {tuned['after']['accuracy']:.4f} "
                     f"(original {tuned['original']['accuracy']:.4f}, drop {tuned['drop_pt']:.2f} pt)")
    human.append(f"wrote {args.out} (model/, plan.json, plan.md, pareto.png{', timed/' if record['timed'] else ''})")
    from edge.planner.job import MODEL_DIR

    emit({**record, "out": args.out, "model_path": str(Path(args.out) / MODEL_DIR)}, args.json, "\n".join(human))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run as: edge plan ...")
