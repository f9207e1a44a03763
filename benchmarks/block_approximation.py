"""Block approximation on the bundled reference model: every single-block span, four methods.

    python benchmarks/block_approximation.py                      # full test split, ~15 min on 2 cores
    python benchmarks/block_approximation.py --data fmnist-mini   # quick look

For every span i-1 -> i (i = 1..11) it fits skip / identity / linear / affine on the same 500
seeded, class-balanced calibration images, and measures top-1 accuracy on the whole test split
with the model's own head, plus params and FLOPs; then the planner's auto-linear:3 and
auto-affine:3. Writes benchmarks/results/block_approximation.json and
docs/results/block-approximation.md.

Speed: the test images' representation at the input of each span is computed once by the
original model (which the compressed model shares up to that point); each variant then runs
only its span module, the blocks after it and the head. The JSON records the largest logit
difference between this path and the compressed model's own forward pass on 512 images.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from _results import write_results  # benchmarks/ is on sys.path: run as python benchmarks/NAME.py

from edge.analysis.collect import block_outputs, collect_block_moments
from edge.check.accuracy import evaluate
from edge.compress import CompressConfig, compress
from edge.compress.compressor import costs
from edge.compress.load import load_model
from edge.compress.methods.block_approximation.fit import apply_spans
from edge.compress.methods.block_approximation.module import ApproximatedSpan, SpanStep
from edge.data import ArrayPreprocess, InputSpec, calibration_set, load_dataset
from edge.models import data_config
from edge.progress import log
from edge.runtime import hardware, set_threads

METHODS = ("skip", "identity", "linear", "affine")
ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def cached_inputs(model, test, spec, indices: list[int], batch_size: int = 500) -> dict[int, torch.Tensor]:
    """Representation index -> [N, T, D] for the whole test split (0 = embedding output)."""
    preprocess = ArrayPreprocess(spec)
    store: dict[int, list[torch.Tensor]] = {i: [] for i in indices}
    with block_outputs(model) as captured:
        for x, _ in test.batches(batch_size, preprocess):
            captured.clear()
            model.forward_features(x)
            for i in indices:
                store[i].append(captured[i].clone())
    return {i: torch.cat(v) for i, v in store.items()}


@torch.no_grad()
def tail_logits(model, position: int, tokens: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Run ``model.blocks[position:]``, the final norm and the head on cached tokens."""
    out = []
    for start in range(0, len(tokens), batch_size):
        x = tokens[start:start + batch_size]
        for block in model.blocks[position:]:
            x = block(x)
        out.append(model.forward_head(model.norm(x)))
    return torch.cat(out)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(-1) == labels).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="fmnist-deit-tiny")
    parser.add_argument("--data", default="fmnist")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--json-out", default=str(ROOT / "benchmarks/results/block_approximation.json"))
    parser.add_argument("--md-out", default=str(ROOT / "docs/results/block-approximation.md"))
    args = parser.parse_args()
    threads = set_threads(args.threads)
    started = time.perf_counter()

    model = load_model(args.model)
    spec = InputSpec.from_data_config(data_config(model))
    test = load_dataset(args.data, "test")
    calibration = calibration_set(args.data, args.samples, args.seed)
    base = evaluate(model, test, spec)
    base_costs = costs(model)
    log(f"original: accuracy {base['accuracy']:.4f}")
    moments = collect_block_moments(model, calibration, spec)
    num_blocks = len(model.blocks)
    spans = list(range(1, num_blocks))  # span i-1 -> i replaces block i
    cache = cached_inputs(model, test, spec, spans)

    rows, check = [], 0.0
    for i in spans:
        row = {"span": f"{i - 1}->{i}", "block": i}
        for method in METHODS:
            compressed = copy.deepcopy(model)  # the very same weights, also for random-weight models
            fit = apply_spans(compressed, (SpanStep(method, i - 1, i),), moments, calibration, spec, args.seed)
            position = next(p for p, m in enumerate(compressed.blocks) if isinstance(m, ApproximatedSpan))
            logits = tail_logits(compressed, position, cache[i])
            row[method] = accuracy(logits, test.labels)
            row[f"{method}_fit_r2"] = fit[f"{method}:{i - 1}-{i}"]["all"]["r2"]
            if i in (1, num_blocks - 1):  # the fast path against the compressed model's own forward pass
                x = ArrayPreprocess(spec)(test.images[:512])
                with torch.no_grad():
                    check = max(check, float((compressed(x) - logits[:512]).abs().max()))
            if method == "linear":
                row.update({f"linear_{k}": v for k, v in costs(compressed).items()})
            if method == "affine":
                row.update({f"affine_{k}": v for k, v in costs(compressed).items()})
        log(f"span {row['span']}: " + " ".join(f"{m} {row[m]:.4f}" for m in METHODS))
        rows.append(row)

    autos = []
    for plan in ("auto-linear:3", "auto-affine:3"):
        compressed, manifest = compress(copy.deepcopy(model), {"model": args.model},
                                        CompressConfig(plan=plan, data=args.data, samples=args.samples,
                                                       seed=args.seed))
        result = evaluate(compressed, test, spec)
        autos.append({"requested": plan, "plan": manifest["plan"], "accuracy": result["accuracy"],
                      "loss_pt": 100 * (base["accuracy"] - result["accuracy"]), **manifest["after"],
                      "planner": manifest["planner"]})
        log(f"{plan} -> {manifest['plan']}: accuracy {result['accuracy']:.4f}")

    beats = sum(max(r["linear"], r["affine"]) > r["skip"] for r in rows)
    best = max(rows, key=lambda r: max(r["linear"], r["affine"]))
    best_acc = max(best["linear"], best["affine"])
    from edge.models import model_card

    record = {
        "model": args.model, "data": test.name, "test_samples": len(test),
        "calibration": {"data": calibration.name, "samples": len(calibration), "seed": args.seed,
                        "holdout": max(1, round(args.samples * CompressConfig(plan="").holdout))},
        "original": {"accuracy": base["accuracy"], **base_costs},
        "spans": rows, "auto": autos,
        "summary": {"linear_or_affine_beats_skip": beats, "of_spans": len(rows),
                    "best_span": best["span"], "best_accuracy": best_acc,
                    "best_loss_pt": 100 * (base["accuracy"] - best_acc)},
        "fast_path_max_logit_diff": check,
        "weights_card": (model_card(args.model) or {}).get("eval"),
        "hardware": hardware(), "threads": threads, "seconds": round(time.perf_counter() - started, 1),
        "command": "python benchmarks/block_approximation.py"
        + ("" if args.data == "fmnist" else f" --data {args.data}"),
    }
    write_results(record, args.json_out, args.md_out, markdown)


def markdown(r: dict) -> str:
    o = r["original"]
    hw = r["hardware"]
    lines = [
        "# Block approximation (TOAST / RBA) on the reference model",
        "",
        f"Generated by `{r['command']}` ({r['seconds'] / 60:.1f} min). Model `{r['model']}`, accuracy with its own "
        f"head on all {r['test_samples']:,} images of `{r['data']}`; maps fitted on {r['calibration']['samples']} "
        f"class-balanced training images (seed {r['calibration']['seed']}), no training. Hardware: {hw['cpu']}, "
        f"{r['threads']} threads, torch {hw['torch']}.",
        "",
        f"Original: accuracy **{100 * o['accuracy']:.2f} %**, {o['params']:,} params, {o['flops'] / 1e6:.1f} MFLOPs.",
        "",
        "Span `i-1->i` replaces block i. `identity` (TOAST, A = I) and `skip` (RBA's baseline, blocks removed) are "
        "the same function by definition and give the same numbers; both are listed as the papers name them.",
        "",
        "| span | skip | identity | linear | affine | best - original (pt) | params (linear) | MFLOPs (linear) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in r["spans"]:
        best = max(s["linear"], s["affine"])
        mark = lambda m: f"**{100 * s[m]:.2f}**" if s[m] == max(s[k] for k in METHODS) else f"{100 * s[m]:.2f}"  # noqa
        lines.append(f"| {s['span']} | {mark('skip')} | {mark('identity')} | {mark('linear')} | {mark('affine')} | "
                     f"{100 * (best - o['accuracy']):+.2f} | {s['linear_params']:,} | {s['linear_flops'] / 1e6:.1f} |")
    sm = r["summary"]
    lines += [
        "",
        f"- Linear or affine beats skip on **{sm['linear_or_affine_beats_skip']} of {sm['of_spans']}** spans "
        "(target: at least 8).",
        f"- Best single-block span: {sm['best_span']} at {100 * sm['best_accuracy']:.2f} %, a loss of "
        f"**{sm['best_loss_pt']:.2f} pt** (target: at most 0.5 pt).",
        "",
        f"## Planner (greedy by held-out fidelity: {r['calibration']['samples'] - r['calibration']['holdout']} fit / "
        f"{r['calibration']['holdout']} held-out calibration images; the chosen plan is then fitted on all)",
        "",
        "| requested | chosen plan | accuracy | loss (pt) | params | MFLOPs |",
        "|---|---|---|---|---|---|",
    ]
    for a in r["auto"]:
        lines.append(f"| `{a['requested']}` | `{a['plan']}` | {100 * a['accuracy']:.2f} | {a['loss_pt']:.2f} | "
                     f"{a['params']:,} | {a['flops'] / 1e6:.1f} |")
    lines += ["", f"Fast evaluation path vs. the compressed model's own forward pass: max logit difference "
              f"{r['fast_path_max_logit_diff']:.2e}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
