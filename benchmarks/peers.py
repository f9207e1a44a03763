"""The graph cleaner against its peers, onnxslim and onnx-simplifier, on the same raw exports.

    python benchmarks/peers.py                                   # every model, final settings
    python benchmarks/peers.py --models fmnist-deit-tiny --rounds 2 --iterations 5   # quick look
    python benchmarks/peers.py --no-latency                      # node counts only (a busy machine)

For each model: one raw export (``edge export``: opset 17, legacy exporter, explicit attention),
then the three cleaners on copies of that same file: ours (``edge clean``'s passes),
``onnxslim.slim`` and ``onnxsim.simplify`` (default settings). For every graph: node count
(all nodes, and Constant nodes apart), an op-type histogram, onnx.checker, the opset, and the
largest difference from the raw graph in ONNX Runtime on seeded random inputs.

Latency: ONNX Runtime (CPU, all graph optimisations, fixed intra-op threads), all graphs of one
model measured side by side in the same process, interleaved: after a warm-up of each, every
round runs ``--iterations`` timed calls of each graph, in a seeded random order each round, so drift
(thermal, other load) hits all graphs alike. Median, p90 and CV per graph. An A/A control,
``edge-copy`` (a byte-identical copy of our graph, its session created at another point), is
timed with them: its difference from ``edge`` is the resolution of the comparison.

timm initialises every bias to zero, which would let any cleaner delete the bias Adds as
no-ops; pretrained checkpoints have non-zero biases. So the random-weight timm models get
seeded N(0, 0.02) biases wherever timm left a bias all zero (``--zero-biases`` keeps timm's).

Writes benchmarks/results/peers.json and docs/results/peers.md.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from _results import provenance, write_results  # benchmarks/ is on sys.path: run as python benchmarks/NAME.py

from edge.check.compare import Tolerance, compare_arrays, ort_session, run_ort
from edge.compress import CompressConfig, compress
from edge.export import ExportConfig, export
from edge.graph import clean_graph
from edge.models import create_model, data_config
from edge.profile import OrtBackend, latency_stats, sidebyside
from edge.profile.backends import Backend
from edge.profile.contention import CpuContention
from edge.progress import log

ROOT = Path(__file__).resolve().parents[1]
CLEANERS = ("edge", "onnxslim", "onnxsim")


@dataclass(frozen=True)
class Case:
    name: str
    spec: str
    img_size: int | None = None
    plan: str | None = None


CASES = (
    Case("fmnist-deit-tiny", "fmnist-deit-tiny"),
    Case("fmnist-deit-tiny linear:9-10", "fmnist-deit-tiny", plan="linear:9-10"),
    Case("fmnist-deit-tiny linear:8-9,linear:9-10", "fmnist-deit-tiny", plan="linear:8-9,linear:9-10"),
    Case("deit_small_patch16_224", "timm:deit_small_patch16_224", 224),
    Case("vit_base_patch16_224", "timm:vit_base_patch16_224", 224),
    Case("deit3_small_patch16_224", "timm:deit3_small_patch16_224", 224),
    Case("vit_small_patch14_dinov2 @224", "timm:vit_small_patch14_dinov2", 224),
)


@torch.no_grad()
def fill_zero_biases(model: torch.nn.Module, seed: int, std: float = 0.02) -> int:
    """Give every all-zero bias seeded N(0, std) values (timm's init leaves them zero); returns how many."""
    generator = torch.Generator().manual_seed(seed)
    filled = 0
    for name, parameter in model.named_parameters():
        if name.endswith("bias") and not parameter.any():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
            filled += 1
    return filled


def build_model(case: Case, args) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(args.seed)
    model = create_model(case.spec, img_size=case.img_size)
    info = {"spec": case.spec, "img_size": case.img_size, "plan": case.plan, "weights": "bundled"}
    if case.spec.startswith("timm:"):
        info["weights"] = f"random (torch seed {args.seed})"
        if not args.zero_biases:
            info["filled_zero_biases"] = fill_zero_biases(model, args.seed)
    if case.plan:
        model, manifest = compress(model, {"model": case.spec},
                                   CompressConfig(plan=case.plan, data=args.data, samples=args.samples, seed=args.seed))
        info["calibration"] = manifest["calibration"]
    return model, info


def run_onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim

    return onnxslim.slim(model)


def run_onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim's own check failed")
    return simplified


def run_edge(model: onnx.ModelProto) -> onnx.ModelProto:
    return clean_graph(model)[0]


RUNNERS = {"edge": run_edge, "onnxslim": run_onnxslim, "onnxsim": run_onnxsim}


def ort_optimized_ops(proto: onnx.ModelProto) -> dict[str, int]:
    """Op histogram of the graph ONNX Runtime runs after its own fusions (ORT_ENABLE_EXTENDED, CPU)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edge-ort-") as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    return dict(sorted(collections.Counter(n.op_type for n in optimized.graph.node).items()))


def describe_graph(proto: onnx.ModelProto, reference: np.ndarray, probe: np.ndarray) -> dict:
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    try:
        onnx.checker.check_model(proto, full_check=True)
        checker = "pass"
    except onnx.checker.ValidationError as e:
        checker = f"fail: {str(e)[:200]}"
    output = run_ort(ort_session(proto.SerializeToString()), probe)
    diff = compare_arrays(reference, output, Tolerance(), "random")
    return {"nodes": len(proto.graph.node), "constant_nodes": ops.get("Constant", 0),
            "compute_nodes": len(proto.graph.node) - ops.get("Constant", 0),
            "initializers": len(proto.graph.initializer),
            "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
            "checker": checker, "max_abs_vs_raw": diff.max_abs, "rel_l2_vs_raw": diff.rel_l2,
            "within_tolerance": diff.passed, "ops": dict(sorted(ops.items())), "ort_ops": ort_optimized_ops(proto)}


def interleave(factories: dict[str, Callable[[], Backend]], *, warmup: int, rounds: int, iterations: int,
               sessions: int = 1) -> dict[str, dict]:
    """Latency of several backends side by side (:func:`edge.profile.sidebyside.interleave`: rounds of
    ``iterations`` calls of each, the order shuffled (seeded); ``sessions`` sets created afresh in rotated order).

    Returns name -> latency statistics (ms) with each round's median and the session set of each round.
    """
    timed = sidebyside.interleave(factories, sidebyside.SideBySideConfig(warmup=warmup, rounds=rounds,
                                                                         sessions=sessions, iterations=iterations))
    return {name: {**latency_stats(latencies, timed["describe"][name]["batch"]),
                   "batch": timed["describe"][name]["batch"], "round_medians_ms": timed["round_medians"][name],
                   "round_sets": timed["round_sets"], "session_sets": sessions}
            for name, latencies in timed["latencies"].items()}


def measure_interleaved(paths: dict[str, Path], *, threads: int, warmup: int, rounds: int, iterations: int,
                        batch: int | None = None, sessions: int = 1) -> dict[str, dict]:
    """:func:`interleave` over ONNX Runtime sessions of the graphs at ``paths``."""
    factories = {name: functools.partial(OrtBackend, path, batch=batch, threads=threads)
                 for name, path in paths.items()}
    return interleave(factories, warmup=warmup, rounds=rounds, iterations=iterations, sessions=sessions)


def measure_case(case: Case, args, work: Path) -> dict:
    started = time.perf_counter()
    model, info = build_model(case, args)
    raw_path = work / "raw.onnx"
    export(model, raw_path, source=case.spec, plan=case.plan, data_config=data_config(model),
           config=ExportConfig(verify=True))
    raw = onnx.load(str(raw_path))
    dims = [d.dim_value for d in raw.graph.input[0].type.tensor_type.shape.dim]
    probe = np.random.default_rng(args.seed).standard_normal(dims).astype(np.float32)
    reference = run_ort(ort_session(raw.SerializeToString()), probe)
    graphs = {"raw": describe_graph(raw, reference, probe)}
    paths = {"raw": raw_path}
    for name in CLEANERS:
        t0 = time.perf_counter()
        cleaned = RUNNERS[name](copy.deepcopy(raw))
        seconds = time.perf_counter() - t0
        graphs[name] = {**describe_graph(cleaned, reference, probe), "clean_seconds": round(seconds, 2)}
        paths[name] = work / f"{name}.onnx"
        onnx.save(cleaned, str(paths[name]))
        log(f"{case.name}: {name} {graphs[name]['nodes']} nodes ({seconds:.1f} s)")
    del model
    peers_min = min(graphs[p]["nodes"] for p in ("onnxslim", "onnxsim"))
    verdict = {
        "nodes_le_onnxslim": graphs["edge"]["nodes"] <= graphs["onnxslim"]["nodes"],
        "nodes_le_best_peer": graphs["edge"]["nodes"] <= peers_min,
    }
    log(f"{case.name}: nodes raw/edge/onnxslim/onnxsim = "
        + "/".join(str(graphs[n]["nodes"]) for n in ("raw", *CLEANERS)))
    if not args.no_latency:
        paths["edge-copy"] = work / "edge-copy.onnx"
        paths["edge-copy"].write_bytes(paths["edge"].read_bytes())
        order = ["edge-copy", "onnxsim", "raw", "onnxslim", "edge"]  # sessions created in this order
        latency = measure_interleaved({n: paths[n] for n in order}, threads=args.threads, warmup=args.warmup,
                                      rounds=args.rounds, iterations=args.iterations, sessions=args.sessions)
        graphs["edge-copy"] = {"copy_of": "edge"}
        for name, stats in latency.items():
            graphs[name]["latency"] = stats
        best_name = min(CLEANERS, key=lambda n: latency[n]["median_ms"])
        best = latency[best_name]["median_ms"]
        verdict["best_cleaner"] = best_name
        verdict["latency_vs_best_cleaner"] = latency["edge"]["median_ms"] / best - 1.0
        verdict["latency_within_2pct"] = latency["edge"]["median_ms"] <= 1.02 * best
        # paired per round: the rounds see the same machine state, so their ratio is less noisy than
        # the ratio of medians pooled over the whole run
        ratios = np.array(latency["edge"]["round_medians_ms"]) / np.array(latency[best_name]["round_medians_ms"])
        verdict["per_round_vs_best"] = {"median": float(np.median(ratios) - 1.0),
                                        "quartiles": [float(np.quantile(ratios, q) - 1.0) for q in (0.25, 0.75)]}
        verdict["aa_control"] = latency["edge-copy"]["median_ms"] / latency["edge"]["median_ms"] - 1.0
        verdict["aa_interval"] = sidebyside.speedup_interval(  # edge / edge-copy per round, seeded bootstrap
            latency["edge"]["round_medians_ms"], latency["edge-copy"]["round_medians_ms"],
            latency["edge"]["round_sets"], seed=args.seed)
        log(f"{case.name}: median ms raw/edge/onnxslim/onnxsim = "
            + "/".join(f"{latency[n]['median_ms']:.3f}" for n in ("raw", *CLEANERS)))
    return {"model": case.name, **info, "input_shape": dims, "graphs": graphs, "verdict": verdict,
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", help=f"subset of: {', '.join(repr(c.name) for c in CASES)}")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (fixed, recorded)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls of each graph before timing")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--sessions", type=int, default=5,
                        help="session sets, created afresh in rotated order (rounds are split between them)")
    parser.add_argument("--iterations", type=int, default=20, help="timed calls of each graph per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default="fmnist-mini", help="calibration data of the approximated models")
    parser.add_argument("--samples", type=int, default=200, help="calibration samples of the approximated models")
    parser.add_argument("--zero-biases", action="store_true", help="keep timm's all-zero bias init")
    parser.add_argument("--no-latency", action="store_true", help="node counts and equivalence only")
    parser.add_argument("--json-out", default=str(ROOT / "benchmarks/results/peers.json"))
    parser.add_argument("--md-out", default=str(ROOT / "docs/results/peers.md"))
    args = parser.parse_args()
    cases = [c for c in CASES if not args.models or c.name in args.models]
    unknown = set(args.models or ()) - {c.name for c in cases}
    if unknown:
        parser.error(f"unknown model {sorted(unknown)[0]!r}; choose from {[c.name for c in CASES]}")
    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    rows = []
    with CpuContention() as contention:  # other processes' CPU share over the whole run
        for case in cases:
            with tempfile.TemporaryDirectory(prefix="edge-peers-") as tmp:
                rows.append(measure_case(case, args, Path(tmp)))
    record = {
        "models": rows,
        "settings": {"threads": args.threads, "warmup": args.warmup, "rounds": args.rounds,
                     "iterations_per_round": args.iterations, "timed_iterations": args.rounds * args.iterations,
                     "order": "interleaved, shuffled each round (seeded)", "session_sets": args.sessions,
                     "creation_order": "rotated between session sets", "seed": args.seed,
                     "ort_optimization": "ORT_ENABLE_ALL", "provider": "CPUExecutionProvider",
                     "zero_biases_filled": not args.zero_biases, "latency_measured": not args.no_latency},
        "contention": contention.result(),
        **provenance("peers.py", args, parser, started=started, load_before=load_before,
                     skip=("json_out", "md_out")),
    }
    write_results(record, args.json_out, args.md_out, markdown)


def markdown(r: dict) -> str:
    s, v, hw = r["settings"], r["versions"], r["hardware"]
    lines = [
        "# Graph cleaner vs. onnxslim and onnx-simplifier",
        "",
        f"Generated by `{r['command']}` ({r['seconds'] / 60:.1f} min). Hardware: {hw['cpu']} "
        f"({hw['cpu_count']} logical CPUs), load average before/after "
        f"{r['load_average']['before'][0]:.2f} / {r['load_average']['after'][0]:.2f}. "
        f"ONNX Runtime {v['onnxruntime']} (CPU, {s['ort_optimization']}), {s['threads']} intra-op threads, batch 1, "
        f"fp32. Versions: edge {v['edge']}, onnxslim {v['onnxslim']}, onnxsim {v['onnxsim']}, onnx {v['onnx']}, "
        f"onnx-graphsurgeon {v['onnx_graphsurgeon']}, torch {v['torch']}.",
        "",
        (f"Latency: {s['warmup']} warm-up calls per graph, then {s['rounds']} rounds x {s['iterations_per_round']} "
         f"timed calls of each graph ({s['timed_iterations']} per graph), interleaved in a seeded random order each "
         f"round, in {s.get('session_sets', 1)} session set(s) created afresh in rotated order; median, p90 and "
         "coefficient of variation (CV) in ms per inference."
         if s["latency_measured"] else "**Latency not measured in this run** (`--no-latency`): node counts, "
         "equivalence and ONNX Runtime's optimised graphs only.")
        + " All four graphs of a model come from one raw export. `max abs` is the largest output difference from "
        "the raw graph on seeded random inputs (tolerance 1e-4). `ORT nodes`: nodes of the graph ONNX Runtime "
        "actually runs after its own fusions (ORT_ENABLE_EXTENDED).",
        "",
    ]
    other = r["contention"]["other_cpu_share"]
    if other is not None:
        lines += [f"Other processes used {100 * other:.1f} % of the {hw['cpu_count']} CPUs during the run "
                  "(/proc/stat busy time minus this process's own CPU time).", ""]
    if r["contention"]["busy"] and s["latency_measured"]:
        lines += [f"**Warning: the machine was busy (other processes: {100 * other:.1f} % of the CPUs); these "
                  "latencies are not valid figures.**", ""]
    if s["zero_biases_filled"]:
        lines += ["timm models have random weights; biases timm initialises to zero were given seeded N(0, 0.02) "
                  "values (pretrained checkpoints have non-zero biases; zero ones would be removed as no-ops).", ""]
    lines += ["| model | graph | nodes (Constant) | ORT nodes | max abs vs raw | checker | median ms | p90 ms | CV |",
              "|---|---|---|---|---|---|---|---|---|"]
    for m in r["models"]:
        for name in ("raw", *CLEANERS):
            g = m["graphs"][name]
            lat = g.get("latency")
            timing = (f"{lat['median_ms']:.3f} | {lat['p90_ms']:.3f} | {100 * lat['cv']:.1f} %" if lat
                      else "not measured | | ")
            lines.append(f"| {m['model'] if name == 'raw' else ''} | {name} | {g['nodes']} ({g['constant_nodes']}) | "
                         f"{sum(g['ort_ops'].values())} | {g['max_abs_vs_raw']:.1e} | {g['checker']} | {timing} |")
    lines += ["", "## Verdict", "",
              "`edge median vs best cleaner`: edge's median over all timed calls against the fastest of the "
              "three cleaners' medians. `per round`: the same ratio from each round's medians (the rounds are "
              "interleaved, so each pair saw the same machine state): median and quartiles over rounds.", "",
              "`A/A`: the byte-identical copy of our graph against our graph, timed the same way: differences "
              "of that size are the benchmark's resolution, not the graphs'.", "",
              "| model | edge nodes <= onnxslim | <= best peer | fastest cleaner | edge median vs best cleaner | "
              "per round: median [quartiles] | A/A |", "|---|---|---|---|---|---|---|"]
    for m in r["models"]:
        d = m["verdict"]
        timing = (f"{100 * d['latency_vs_best_cleaner']:+.1f} % "
                  f"({'within' if d['latency_within_2pct'] else '**outside**'} 2 %)"
                  if "latency_vs_best_cleaner" in d else "not measured")
        paired = d.get("per_round_vs_best")
        aa = f"{100 * d['aa_control']:+.1f} %" if "aa_control" in d else ""
        per_round = (f"{100 * paired['median']:+.1f} % [{100 * paired['quartiles'][0]:+.1f}, "
                     f"{100 * paired['quartiles'][1]:+.1f}]" if paired else "")
        lines.append(f"| {m['model']} | {'yes' if d['nodes_le_onnxslim'] else '**no**'} | "
                     f"{'yes' if d['nodes_le_best_peer'] else '**no**'} | {d.get('best_cleaner', '')} | {timing} | "
                     f"{per_round} | {aa} |")
    lines += ["", "## Op types where the graphs differ (raw/edge/onnxslim/onnxsim)", ""]
    for m in r["models"]:
        for key, label in (("ops", "as written"), ("ort_ops", "as ONNX Runtime runs them")):
            hists = {n: m["graphs"][n][key] for n in ("raw", *CLEANERS)}
            ops = sorted(op for op in set().union(*hists.values())
                         if len({hists[n].get(op, 0) for n in CLEANERS}) > 1)
            lines += [f"- **{m['model']}**, {label}: " + ("; ".join(
                f"{op} " + "/".join(str(hists[n].get(op, 0)) for n in ("raw", *CLEANERS)) for op in ops)
                or "identical")]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
