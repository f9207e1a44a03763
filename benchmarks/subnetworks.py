"""Sub-networks of one super-network: WPAC alone vs WPAC + PIAD at 25/50/75/100 % of the MACs.

    # the acceptance run: full test split, PIAD for 3 epochs of the full training set (hours on 2 cores)
    python benchmarks/subnetworks.py
    # a smoke run of the same pipeline (minutes): 5 PIAD steps, 500 held-out images, a short latency run
    python benchmarks/subnetworks.py --max-steps 5 --eval-samples 500 --samples 128 --piad-samples 64 \\
        --batches 1 --rounds 2 --iterations 2 --warmup 2 --sessions 1 --work /tmp/subnetworks \\
        --out /tmp/subnetworks.json --md-out /tmp/subnetworks.md

Two super-networks of the bundled reference model (``fmnist-deit-tiny``), both from the same
WPAC rotation (``--samples`` seeded, class-balanced training images):

* **WPAC alone**: ``edge compress MODEL --plan wpac:macs=1``: the aligned units (16 head dims,
  64 MLP units) ranked once on the calibration images by PIAD's importance (module sensitivity x
  normalised Taylor importance, per MAC), no training;
* **WPAC + PIAD**: ``edge compress MODEL --plan wpac:keep=1`` then ``edge finetune --piad``
  (progressive importance-aware dropout with distillation from the original; ``--piad-target``,
  ``--epochs``, ``--piad-epochs``, ``--piad-samples``).

From each, ``edge compress SUPERNET --plan wpac:macs=F`` cuts the sub-networks at the fractions
``--fractions`` (no data, no training). Accuracy is top-1 on the held-out images (the whole
Fashion-MNIST test split unless ``--eval-samples``) by :func:`edge.check.accuracy.evaluate`; MACs are
half of :mod:`edge.compress.cost`'s FLOPs, attention products included. Latency: every
sub-network and the original exported (static batch) and cleaned as benchmarks/realisation.py
does, all timed side by side with ONNX Runtime (interleaved rounds, rotating order, session sets
created afresh) in a newly spawned process (not the one that trained), with an A/A control (a
byte-identical copy of the original), at ``--batches``:

    realisation = (1 - latency_c / latency_o) / (1 - MACs_c / MACs_o)     (medians; target >= 0.9 at batch 32)

Target (issue 16): at 75 % of the MACs, at most 1.0 pt lost after PIAD (<= 3 epochs).

Resumable: artifacts live under ``--work`` (the PIAD fine-tune continues from its checkpoint;
a run stopped by ``--max-steps`` continues when run again with more steps); accuracy rows already
in ``--out`` with the same settings and the same super-network weights are kept.
Writes benchmarks/results/subnetworks.json and docs/results/subnetworks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import in_fresh_process, provenance, read_results, realisation, write_results  # noqa: E402
from peers import measure_interleaved  # noqa: E402
from realisation import AA, export_clean  # noqa: E402

from edge.check.accuracy import evaluate  # noqa: E402
from edge.compress import CompressConfig, compress, is_artifact, save_artifact  # noqa: E402
from edge.compress.artifact import WEIGHTS, read_manifest  # noqa: E402
from edge.compress.compressor import costs  # noqa: E402
from edge.compress.derive import derive_model  # noqa: E402
from edge.compress.finetune import FinetuneConfig, finetune, held_out_set  # noqa: E402
from edge.compress.load import load_model  # noqa: E402
from edge.data import InputSpec  # noqa: E402
from edge.fileio import sha256_file  # noqa: E402
from edge.models import data_config  # noqa: E402
from edge.profile import sidebyside  # noqa: E402
from edge.profile.contention import CpuContention  # noqa: E402
from edge.progress import log  # noqa: E402
from edge.runtime import resolve_device, set_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
TARGET = {"fraction": 0.75, "max_drop_pt": 1.0, "max_epochs": 3, "realisation": 0.9, "batch": 32}
RUN_ONLY = ("command", "threads", "device", "checkpoint_every", "eval_every_epoch")


def compressed(model_name: str, plan: str, args, folder: Path) -> Path:
    """The artifact of ``plan`` on the calibration images (reused when ``folder`` holds the same one)."""
    config = CompressConfig(plan=plan, data=args.data, samples=args.samples, seed=args.seed)
    if is_artifact(folder):
        manifest = read_manifest(folder)
        if (manifest.get("requested_plan"), manifest.get("config"), manifest["source"].get("model")) == \
                (plan, asdict(config), model_name):
            return folder
    model, manifest = compress(load_model(model_name), {"model": model_name}, config)
    save_artifact(model, folder, manifest)
    log(f"{plan}: {manifest['seconds']:.0f} s")
    return folder


def piad_config(args) -> FinetuneConfig:
    return FinetuneConfig(data=args.data, epochs=args.epochs, steps=args.steps, max_steps=args.max_steps,
                          train_samples=args.train_samples, batch_size=args.batch_size, lr=args.lr,
                          eval_samples=args.eval_samples, eval_every_epoch=False, amp=args.amp, device=args.device,
                          threads=args.threads, checkpoint_every=args.checkpoint_every, seed=args.seed, piad=True,
                          piad_target=args.piad_target, piad_epochs=args.piad_epochs, piad_samples=args.piad_samples,
                          command=[sys.executable, *sys.argv])


def trained(source: Path, config: FinetuneConfig, work: Path) -> tuple[Path, dict]:
    """The PIAD super-network of ``source`` (resumed from its checkpoint; reused when already that far)."""
    recipe = {k: v for k, v in asdict(config).items() if k not in (*RUN_ONLY, "max_steps")}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    out = work / f"piad-{key}"
    if is_artifact(out):
        done = read_manifest(out)["finetune"][-1]
        wanted = min(config.max_steps or done["schedule_steps"], done["schedule_steps"])
        if done["steps"] >= wanted:
            return out, done
    record = finetune(source, out, config)
    return out, record


def accuracy_rows(name: str, supernet: Path, args, held_out, spec: InputSpec, device, original: float,
                  kept: dict) -> list[dict]:
    """One row per fraction: the sub-network cut from ``supernet``, its MACs, widths and held-out accuracy."""
    weights = sha256_file(supernet / WEIGHTS)
    rows = []
    for fraction in args.fractions:
        old = kept.get((name, fraction))
        if old and old.get("supernet_sha256") == weights:
            rows.append(old)
            continue
        started = time.perf_counter()
        model, manifest = derive_model(supernet, f"wpac:macs={fraction}")
        seconds = time.perf_counter() - started
        accuracy = evaluate(model, held_out, spec, device=device, show_progress=False)["accuracy"]
        extracted = manifest["extracted"]
        rows.append({"supernet": name, "fraction": fraction, "supernet_sha256": weights,
                     "macs": manifest["after"]["flops"] // 2, "macs_full": manifest["before"]["flops"] // 2,
                     "macs_share": manifest["after"]["flops"] / manifest["before"]["flops"],
                     "params": manifest["after"]["params"], "drops": extracted["drops"],
                     "within_trained_list": extracted["trained"], "widths": extracted["widths"],
                     "extract_s": round(seconds, 2), "accuracy": accuracy,
                     "drop_pt": round(100 * (original - accuracy), 2)})
        log(f"{name} macs={fraction}: {rows[-1]['macs_share']:.3f} of the MACs, accuracy {accuracy:.4f} "
            f"({rows[-1]['drop_pt']:+.2f} pt lost), cut in {seconds:.1f} s")
    return rows


def latency(variants: dict[str, tuple[torch.nn.Module, int]], args, work: Path) -> list[dict]:
    """Side-by-side ONNX Runtime latency of every variant with the original and an A/A copy, per batch size."""
    out = []
    for batch in args.batches:
        paths, graphs = {}, {}
        for name, (model, _) in variants.items():
            paths[name], graphs[name] = export_clean(model, name.replace(" ", "-").replace("%", "pct"), None, batch,
                                                     work, args.model)
        paths[AA] = paths["original"].with_name(f"aa-{paths['original'].name}")
        paths[AA].write_bytes(paths["original"].read_bytes())
        timed = in_fresh_process(measure_interleaved, paths, threads=args.threads, warmup=args.warmup,
                                 rounds=args.rounds, sessions=args.sessions, iterations=args.iterations)
        flops_o, lat_o = variants["original"][1], timed["original"]
        rows = []
        for name, (_, flops) in variants.items():
            lat = timed[name]
            row = {"variant": name, "flops": flops, "nodes": graphs[name]["nodes"], "latency": lat,
                   "verification_passed": all(r["passed"] for r in graphs[name]["verification"])}
            if name != "original" and flops < flops_o:
                row["realisation"] = realisation(lat["median_ms"], lat_o["median_ms"], flops, flops_o)
                per_round = [realisation(c, o, flops, flops_o)
                             for c, o in zip(lat["round_medians_ms"], lat_o["round_medians_ms"], strict=True)]
                row["realisation_rounds"] = {"median": float(np.median(per_round)), "min": float(np.min(per_round)),
                                             "max": float(np.max(per_round))}
            rows.append(row)
            log(f"batch {batch} {name}: median {lat['median_ms']:.3f} ms"
                + (f", realisation {row['realisation']:.2f}" if "realisation" in row else ""))
        aa = timed[AA]
        control = {"ratio": aa["median_ms"] / lat_o["median_ms"],
                   "interval": sidebyside.speedup_interval(lat_o["round_medians_ms"], aa["round_medians_ms"],
                                                           lat_o["round_sets"], seed=args.seed), "latency": aa}
        log(f"batch {batch} A/A control: copy / original = {control['ratio']:.3f}")
        out.append({"batch": batch, "rows": rows, "aa_control": control})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="fmnist-deit-tiny")
    parser.add_argument("--data", default="fmnist")
    parser.add_argument("--samples", type=int, default=1024, help="calibration images (WPAC, the WPAC-alone ranking)")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--epochs", type=int, default=3, help="PIAD epochs (at most 3 for the target)")
    parser.add_argument("--steps", type=int, help="PIAD schedule length in steps (default: epochs x steps per epoch)")
    parser.add_argument("--max-steps", type=int, help="stop PIAD after this many steps of its schedule")
    parser.add_argument("--train-samples", type=int, help="PIAD on a seeded class-balanced subset")
    parser.add_argument("--piad-target", type=float, default=0.75)
    parser.add_argument("--piad-epochs", type=int, default=2)
    parser.add_argument("--piad-samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=FinetuneConfig.batch_size)
    parser.add_argument("--lr", type=float, default=FinetuneConfig.lr)
    parser.add_argument("--amp", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--eval-samples", type=int, help="held-out images (default: the whole test split)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime threads (recorded)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 32], help="latency batch sizes (none: skip)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "subnetworks")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "subnetworks.json")
    parser.add_argument("--md-out", type=Path, default=ROOT / "docs" / "results" / "subnetworks.md")
    parser.add_argument("--render", action="store_true",
                        help="only write --md-out (and the derived fields of --out) again from --out's figures")
    args = parser.parse_args()
    if args.render:
        result = read_results(parser, args.out)
        result["target"] = target(result["rows"], result["latency"], {"epochs": result["piad_run"]["epochs"]})
        write_results(result, args.out, args.md_out, markdown)
        return
    set_threads(args.threads)
    device = resolve_device(args.device)
    started, load_before = time.perf_counter(), os.getloadavg()
    config = piad_config(args)
    settings = {"model": args.model, "data": args.data, "samples": args.samples, "seed": args.seed,
                "eval_samples": args.eval_samples,
                "piad": {k: v for k, v in asdict(config).items() if k not in RUN_ONLY}}

    held_out = held_out_set(FinetuneConfig(data=args.data, eval_samples=args.eval_samples, seed=args.seed))
    base = load_model(args.model)
    spec = InputSpec.from_data_config(data_config(base))
    original = evaluate(base, held_out, spec, device=device, show_progress=False)["accuracy"]
    log(f"original {args.model}: {original:.4f} on {held_out.name} ({len(held_out)} images)")

    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    same = {k: v for k, v in previous.get("settings", {}).items() if k != "piad"} == \
        {k: v for k, v in settings.items() if k != "piad"}
    kept = {(r["supernet"], r["fraction"]): r for r in previous.get("rows", [])} if same else {}

    args.work.mkdir(parents=True, exist_ok=True)
    wpac = compressed(args.model, "wpac:macs=1", args, args.work / "wpac-ranked")
    full = compressed(args.model, "wpac:keep=1", args, args.work / "wpac-full")
    piad, record = trained(full, config, args.work)
    log(f"PIAD: {record['steps']} of {record['schedule_steps']} steps ({record['epochs']} epochs), "
        f"{record['wall_time_s'] / 60:.1f} min")
    rows = accuracy_rows("WPAC", wpac, args, held_out, spec, device, original, kept)
    rows += accuracy_rows("WPAC+PIAD", piad, args, held_out, spec, device, original, kept)

    batches = []
    if args.batches:
        variants = {"original": (base, costs(base)["flops"])}
        for row in rows:
            supernet = wpac if row["supernet"] == "WPAC" else piad
            model, manifest = derive_model(supernet, f"wpac:macs={row['fraction']}")
            variants[f"{row['supernet']} {int(round(100 * row['fraction']))}%"] = (model, manifest["after"]["flops"])
        with tempfile.TemporaryDirectory(prefix="edge-subnetworks-") as tmp, CpuContention() as contention:
            batches = latency(variants, args, Path(tmp))
        contended = contention.result()
    else:
        contended = None
    piad_record = {k: record.get(k) for k in ("steps", "schedule_steps", "epochs", "wall_time_s", "train_data",
                                              "train_samples", "eval_before", "eval", "stopped")}
    piad_record["phase"] = record.get("phases", {}).get("piad")
    result = {"benchmark": "subnetworks", "settings": settings, "test": held_out.name, "test_images": len(held_out),
              "original_accuracy": original, "piad_run": piad_record, "rows": rows, "latency": batches,
              "latency_settings": {"threads": args.threads, "warmup": args.warmup, "rounds": args.rounds,
                                   "iterations_per_round": args.iterations, "session_sets": args.sessions,
                                   "order": "interleaved, rotating each round", "provider": "CPUExecutionProvider",
                                   "ort_optimization": "ORT_ENABLE_ALL"},
              "contention": contended, "target": target(rows, batches, record),
              **provenance("subnetworks.py", args, parser, started=started, load_before=load_before,
                           skip=("out", "md_out", "work"))}
    write_results(result, args.out, args.md_out, markdown)


def target(rows: list[dict], batches: list[dict], record: dict) -> dict:
    row = next((r for r in rows if r["supernet"] == "WPAC+PIAD" and r["fraction"] == TARGET["fraction"]), None)
    epochs = record.get("epochs") or 0
    out = {**TARGET, "piad_epochs_trained": epochs, "drop_pt": row and row["drop_pt"],
           "drop_met": bool(row and row["drop_pt"] <= TARGET["max_drop_pt"] and epochs <= TARGET["max_epochs"])}
    at = next((b for b in batches if b["batch"] == TARGET["batch"]), None)
    if at:
        values = {r["variant"]: r["realisation"] for r in at["rows"] if "realisation" in r}
        out["realisation_at_batch"] = values
        out["realisation_met"] = bool(values) and min(values.values()) >= TARGET["realisation"]
        out["fixed_cost_fit"] = fixed_cost(at)
    return out


def fixed_cost(batch: dict) -> dict:
    """Least squares over one batch's variants: median latency = fixed + slope x (MACs / original MACs).

    With latency linear in the MACs, a sub-network's realisation is slope / (fixed + slope) at every size:
    the part of the original's latency that scales with the MACs. What width compression cannot shrink
    (work outside the MACs: normalisation, softmax, residual adds, the embedding and head) is ``fixed``."""
    rows = batch["rows"]
    macs = next(r["flops"] for r in rows if r["variant"] == "original")
    share = np.array([r["flops"] / macs for r in rows])
    median = np.array([r["latency"]["median_ms"] for r in rows])
    slope, fixed = np.polyfit(share, median, 1)
    residual = median - (fixed + slope * share)
    return {"batch": batch["batch"], "fixed_ms": float(fixed), "slope_ms": float(slope),
            "fixed_share": float(fixed / (fixed + slope)), "realisation_if_linear": float(slope / (fixed + slope)),
            "max_abs_residual_ms": float(np.abs(residual).max()), "points": len(rows)}


def markdown(r: dict) -> str:
    s, run, hw = r["settings"], r["piad_run"], r["hardware"]
    phase = run.get("phase") or {}
    piad = s["piad"]
    lines = [
        "# Sub-networks of one super-network: WPAC alone vs WPAC + PIAD",
        "",
        f"Generated by `{r['command']}` ({r['seconds'] / 60:.1f} min). Model `{s['model']}`, original accuracy "
        f"**{r['original_accuracy']:.4f}** on {r['test']} ({r['test_images']} images). WPAC on {s['samples']} "
        f"class-balanced `{s['data']}` training images (seed {s['seed']}); WPAC alone: `wpac:macs=1` (units ranked "
        f"once on those images); WPAC + PIAD: `wpac:keep=1` then `edge finetune --piad` for {run['steps']} of "
        f"{run['schedule_steps']} steps ({run['epochs']} epochs of {run['train_data']}, batch "
        f"{piad['batch_size']}, lr {piad['lr']}), dropout list grown to {piad['piad_target']} of the MACs over "
        f"{piad['piad_epochs']} epoch(s), units ranked on {piad['piad_samples']} images, distillation from the "
        f"original ({run['wall_time_s'] / 60:.1f} min). Every sub-network is cut by `edge compress SUPERNET --plan "
        "wpac:macs=F` (no data, no training). MACs count the attention products. "
        f"Hardware: {hw.get('cpu', hw.get('device'))}.",
        "",
        "| super-network | MACs asked | MACs kept | M MACs | params | accuracy | drop (pt) | in the trained list |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        trained = {True: "yes", False: "no", None: "-"}[row["within_trained_list"]]
        lines.append(f"| {row['supernet']} | {100 * row['fraction']:.0f} % | {100 * row['macs_share']:.1f} % | "
                     f"{row['macs'] / 1e6:.1f} | {row['params']:,} | {row['accuracy']:.4f} | {row['drop_pt']:.2f} | "
                     f"{trained} |")
    if phase:
        lines += ["", "PIAD's dropout list: " + "; ".join(
            f"step {g['step']}: {g['listed']} units, {100 * g['listed_macs_saved']:.1f} % of the MACs"
            for g in phase.get("growth", [])) + "."]
    for b in r["latency"]:
        c = b["aa_control"]
        lines += ["", f"## Latency, batch {b['batch']}", "",
                  "| variant | M MACs | nodes | median ms | p90 ms | CV | realisation | per round |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in b["rows"]:
            lat = row["latency"]
            cells = [row["variant"], f"{row['flops'] / 2e6:.1f}", str(row["nodes"]), f"{lat['median_ms']:.3f}",
                     f"{lat['p90_ms']:.3f}", f"{100 * lat['cv']:.1f} %"]
            if "realisation" in row:
                rr = row["realisation_rounds"]
                cells += [f"{row['realisation']:.2f}", f"{rr['median']:.2f} [{rr['min']:.2f}, {rr['max']:.2f}]"]
            else:
                cells += ["", ""]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"A/A control: copy / original = **{c['ratio']:.3f}** (per-round speedup "
                      f"{c['interval']['speedup']:.3f}, 95 % interval [{c['interval']['low']:.3f}, "
                      f"{c['interval']['high']:.3f}])."]
    if r["latency"]:
        ls, load = r["latency_settings"], r["load_average"]
        lines += ["", f"ONNX Runtime {r['versions'].get('onnxruntime')} ({ls['provider']}, {ls['ort_optimization']}), "
                      f"{ls['threads']} threads, fp32, static batch; {ls['warmup']} warm-up calls, {ls['rounds']} "
                      f"rounds x {ls['iterations_per_round']} calls per graph, {ls['order']}, {ls['session_sets']} "
                      f"session set(s); load average before/after {load['before'][0]:.2f} / {load['after'][0]:.2f}"
                      + (f"; other processes used {100 * r['contention']['other_cpu_share']:.1f} % of the CPUs"
                         + (" (**busy: not clean figures**)" if r["contention"]["busy"] else "")
                         if r["contention"] else "") + "."]
    t = r["target"]
    lines += ["", f"Target: at {100 * t['fraction']:.0f} % of the MACs at most {t['max_drop_pt']} pt lost "
                  f"after PIAD (<= {t['max_epochs']} epochs; trained {t['piad_epochs_trained']}): lost "
                  f"{t['drop_pt']} pt: **{'met' if t['drop_met'] else 'not met'}**."]
    if "realisation_met" in t:
        lines.append(f"Realisation >= {t['realisation']} at batch {t['batch']}: "
                     f"**{'met' if t['realisation_met'] else 'not met'}** ("
                     + ", ".join(f"{k} {v:.2f}" for k, v in t["realisation_at_batch"].items()) + ").")
    if "fixed_cost_fit" in t:
        f = t["fixed_cost_fit"]
        bound = f"{f['realisation_if_linear']:.2f}"
        lines += ["", f"Why realisation sits near {bound} at batch {f['batch']}: a straight line through the "
                      f"{f['points']} variants' medians (least squares, latency against the share of the MACs kept) "
                      f"has {f['fixed_ms']:.1f} ms that does not shrink with the MACs and {f['slope_ms']:.1f} ms "
                      f"that does (largest residual {f['max_abs_residual_ms']:.1f} ms). With latency linear in the "
                      f"MACs, every sub-network's realisation is the scaling share, **{bound}**, whatever its size: "
                      f"{100 * f['fixed_share']:.0f} % of the original's time by this fit. ONNX Runtime's profiler "
                      "splits the time by operator: docs/results/op-shares.md (`python benchmarks/op_shares.py`)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
