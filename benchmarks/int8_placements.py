"""Every INT8 Q/DQ placement on the reference model and on the outlier model, full test split (issue 30).

    python benchmarks/int8_placements.py  # -> benchmarks/results/int8_placements.json, docs/results/int8-placements.md
    python benchmarks/int8_placements.py --render   # the markdown again from the JSON
    python benchmarks/int8_placements.py --models fmnist-deit-tiny-outliers --merge   # one model, the other's kept

For ``fmnist-deit-tiny`` (the reference) and ``fmnist-deit-tiny-outliers`` (massive residual
channels, high-norm tokens, post-LayerNorm channel spread: docs/outlier-model.md), each exported
with a static batch of 100 and cleaned as docs/export.md says (``python -m edge export``, ``python
-m edge clean``), and from that one cleaned graph:

* float32 (the cleaned graph) and ``edge quantize --precision fp16`` (its range check on 500 training
  images, as the CLI does);
* ``edge quantize --precision int8`` with each placement (``linear``, ``linear-sq``, ``modelopt``,
  ``skip``; :mod:`calib.placement`), min-max calibration on 500 class-balanced training images
  (seed 0), the unquantized rest float16; plus the calibration methods of ``--methods`` for the
  placements of ``--method-placements``;
* ``modelopt`` with the older DQ form (a float32-output DQ before each LayerNorm,
  ``Fp16Config(dq_output_fp16=False)``): structure only, its accuracy is the default form's within
  float16 rounding.

For every graph: accuracy and top-1 agreement with float32 on all 10,000 Fashion-MNIST test images
(ONNX Runtime CPU, ``--threads``), and a census: where the DQ outputs are read (weight GEMM
activation / weight, attention MatMul, residual Add skip / branch, LayerNorm, head, through a Cast
or not), how many DQ write float32 (what TensorRT 10.16 on SM 8.7 fails to compile from int8,
NVIDIA/TensorRT#4832) and how many of those feed a LayerNorm, the attention blocks in the shape
TensorRT fuses (``edge check``'s attention-fusion note) and ``edge check``'s errors for TensorRT 10.3
and 10.16. ONNX Runtime CPU computes float16 ops it has no float16 kernel for in float32 between
float16 tensors: the figures are what the graph's roundings cost, not TensorRT's kernels; TensorRT
cannot run here (no TensorRT, no GPU) and no figure comes from a Jetson.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _graph_logits import logits_of, test_split  # benchmarks/ is on sys.path: python benchmarks/NAME.py

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("fmnist-deit-tiny", "fmnist-deit-tiny-outliers")
PLACEMENTS = ("linear", "linear-sq", "modelopt", "skip")
SAMPLES, SEED, BATCH = 500, 0, 100
JSON_OUT = ROOT / "benchmarks" / "results" / "int8_placements.json"
MD_OUT = ROOT / "docs" / "results" / "int8-placements.md"


def edge_cli(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "edge", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(f"edge {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def cleaned_graph(model: str, folder: Path, fresh: bool) -> Path:
    """``edge export MODEL --batch 100`` then ``edge clean``: the one float32 graph every variant comes from."""
    raw, clean = folder / f"{model}.onnx", folder / f"{model}.clean.onnx"
    if clean.is_file() and not fresh:  # edge export and clean are deterministic: the same bytes again
        return clean
    # --no-verify: edge export checks a static batch other than 8 with 8 images and fails (as
    # benchmarks/quant_peers.py notes); edge clean still checks the cleaned graph against the export
    edge_cli("export", model, "--batch", str(BATCH), "--no-verify", "--out", str(raw))
    edge_cli("clean", str(raw), "--out", str(clean))
    return clean


def variants(methods: list[str], method_placements: list[str]) -> dict[str, tuple]:
    """Graph name -> (precision, Fp16Config or None, Int8Config fields or None, accuracy measured)."""
    from edge.precision.fp16 import Fp16Config

    found: dict[str, tuple] = {"fp16": ("fp16", None, None, True)}
    for placement in PLACEMENTS:
        found[f"int8 {placement}"] = ("int8", None, {"placement": placement, "method": "minmax"}, True)
    for method in methods:
        for placement in method_placements:
            found[f"int8 {placement} ({method})"] = ("int8", None, {"placement": placement, "method": method}, True)
    found["int8 modelopt, DQ fp32 form"] = ("int8", Fp16Config(dq_output_fp16=False),
                                            {"placement": "modelopt", "method": "minmax"}, False)
    return found


def make_graph(clean: Path, out: Path, spec: tuple, cache: Path) -> dict:
    from edge.precision.fp16_ranges import RangeCheck
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file

    precision, fp16, int8, _ = spec
    if precision == "fp16":
        report = quantize_file(clean, out, "fp16", ranges=RangeCheck(data="fmnist", samples=SAMPLES, seed=SEED))
        return {"range_check_kept": [k["node"] for k in report["range_check"]["kept"]]}
    config = Int8Config(data="fmnist", samples=SAMPLES, seed=SEED, cache_dir=str(cache), **int8)
    report = quantize_file(clean, out, "int8", fp16=fp16, int8=config)
    rest = report.get("float16_rest", {})
    return {"quantized_nodes": report["quantized_nodes"], "calibration_seconds": report["calibration"]["seconds"],
            "qdq_scales_fp32": rest.get("qdq_scales_fp32", []),
            "smoothquant": [{k: s[k] for k in ("layernorm", "channel_spread_before", "channel_spread_after")}
                            for s in report.get("smoothquant", {}).get("smoothed", [])]}


def logits_worker(path: str, clean: str, threads: int) -> str:
    """In a child process: the logits of ``path`` on the test split, saved beside it (:func:`logits_of`)."""
    sys.path.insert(0, str(ROOT))
    x, _ = test_split(Path(clean))
    logits_of(Path(path), x, threads, BATCH, spinning=False)
    return path


def all_logits(paths: list[Path], clean: Path, args: argparse.Namespace) -> None:
    """The logits of every graph of ``paths``, ``--workers`` single-graph processes at a time."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from edge.progress import log

    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in pool.map(logits_worker, [str(p) for p in paths], [str(clean)] * len(paths),
                             [args.threads] * len(paths)):
            log(f"logits of {Path(done).name}")


def _role(node, index: int, head: set, residual: dict, source: str, weight: bool, weighted: bool) -> str:
    if node.name in head:
        return "head"
    if node.op_type in ("MatMul", "Gemm", "Conv"):
        if not weighted:
            return "attention MatMul"
        return "GEMM weight" if weight else "GEMM activation"
    if node.op_type == "Add" and node.name in residual:
        return "Add skip" if residual[node.name] == source else "Add branch"
    if node.op_type == "LayerNormalization":
        return "LayerNorm"
    return f"other ({node.op_type} input {index})"


def census(path: Path) -> dict:
    """Where DQ outputs are read (looking through Casts), float32-output DQs, attention fusion, TensorRT rules."""
    import onnx

    from calib.placement import _float_view, _producers, _readers_through_casts, _reads_weight, residual_adds
    from edge.check.tensorrt_rules import check_model, errors
    from edge.precision.fp16 import float32_output_dqs, head_nodes

    model = onnx.load(str(path))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = _producers(graph)
    readers: dict = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    float_graph = _float_view(model)
    residual, head = residual_adds(float_graph), head_nodes(float_graph)
    roles: collections.Counter = collections.Counter()
    through_cast: collections.Counter = collections.Counter()
    fp32_dqs = set(float32_output_dqs(model))
    fp32_dq_readers: collections.Counter = collections.Counter()
    for dq in (n for n in graph.node if n.op_type == "DequantizeLinear"):
        q = producers.get(dq.input[0])
        weight = dq.input[0] in inits
        source = q.input[0] if q is not None and q.op_type == "QuantizeLinear" else dq.input[0]
        for tensor, reader in _readers_through_casts(dq.output[0], readers):
            role = _role(reader, list(reader.input).index(tensor), head, residual, source, weight,
                         _reads_weight(reader, inits, producers))
            roles[role] += 1
            through_cast[role] += tensor != dq.output[0]
            if dq.name in fp32_dqs:
                fp32_dq_readers[reader.op_type] += 1
    findings = {version: check_model(model, version) for version in ("10.3", "10.16")}
    fusion = [f for f in findings["10.3"] if f.rule == "attention-fusion"]
    ops = collections.Counter(n.op_type for n in graph.node)
    return {"nodes": len(graph.node), "quantize": ops["QuantizeLinear"], "dequantize": ops["DequantizeLinear"],
            "cast": ops["Cast"], "dq_inputs": dict(sorted(roles.items())),
            "dq_inputs_through_cast": {k: v for k, v in sorted(through_cast.items()) if v},
            "dq_float32_output": len(fp32_dqs), "dq_float32_output_readers": dict(sorted(fp32_dq_readers.items())),
            "attention_fusable": sum("fuses" in f.what for f in fusion), "attention_blocks": len(fusion),
            "trt_errors": {v: len(errors(f)) for v, f in findings.items()}}


def measure_model(model: str, folder: Path, args: argparse.Namespace) -> dict:
    import numpy as np

    from edge.progress import log

    log(f"{model}: export and clean")
    clean = cleaned_graph(model, folder, args.fresh)
    x, labels = test_split(clean)
    graphs: dict = {}
    reference = logits_of(clean, x, args.threads, BATCH, spinning=False)
    graphs["fp32"] = {"path": clean, "measured": True, "sha256": hashlib.sha256(clean.read_bytes()).hexdigest()}
    for i, (name, spec) in enumerate(variants(args.methods, args.method_placements).items()):
        log(f"{model}: {name}")
        out = folder / f"{model}.{i}.onnx"
        graphs[name] = {"path": out, "measured": spec[3], **make_graph(clean, out, spec, folder / "calibration")}
    all_logits([g["path"] for name, g in graphs.items() if g["measured"] and name != "fp32"], clean, args)
    for name, graph in graphs.items():
        graph.update(census(graph["path"]))
        if graph["measured"]:
            log(f"{model}: accuracy of {name}")
            logits = reference if name == "fp32" else logits_of(graph["path"], x, args.threads, BATCH, spinning=False)
            graph["accuracy"] = float((logits.argmax(-1) == labels).mean())
            graph["top1_agreement_fp32"] = float((logits.argmax(-1) == reference.argmax(-1)).mean())
            graph["max_abs_vs_fp32"] = float(np.abs(logits - reference).max())
        graph["path"] = str(Path(graph["path"]).relative_to(ROOT))
    return graphs


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="bundled models to measure")
    parser.add_argument("--methods", nargs="*", default=[], help="other calibration methods to measure")
    parser.add_argument("--method-placements", nargs="*", default=["linear", "modelopt"],
                        help="the placements measured with --methods")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads per graph")
    parser.add_argument("--workers", type=int, default=2, help="graphs evaluated at once (one process each)")
    parser.add_argument("--fresh", action="store_true", help="export and clean again even if the cleaned graph exists")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other models' figures of the JSON (one process per model)")
    parser.add_argument("--render", action="store_true", help="rewrite the markdown from the JSON of the last run")
    args = parser.parse_args()
    from _results import provenance, read_results, write_results

    if args.render:
        write_results(read_results(parser, JSON_OUT), JSON_OUT, MD_OUT, markdown)
        return
    started, load_before = time.perf_counter(), os.getloadavg()
    folder = ROOT / "runs" / "int8-placements"
    folder.mkdir(parents=True, exist_ok=True)
    models = {m: measure_model(m, folder, args) for m in args.models}
    previous = json.loads(JSON_OUT.read_text()) if args.merge and JSON_OUT.is_file() else None
    if previous:
        models = {**{m: g for m, g in previous["models"].items() if m not in models}, **models}
        models = {m: models[m] for m in sorted(models, key=lambda m: MODELS.index(m) if m in MODELS else 99)}
    record = {"models": models, "test_images": 10000,
              "calibration": {"data": "fmnist train", "samples": SAMPLES, "seed": SEED}, "threads": args.threads,
              "workers": args.workers,
              "backend": "onnxruntime CPU (CPUExecutionProvider)",
              **provenance("int8_placements.py", args, parser, started=started, load_before=load_before)}
    # --merge: every run whose figures the record holds (one process per model runs at once)
    record["commands"] = [*(previous.get("commands", [previous["command"]]) if previous else []), record["command"]]
    write_results(record, JSON_OUT, MD_OUT, markdown)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def markdown(r: dict) -> str:
    hw, v = r["hardware"], r["versions"]
    models = list(r["models"])
    names = list(dict.fromkeys(n for m in models for n in r["models"][m]))
    lines = ["# INT8 placements on the reference model and on the outlier model", "",
             "Generated by " + " and ".join(f"`{c}`" for c in r.get("commands", [r["command"]]))
             + f" (the last {r['seconds'] / 60:.1f} min) on {hw['cpu']} ({hw['cpu_count']} logical "
             f"CPUs, shared with other work: accuracy only, no timing). edge {v['edge']}, onnx {v.get('onnx')}, "
             f"onnxruntime {v.get('onnxruntime')}, torch {v.get('torch')}; {r['backend']}, {r['threads']} "
             f"thread(s) per graph, {r.get('workers', 1)} graph(s) at once, "
             f"batch {BATCH}. Each model exported with `python -m edge export MODEL --batch {BATCH}` and cleaned "
             f"with `python -m edge clean`; every graph below comes from that cleaned graph. INT8: "
             f"{r['calibration']['samples']} class-balanced {r['calibration']['data']} images (seed "
             f"{r['calibration']['seed']}), min-max unless named, everything outside the Q/DQ pairs float16 "
             f"(TensorRT INT8+FP16). Accuracy on all {r['test_images']:,} Fashion-MNIST test images. ONNX Runtime "
             "CPU computes float16 ops without a CPU kernel in float32 between float16 tensors: the figures are the "
             "cost of the graph's roundings, not of TensorRT's kernels. No figure here comes from a Jetson or "
             "from TensorRT.", "",
             "## Accuracy (top-1 agreement with float32)", "",
             "| graph | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for name in names:
        cells = []
        for m in models:
            g = r["models"][m].get(name)
            if g is None or "accuracy" not in g:
                cells.append("structure only")
                continue
            change = 100 * (g["accuracy"] - r["models"][m]["fp32"]["accuracy"]) + 0.0  # + 0.0: no "-0.00"
            cells.append(f"{_pct(g['accuracy'])} ({_pct(g['top1_agreement_fp32'])}; {change:+.2f} pt)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Q/DQ census", "",
              "Inputs that read a DequantizeLinear (directly or through a Cast), by role: `GEMM activation` / "
              "`GEMM weight`: the inputs of a MatMul/Gemm/Conv with a constant weight outside the head; `attention "
              "MatMul`: a MatMul of two activations; `Add skip` / `Add branch`: the residual-stream / GEMM-branch "
              "input of a residual Add; `LayerNorm`; `head`: nodes after the last LayerNorm. `DQ fp32 out`: "
              "DequantizeLinear nodes writing float32 (TensorRT 10.16 on SM 8.7 fails to compile them from int8, "
              "NVIDIA/TensorRT#4832), with their readers. `fused attention`: attention blocks in the shape "
              "TensorRT fuses (`edge check`'s information). `TensorRT rule errors`: `edge check --trt 10.3 / 10.16`.",
              ""]
    for m in models:
        graphs = {n: g for n, g in r["models"][m].items() if g["dequantize"]}
        roles = sorted({role for g in graphs.values() for role in g["dq_inputs"]})
        lines += [f"### {m}", "", "| | " + " | ".join(graphs) + " |", "|---|" + "---|" * len(graphs)]
        for role in roles:
            lines.append(f"| {role} | " + " | ".join(
                str(g["dq_inputs"].get(role, 0)) + (f" ({g['dq_inputs_through_cast'][role]} via Cast)"
                                                    if g["dq_inputs_through_cast"].get(role) else "")
                for g in graphs.values()) + " |")
        rows = {"Q / DQ nodes": lambda g: f"{g['quantize']} / {g['dequantize']}", "Casts": lambda g: str(g["cast"]),
                "DQ fp32 out": lambda g: f"{g['dq_float32_output']}" + (
                    " (" + ", ".join(f"{k} {c}" for k, c in g["dq_float32_output_readers"].items()) + ")"
                    if g["dq_float32_output"] else ""),
                "fused attention": lambda g: f"{g['attention_fusable']} / {g['attention_blocks']}",
                "TensorRT rule errors (10.3 / 10.16)":
                    lambda g: f"{g['trt_errors']['10.3']} / {g['trt_errors']['10.16']}"}
        for label, cell in rows.items():
            lines.append(f"| {label} | " + " | ".join(cell(g) for g in graphs.values()) + " |")
        lines.append("")
    lines += ["## The default, from these figures", "", *_reading(r), ""]
    return "\n".join(lines)


#: acceptance (issue 30): the default INT8 within this many points of float32 on each model
LIMITS = {"fmnist-deit-tiny": 0.5, "fmnist-deit-tiny-outliers": 1.0}


def _reading(r: dict) -> list[str]:
    """Which placements meet the acceptance limits on every model measured (the default must)."""
    lines = []
    for placement in PLACEMENTS:
        drops = {m: 100 * (g["fp32"]["accuracy"] - g[f"int8 {placement}"]["accuracy"])
                 for m, g in r["models"].items() if f"int8 {placement}" in g}
        ok = all(d <= LIMITS.get(m, 1.0) for m, d in drops.items())
        lines.append(f"- `{placement}`: " + ", ".join(f"{d:.2f} pt below float32 on {m} (limit {LIMITS.get(m, 1.0)})"
                                                       for m, d in drops.items()) + (": meets" if ok else ": fails"))
    for m, g in r["models"].items():
        smoothed = g.get("int8 linear-sq", {}).get("smoothquant", [])
        if smoothed:
            before = [s["channel_spread_before"] for s in smoothed]
            after = [s["channel_spread_after"] for s in smoothed]
            lines.append(f"- SmoothQuant on {m}: {len(smoothed)} LayerNorm -> qkv/fc1 pairs; the spread of max |x| "
                         f"between the GEMM input's channels {min(before):.1f}-{max(before):.1f}x before, "
                         f"{min(after):.1f}-{max(after):.1f}x after.")
    underflow = sum(len(x.get("qdq_scales_fp32", [])) for g in r["models"].values() for x in g.values())
    lines.append(f"- Q/DQ scales below float16's smallest normal (kept float32): {underflow} in all these graphs.")
    lines.append("- The default is `linear-sq` (Int8Config.placement; docs/precision.md says why). fp16: " + ", ".join(
        f"{100 * (g['fp32']['accuracy'] - g['fp16']['accuracy']):.2f} pt on {m}" for m, g in r["models"].items()
        if "fp16" in g) + " (limit 0.1 on the reference).")
    return lines


if __name__ == "__main__":
    main()
