"""``edge plan MODEL --budget 0.5x --out DIR``: table, search, artifact, timing, distillation, record.

What DIR holds when the verb ends (written whole or not at all):

* ``plan.json``: the budget, the table's target, every round (the move taken, why, the moves it
  was measured against), every measured plan, the Pareto front, the whole-model timings and the
  distillation results, with hardware, threads and versions;
* ``plan.md``: the same for a reader; ``pareto.png``: KL against latency, every measured plan, the
  front, the chosen plan, and the timed plans at their measured latency;
* ``model/``: the chosen plan as a compressed artifact (``edge eval``, ``export``, ``finetune``
  take it); ``finetuned/`` (``--finetune EPOCHS``): it distilled from the original;
* ``latency-table.json``: the table the search used, when it was measured here.

Whole-model timing: the original, a byte-identical copy of it (A/A) and up to ``measure`` plans of
the front (the chosen one first) are exported and timed side by side on ONNX Runtime, when the
table's target is ONNX Runtime on this machine; another target's latency is predicted only.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from torch import nn

from edge.compress import compress, save_artifact
from edge.compress.compressor import apply_plan
from edge.compress.plan import parse_plan
from edge.config import MAX_BATCH, MAX_EPOCHS, MAX_STEPS, MAX_THREADS, option
from edge.errors import EdgeError
from edge.fileio import atomic_folder, write_json_atomic, write_text_atomic
from edge.latency import LatencyTable, Target
from edge.latency.grid import GridConfig
from edge.latency.measure import TimingConfig, measure_table, time_graphs
from edge.latency.table import here
from edge.models.zoo import data_config
from edge.planner.report import markdown, plot
from edge.planner.search import Point, Search, SearchConfig, SearchResult

TABLE_FILE, RECORD_FILE, MODEL_DIR, TUNED_DIR = "latency-table.json", "plan.json", "model", "finetuned"
ESTIMATE_MODE = "MAXN_SUPER"   # --backend estimate: the Orin Nano's power mode unless one is asked (JetPack 6.2's top)


@dataclass(frozen=True)
class TargetConfig:
    """The target the budget is for; a field left None is the table's (or, measured here, the default)."""

    table: str | None = None                  # a latency table file (edge profile / edge deploy --latency-table)
    backend: str | None = None                # onnxruntime | tensorrt
    device: str | None = None
    precision: str | None = None
    batch: int | None = option(None, minimum=1, maximum=MAX_BATCH)
    threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)
    power_mode: str | None = None


@dataclass(frozen=True)
class PlanJobConfig:
    search: SearchConfig
    target: TargetConfig = field(default_factory=TargetConfig)
    iterations: int = option(100, minimum=1, maximum=MAX_STEPS)   # timed calls per graph (table, whole models)
    rounds: int = option(5, minimum=1, maximum=MAX_STEPS)
    measure: int = option(4, minimum=0, maximum=100)   # front plans timed whole (the chosen one first)
    # times the budget is tightened when the chosen plan, timed whole here, misses it (ONNX Runtime here only)
    correct: int = option(2, minimum=0, maximum=10)
    finetune: int | None = option(None, minimum=1, maximum=MAX_EPOCHS)   # epochs of distillation of the chosen plan
    finetune_max_steps: int | None = option(None, minimum=1, maximum=MAX_STEPS)  # a shortened run (smoke tests)
    train_threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)


def wanted_target(asked: TargetConfig, table: LatencyTable | None) -> Target:
    """The target asked for: each field given, else the table's, else ONNX Runtime here, fp32, batch 1, 2 threads."""
    if table is None:
        default = here(asked.batch or 1, asked.threads or 2, asked.precision or "fp32")
        if asked.backend not in (None, default.backend):
            raise EdgeError(f"--backend {asked.backend} without --table",
                            expected="a latency table measured on that backend (edge deploy --latency-table on the "
                                     "device)", fix=f"pass --table FILE, or plan for {default.backend} here")
        return replace(default, device=asked.device or default.device, power_mode=asked.power_mode)
    base = table.target
    return Target(backend=asked.backend or base.backend, device=asked.device or base.device,
                  precision=asked.precision or base.precision, batch=asked.batch or base.batch,
                  threads=asked.threads if asked.threads is not None else base.threads,
                  power_mode=asked.power_mode or base.power_mode)


def estimate_table(model: nn.Module, asked: TargetConfig) -> LatencyTable:
    """The Orin Nano estimator's table (edge.latency.orin) of every part a plan on ``model`` can make
    (the full grid): the target without a table measured on it (``--backend estimate``)."""
    from edge.latency import orin
    from edge.latency.grid import grid_parts

    if asked.device not in (None, orin.DEVICE):
        raise EdgeError(f"--device {asked.device} with --backend estimate", expected=f"{orin.DEVICE}, the only device "
                        "the estimator knows", fix="leave out --device, or measure a table on that device")
    if asked.threads is not None:
        raise EdgeError("--threads with --backend estimate", expected="no thread count (the estimate is of TensorRT "
                        "on the GPU)", fix="leave out --threads")
    batch = asked.batch or 1
    return orin.estimate_table(grid_parts(model, GridConfig("full", batch)), asked.power_mode or ESTIMATE_MODE,
                               asked.precision or "fp16", batch)


def load_table(asked: TargetConfig, model: nn.Module | None = None) -> LatencyTable | None:
    if asked.table is None:
        if asked.backend == "estimate" and model is not None:
            return estimate_table(model, asked)
        return None
    table = LatencyTable.load(asked.table)
    table.check(wanted_target(asked, table), where=f"latency table {asked.table}")
    return table


def _is_here(target: Target) -> bool:
    mine = here(target.batch, target.threads or 1, target.precision)
    return target.backend == mine.backend and target.device == mine.device and target.precision == "fp32"


def _front_to_time(result: SearchResult, count: int) -> list[Point]:
    """The chosen plan, then front plans spread over the latency range between it and the original."""
    if count <= 0:
        return []
    chosen = result.chosen
    # front plans between the chosen one and the original (faster ones lose more than the budget asks)
    others = [p for p in result.front if p.plan and p.predicted_ms > chosen.predicted_ms]
    picked = [chosen]
    if count > 1 and others:
        step = max(1, len(others) // (count - 1))
        picked += others[::step][:count - 1]
    return picked


def time_plans(model: nn.Module, plans: list[Point], result: SearchResult, config: PlanJobConfig, target: Target,
               work: Path, progress: Callable[[str], None]) -> dict:
    """Export the original, its A/A copy and ``plans``; time them side by side; medians and speedups."""
    from edge.export import ExportConfig, export_bytes

    size = tuple(data_config(model)["input_size"])
    paths: dict[str, Path] = {}
    original = export_bytes(model, size, ExportConfig(batch=target.batch))
    for name in ("original", "original-copy"):
        paths[name] = work / f"{name}.onnx"
        paths[name].write_bytes(original)
    for i, point in enumerate(plans):
        candidate = copy.deepcopy(model)
        apply_plan(candidate, parse_plan(point.plan).validate(len(model.blocks)),
                   result.compress_config, result.calibration_set, cache=result.cache)
        paths[f"plan{i}"] = work / f"plan{i}.onnx"
        paths[f"plan{i}"].write_bytes(export_bytes(candidate, size, ExportConfig(batch=target.batch)))
    progress(f"timing the original, its copy and {len(plans)} plans whole, side by side "
             f"(batch {target.batch}, {target.threads} threads)")
    timing = TimingConfig(threads=target.threads or 1, iterations=config.iterations, rounds=config.rounds,
                          seed=config.search.seed)
    stats = time_graphs(paths, timing, target.batch)
    base = stats["original"]["median_ms"]
    rows = [{"plan": p.plan, "predicted_ms": p.predicted_ms, "measured_ms": stats[f"plan{i}"]["median_ms"],
             "p90_ms": stats[f"plan{i}"].get("p90_ms"), "speedup": base / stats[f"plan{i}"]["median_ms"],
             "predicted_speedup": result.original.predicted_ms / p.predicted_ms,
             "prediction_error": p.predicted_ms / stats[f"plan{i}"]["median_ms"] - 1, "kl": p.kl,
             "agreement": p.agreement} for i, p in enumerate(plans)]
    return {"original_ms": base, "original_predicted_ms": result.original.predicted_ms,
            "aa_ratio": stats["original-copy"]["median_ms"] / base, "plans": rows,
            "protocol": {**asdict(timing), "batch": target.batch, "backend": "onnxruntime (CPU)",
                         "order": "interleaved (edge.profile.sidebyside)"}}


def _verdict(search: SearchConfig, asked_ms: float, timed: dict) -> tuple[bool, float]:
    """Whether the chosen plan, timed whole, meets the budget asked; and how optimistic its prediction was
    (the factor to tighten the predicted budget by)."""
    row = timed["plans"][0]
    if search.budget is not None:      # a share: the measured speed-up decides
        return row["speedup"] >= 1 / search.budget, row["predicted_speedup"] / row["speedup"]
    return row["measured_ms"] <= asked_ms, row["measured_ms"] / row["predicted_ms"]


def plan_to_budget(model: nn.Module, source: dict, out: str | Path, config: PlanJobConfig,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Run the whole verb (module docstring); returns the record written to ``out/plan.json``."""
    from edge import __version__
    from edge.runtime import hardware, versions

    say = progress or (lambda message: None)
    config.search.check()
    out = Path(out)
    table = load_table(config.target, model)
    target = wanted_target(config.target, table)
    with atomic_folder(out) as folder:
        if table is not None and config.target.table is None:   # the estimator's: kept as the search used it
            say(f"latency estimated, not measured: {table.target.describe()} (edge.latency.orin)")
            table.save(folder / TABLE_FILE)
        if table is None:
            say(f"measuring the latency table here ({target.describe()}); pass --table to reuse one")
            table = measure_table(model, GridConfig("full", target.batch),
                                  TimingConfig(threads=target.threads or 2, iterations=config.iterations,
                                               rounds=config.rounds, seed=config.search.seed),
                                  source=str(source.get("model")), progress=say)
            table.save(folder / TABLE_FILE)
        walk = Search(model, source, config.search, table, progress=say)
        asked_ms = budget_ms = walk.budget_ms()
        walk.run_to(budget_ms)
        result, timed, corrections = walk.result(budget_ms), None, []
        if _is_here(table.target) and config.measure:
            with tempfile.TemporaryDirectory(prefix="edge-plan-") as work:
                for attempt in range(config.correct + 1):
                    timed = time_plans(model, _front_to_time(result, config.measure), result, config, table.target,
                                       Path(work), say)
                    row = timed["plans"][0]
                    met, factor = _verdict(config.search, asked_ms, timed)
                    corrections.append({"budget_ms": budget_ms, "plan": row["plan"],
                                        "predicted_ms": row["predicted_ms"], "measured_ms": row["measured_ms"],
                                        "measured_speedup": row["speedup"],
                                        "predicted_speedup": row["predicted_speedup"], "aa_ratio": timed["aa_ratio"],
                                        "met": met})
                    if met or attempt == config.correct:
                        break
                    budget_ms = budget_ms / factor
                    say(f"timed whole, the plan misses the budget ({row['speedup']:.3f}x measured, "
                        f"{row['predicted_speedup']:.3f}x predicted): walking on to {budget_ms:.4g} ms predicted")
                    walk.run_to(budget_ms)
                    result = walk.result(budget_ms)
        elif config.measure:
            say(f"whole-model latency not measured: the table's target ({table.target.describe()}) is not "
                "ONNX Runtime on this machine")
        say(f"chose {result.chosen.plan} ({result.chosen.predicted_ms:.4g} ms predicted, "
            f"{result.original.predicted_ms / result.chosen.predicted_ms:.3f}x; KL {result.chosen.kl:.4g})")
        compress_config = replace(result.compress_config, plan=result.chosen.plan)
        compressed, manifest = compress(copy.deepcopy(model), source, compress_config, cache=result.cache)
        manifest["latency_plan"] = {"budget_ms": result.budget_ms, "asked_budget_ms": asked_ms,
                                    "target": table.target.describe(), "predicted_ms": result.chosen.predicted_ms,
                                    "original_predicted_ms": result.original.predicted_ms}
        save_artifact(compressed, folder / MODEL_DIR, manifest)
        tuned = None
        if config.finetune:
            tuned = _finetune(model, folder, source, config, say)
        record = {
            "format": "edge-plan", "format_version": 1, "edge": __version__,
            "model": source, "budget": config.search.budget, "budget_ms": asked_ms,
            "searched_budget_ms": result.budget_ms, "corrections": corrections,
            "target": asdict(table.target), "table": config.target.table or TABLE_FILE,
            "table_device_record": table.device_record, "search": asdict(config.search),
            "result": result.to_json(), "timed": timed, "finetune": tuned,
            "hardware": hardware(), "versions": versions(),
        }
        write_json_atomic(record, folder / RECORD_FILE)
        write_text_atomic(markdown(record), folder / "plan.md")
        plot(record, folder / "pareto.png")
    return record


def _finetune(model: nn.Module, folder: Path, source: dict, config: PlanJobConfig, say: Callable[[str], None]) -> dict:
    """Distil the chosen plan; its accuracy before and after, and the original's, on the whole test split."""
    from edge.check.accuracy import evaluate
    from edge.compress.artifact import read_manifest
    from edge.compress.finetune import FinetuneConfig, finetune
    from edge.data import load_dataset
    from edge.data.preprocess import InputSpec

    tune = FinetuneConfig(data=config.search.data, epochs=config.finetune, seed=config.search.seed,
                          max_steps=config.finetune_max_steps, threads=config.train_threads)
    say(f"distilling the chosen plan from the original for {config.finetune} epoch(s) of {tune.data}")
    finetune(folder / MODEL_DIR, folder / TUNED_DIR, tune, resume=False,
             student_name=f"{source.get('model')} planned (training-free)")
    last = read_manifest(folder / TUNED_DIR)["finetune"][-1]
    test = load_dataset(tune.data, "test")
    original = evaluate(model, test, InputSpec.from_data_config(data_config(model)), show_progress=False)
    after = last["eval"]
    return {"epochs": config.finetune, "steps": last["steps"], "before": last["eval_before"], "after": after,
            "original": {"data": test.name, "images": len(test), "accuracy": original["accuracy"]},
            "drop_pt": 100 * (original["accuracy"] - after["accuracy"]), "record": last}
