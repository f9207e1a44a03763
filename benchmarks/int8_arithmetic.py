"""How much an INT8 graph's accuracy on the CPU depends on how ONNX Runtime computes it.

    python benchmarks/int8_arithmetic.py --run runs/pipeline          # every INT8 graph of an edge pipeline run

An INT8 (Q/DQ) graph says what is quantized, not in which order the arithmetic is done. ONNX Runtime's CPU
provider, by default, fuses each DequantizeLinear -> operator -> QuantizeLinear group into integer kernels (its
"QDQ transformers"); with the session setting ``session.disable_quant_qdq = 1`` it runs every Q and DQ as its own
operator and the operators between them in floating point. Both compute what the graph means, up to rounding;
TensorRT on the device computes it a third way. A value that lands near a quantizer's rounding boundary can round
the other way, and in a model that amplifies it (a block replaced by a linear map) the prediction can change.
This measures how often: every INT8 graph of a run (``variants/*/int8/model.batched.onnx``) scored both ways on
the same test images (the run's fixed, class-balanced subset), with the predictions that differ, the largest
logit difference and the seconds each took (one pass each: indicative, not a timing). The evaluation is edge's
own (``edge.check.accuracy.evaluate``, the preprocessing recorded in the graph), one-thread sessions.

Writes benchmarks/results/int8_arithmetic.json and docs/results/int8-arithmetic.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import provenance, write_results  # noqa: E402

from edge.check.accuracy import evaluate  # noqa: E402
from edge.check.onnx_classifier import OnnxClassifier  # noqa: E402
from edge.data import InputSpec, balanced_indices, load_dataset  # noqa: E402
from edge.errors import EdgeError  # noqa: E402
from edge.progress import log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"integer kernels (default)": "0", "Q and DQ as operators (session.disable_quant_qdq=1)": "1"}


def score(path: Path, dataset, setting: str) -> dict:
    """The graph's accuracy, predictions and logits on ``dataset`` with ``session.disable_quant_qdq = setting``."""
    graph = OnnxClassifier(path, threads=1, config={"session.disable_quant_qdq": setting})
    logits: list[np.ndarray] = []

    def run(x):
        out = graph(x)
        logits.append(out.numpy())
        return out

    start = time.perf_counter()
    result = evaluate(run, dataset, InputSpec.from_data_config(graph.data_config()), batch_size=64,
                      predictions=True, show_progress=False)
    return {"accuracy": result["accuracy"], "correct": result["correct"], "predictions": result["predictions"],
            "logits": np.concatenate(logits), "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=ROOT / "runs/pipeline", help="an edge pipeline run folder")
    parser.add_argument("--data", default="fmnist", help="the run's data (its test split)")
    parser.add_argument("--images", type=int, default=2000, help="the run's evaluate.subset (balanced, seed --seed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/int8_arithmetic.json"))
    parser.add_argument("--md-out", default=str(ROOT / "docs/results/int8-arithmetic.md"))
    args = parser.parse_args()
    graphs = sorted(args.run.glob("variants/*/int8/model.batched.onnx"))
    if not graphs:
        raise SystemExit(f"int8_arithmetic: no variants/*/int8/model.batched.onnx under {args.run}; expected an "
                         "edge pipeline run with INT8 graphs (precision.precisions: [int8]); run "
                         "`bash scripts/main.sh` or pass --run FOLDER")
    started, load_before = time.perf_counter(), os.getloadavg()
    try:   # a bad --data, too many --images or a graph without edge's preprocessing: the message, not a traceback
        rows = compare_all(graphs, args)
    except EdgeError as e:
        raise SystemExit(f"int8_arithmetic: {e}") from e
    record = {"benchmark": "int8_arithmetic", "run": str(args.run), "data": rows[0]["data"], "threads": 1,
              "provider": "CPUExecutionProvider", "ort_optimization": "ORT_ENABLE_ALL", "rows": rows,
              **provenance("int8_arithmetic.py", args, parser, started=started, load_before=load_before,
                           skip=("out", "md_out"))}
    write_results(record, args.out, args.md_out, markdown)


def compare_all(graphs: list[Path], args: argparse.Namespace) -> list[dict]:
    test = load_dataset(args.data, "test")
    try:
        picked = balanced_indices(test.labels, args.images, args.seed, test.num_classes).sort().values
    except EdgeError as e:   # its own message speaks of calibration samples
        raise SystemExit(f"int8_arithmetic: --images {args.images}: no class-balanced set of that many among the "
                         f"{len(test):,} test images of {args.data}; fix: pass the run's evaluate.subset, at "
                         "most the split") from e
    dataset = test.subset(picked, f"{test.name}[{len(picked)}]")
    rows = []
    for path in graphs:
        variant = path.parents[1].name
        scored = {label: score(path, dataset, setting) for label, setting in SETTINGS.items()}
        first, second = scored.values()
        differ = int((np.array(first["predictions"]) != np.array(second["predictions"])).sum())
        gap = np.abs(first["logits"] - second["logits"]).max(axis=1)
        rows.append({"graph": f"{variant}.int8", "path": str(path.relative_to(args.run)), "data": dataset.name,
                     "images": len(dataset),
                     "settings": {label: {k: s[k] for k in ("accuracy", "correct", "seconds")}
                                  for label, s in scored.items()},
                     "predictions_differ": differ, "largest_logit_difference": float(gap.max()),
                     "median_largest_logit_difference": float(np.median(gap))})
        both = ", ".join(f"{label} {s['accuracy']:.2%} ({s['seconds']} s)" for label, s in scored.items())
        log(f"{variant}.int8: {both}; predictions differ on {differ} of {len(dataset)} images")
    return rows


def markdown(r: dict) -> str:
    hw = r["hardware"]
    labels = list(SETTINGS)
    lines = ["# An INT8 graph's accuracy on the CPU, computed two ways by ONNX Runtime", "",
             f"Generated by `{r['command']}` on `{r['run']}`'s INT8 graphs (dynamic batch). ONNX Runtime "
             f"{r['versions'].get('onnxruntime')} ({r['provider']}, {r['ort_optimization']}, one thread, 64 images "
             f"a call) on {r['data']} (the run's fixed, class-balanced subset). Hardware: {hw.get('cpu')} "
             f"({hw.get('cpu_count')} CPUs). Seconds: one pass each, other work not excluded: indicative only.", "",
             "| graph | " + " | ".join(f"accuracy, {label}" for label in labels)
             + " | predictions that differ | largest logit difference (median over images) |",
             "|---|" + "---|" * (len(labels) + 2)]
    for row in r["rows"]:
        cells = [f"{100 * row['settings'][label]['accuracy']:.2f} % ({row['settings'][label]['seconds']} s)"
                 for label in labels]
        share = row["predictions_differ"] / row["images"]
        lines.append(f"| {row['graph']} | " + " | ".join(cells) + f" | {row['predictions_differ']} of "
                     f"{row['images']:,} ({100 * share:.2f} %) | {row['largest_logit_difference']:.3g} "
                     f"({row['median_largest_logit_difference']:.2g}) |")
    lines += ["", "Both settings compute what the graph means; they differ in the order of the arithmetic and in "
                  "where values are rounded. Where predictions differ, the INT8 accuracy this CPU reports is known "
                  "only to within that many images, beyond its 95 % interval for sampling. TensorRT on the device "
                  "computes it a third way: for an engine, the device's own figure (`edge deploy`) is the one to "
                  "trust."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
