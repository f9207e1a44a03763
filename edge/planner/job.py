"""``edge plan MODEL --budget 0.5x --out DIR``: table, search, artifact, timing, distillation, record.

What DIR holds when the verb ends (written whole or not at all):

* ``plan.json``: the budget, the table's target, every round (the move taken, why, the moves it
  was measured against), every measured plan, the Pareto front, the whole-model timings and the
  distillation results, with hardware, threads and versions;
* ``plan.md``: the same for a reader; ``pareto.png``: KL against latency, every measured plan, the
  front, the chosen plan, and the timed plans at their measured latency;
* ``model/``: the chosen plan as a compressed artifact (``edge eval``, ``export``, ``finetune``
  take it); ``finetuned/`` (``--finetune EPOCHS``): it distilled from the original;
* ``latency-table.json``: the table the search used, when it was measured here or estimated (the Orin
  Nano estimator, ``backend="estimate"`` without a table); with several batches one per batch,
  ``latency-table-bN.json``.

Several batches (``TargetConfig.batches``, weights ``batch_weights``): one table per batch, given
(``table``: one file per batch, told apart by their targets' batches), estimated or measured here;
the search's cost is their weighted mix (:mod:`edge.planner.objective`), and the whole-model timing
here runs at each batch and reports the same mix of the measured ratios.

* ``timed/``: the graphs timed whole (``original.onnx``, ``plan0.onnx`` the chosen plan, ...; with several
  batches one folder per batch, ``timed/bN/``), when they were.

Whole-model timing, when the table's target is ONNX Runtime on this machine (another target's latency
is predicted only): the original and up to ``measure`` plans of the front (the chosen one first) are
made as a user makes them, ``edge export`` (verified against PyTorch) then ``edge clean``, into
``timed/``, and timed side by side with an A/A copy of the original in a fresh process
(:mod:`edge.profile.fresh`), not in this one: the figure ``plan.json`` reports is the one
``python -m edge.profile.fresh`` on those files reproduces (``timed.protocol.retime``).
"""

from __future__ import annotations

import copy
import shlex
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
from edge.latency import LatencyTable, Target, orin
from edge.latency.grid import GridConfig, grid_parts
from edge.latency.measure import measure_table
from edge.latency.table import here
from edge.models.zoo import data_config
from edge.planner.objective import LatencyMix, check_budget, check_weights
from edge.planner.plans import Point, SearchConfig
from edge.planner.report import markdown, plot
from edge.planner.search import Search, SearchResult
from edge.profile.graphs import TimingConfig

TABLE_FILE, RECORD_FILE, MODEL_DIR, TUNED_DIR = "latency-table.json", "plan.json", "model", "finetuned"
TIMED_DIR = "timed"   # the graphs timed whole, as edge export + edge clean make them
ESTIMATE_MODE = "MAXN_SUPER"   # --backend estimate: the Orin Nano's power mode unless one is asked (JetPack 6.2's top)


@dataclass(frozen=True)
class TargetConfig:
    """The target the budget is for; a field left None is the table's (or, measured here, the default)."""

    # a latency table file (edge profile / edge deploy --latency-table), or one per batch
    table: str | tuple[str, ...] | None = None
    backend: str | None = None                # onnxruntime | tensorrt | estimate (the Orin Nano estimator)
    device: str | None = None
    precision: str | None = None
    batch: int | None = option(None, minimum=1, maximum=MAX_BATCH)   # one batch (or batches: several)
    batches: tuple[int, ...] = ()             # several batches planned for at once (edge.planner.objective)
    batch_weights: tuple[float, ...] = ()     # the weight of each batch in the cost (default: equal)
    threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)
    power_mode: str | None = None


@dataclass(frozen=True)
class PlanJobConfig:
    search: SearchConfig
    target: TargetConfig = field(default_factory=TargetConfig)
    iterations: int = option(100, minimum=1, maximum=MAX_STEPS)   # timed calls per part graph of a table timed here
    rounds: int = option(5, minimum=1, maximum=MAX_STEPS)
    # the whole-model check (edge.profile.fresh): timed calls per graph, spread over rounds split evenly between
    # session sets created afresh; its speedup is the median of the per-round ratios, so it needs many rounds:
    # 10 calls per graph and round, 40 rounds in 10 sets (at 200 calls in 20 rounds of 5 sets, two fresh runs of
    # one plan gave 3.17x and 2.90x: too short to resolve 5 %)
    whole_iterations: int = option(400, minimum=1, maximum=MAX_STEPS)
    whole_rounds: int = option(40, minimum=2, maximum=MAX_STEPS)
    whole_sessions: int = option(10, minimum=1, maximum=1000)
    measure: int = option(4, minimum=0, maximum=100)   # front plans timed whole (the chosen one first)
    # times the budget is tightened when the chosen plan, timed whole here, misses it (ONNX Runtime here only)
    correct: int = option(2, minimum=0, maximum=10)
    finetune: int | None = option(None, minimum=1, maximum=MAX_EPOCHS)   # epochs of distillation of the chosen plan
    finetune_max_steps: int | None = option(None, minimum=1, maximum=MAX_STEPS)  # a shortened run (smoke tests)
    train_threads: int | None = option(None, minimum=1, maximum=MAX_THREADS)


def asked_batches(asked: TargetConfig, tables: list[LatencyTable]) -> tuple[int, ...]:
    """The batches planned for: ``batches``, else ``batch``, else the tables' batches, else 1."""
    if asked.batches and asked.batch is not None and asked.batches != (asked.batch,):
        raise EdgeError(f"batch {asked.batch} and batches {asked.batches}", expected="one of them")
    return asked.batches or ((asked.batch,) if asked.batch else tuple(t.target.batch for t in tables) or (1,))


def wanted_target(asked: TargetConfig, table: LatencyTable | None, batch: int | None = None) -> Target:
    """The target asked for: each field given, else the table's, else ONNX Runtime here, fp32, batch 1, 2 threads
    (``backend="estimate"`` without a table: the Orin Nano estimator, fp16, MAXN_SUPER)."""
    batch = batch or asked.batch
    if table is None and asked.backend == orin.BACKEND:
        if asked.device not in (None, orin.DEVICE):
            raise EdgeError(f"--backend estimate for {asked.device}", expected=f"the estimator's {orin.DEVICE}",
                            fix="leave --target-device out, or pass a table measured on that device")
        return orin.target(asked.power_mode or "MAXN_SUPER", asked.precision or "fp16", batch or 1)
    if table is None:
        default = here(batch or 1, asked.threads or 2, asked.precision or "fp32")
        if asked.backend not in (None, default.backend):
            raise EdgeError(f"--backend {asked.backend} without --table",
                            expected="a latency table measured on that backend (edge deploy --latency-table on the "
                                     "device)", fix=f"pass --table FILE, or plan for {default.backend} here")
        return replace(default, device=asked.device or default.device, power_mode=asked.power_mode)
    base = table.target
    return Target(backend=asked.backend or base.backend, device=asked.device or base.device,
                  precision=asked.precision or base.precision, batch=batch or base.batch,
                  threads=asked.threads if asked.threads is not None else base.threads,
                  power_mode=asked.power_mode or base.power_mode)


def table_paths(asked: TargetConfig) -> tuple[str, ...]:
    return (asked.table,) if isinstance(asked.table, str) else tuple(asked.table or ())


def load_tables(asked: TargetConfig) -> dict[int, tuple[str, LatencyTable]]:
    """The tables given, by batch, each checked against the target asked for at its batch."""
    paths = table_paths(asked)
    loaded = [(path, LatencyTable.load(path)) for path in paths]
    batches = asked_batches(asked, [t for _, t in loaded])
    by_batch: dict[int, tuple[str, LatencyTable]] = {}
    for path, table in loaded:
        batch = table.target.batch
        if batch in by_batch:
            raise EdgeError(f"latency tables {by_batch[batch][0]} and {path} are both of batch {batch}",
                            expected="one table per batch", fix="pass each batch's table once")
        if batch not in batches and len(batches) > 1:
            raise EdgeError(f"latency table {path} is of batch {batch}",
                            expected=f"a table of each batch planned for ({', '.join(map(str, batches))})",
                            fix="add its batch to --batch, or leave the table out")
        target_batch = batch if len(batches) > 1 else batches[0]
        table.check(wanted_target(asked, table, target_batch), where=f"latency table {path}")
        by_batch[batch] = (path, table)
    missing = [b for b in batches if b not in by_batch]
    if loaded and missing and asked.backend != orin.BACKEND:
        raise EdgeError(f"no latency table of batch {', '.join(map(str, missing))}",
                        expected="a table (--table FILE) for each batch planned for",
                        fix="pass a table of each batch (edge profile MODEL --latency-table FILE --batch N), "
                            "or leave the tables out to measure them here")
    return by_batch


def latency_mix(model: nn.Module, source: dict, config: PlanJobConfig, given: dict[int, tuple[str, LatencyTable]],
                folder: Path, say: Callable[[str], None]) -> tuple[LatencyMix, list[str]]:
    """One table per batch planned for (``given`` by :func:`load_tables`, else estimated or measured here and
    saved in ``folder``), weighted; and each table's name for the record."""
    asked = config.target
    batches = asked_batches(asked, [t for _, t in given.values()])
    weights = asked.batch_weights or (1.0,) * len(batches)
    check_weights(tuple(weights), len(batches))
    tables, names = [], []
    for batch in batches:
        if batch in given:
            name, table = given[batch]
        else:
            target = wanted_target(asked, None, batch)
            name = TABLE_FILE if len(batches) == 1 else f"latency-table-b{batch}.json"
            if target.backend == orin.BACKEND:
                say(f"estimating the latency table ({target.describe()}): the Orin Nano estimator, nothing timed")
                table = orin.estimate_table(grid_parts(model, GridConfig("full", batch)), target.power_mode or "",
                                            target.precision, batch)
            else:
                say(f"measuring the latency table here ({target.describe()}); pass --table to reuse one")
                table = measure_table(model, GridConfig("full", batch),
                                      TimingConfig(threads=target.threads or 2, iterations=config.iterations,
                                                   rounds=config.rounds, seed=config.search.seed),
                                      source=str(source.get("model")), progress=say)
            table.save(folder / name)
        tables.append(table)
        names.append(name)
    return LatencyMix(tuple(tables), tuple(float(w) for w in weights)), names


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


def export_timed(model: nn.Module, source: dict, plan: str | None, batch: int, out: Path, raw: Path) -> Path:
    """``model`` as a user gets it: ``edge export`` (verified against PyTorch) then ``edge clean`` (its default
    passes), written to ``out``; the raw export is kept in ``raw``."""
    from edge.export import ExportConfig, export
    from edge.graph.clean import clean_file
    from edge.graph.passes import select_passes

    export(model, raw, source=str(source.get("model")), plan=plan, data_config=data_config(model),
           config=ExportConfig(batch=batch))
    clean_file(raw, out, select_passes())
    return out


def time_plans(model: nn.Module, source: dict, plans: list[Point], result: SearchResult, config: PlanJobConfig,
               target: Target, folder: Path, timed: Path, progress: Callable[[str], None]) -> dict:
    """Export and clean the original and ``plans`` into ``timed`` (under the run ``folder``) as ``edge export`` +
    ``edge clean`` make them, and time them side by side with an A/A copy of the original in a fresh process
    (:func:`edge.profile.fresh.time_fresh`): medians and speedups, the figures a user re-timing those files gets."""
    from edge.profile.fresh import command as fresh_command
    from edge.profile.fresh import time_fresh

    timed.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="edge-plan-") as work:
        raw = Path(work)
        paths["original"] = timed / "original.onnx"
        if not paths["original"].exists():      # the same model and batch on every correction
            export_timed(model, source, None, target.batch, paths["original"], raw / "original.onnx")
        for i, point in enumerate(plans):
            candidate = copy.deepcopy(model)
            apply_plan(candidate, parse_plan(point.plan).validate(len(model.blocks)),
                       result.compress_config, result.calibration_set, cache=result.cache)
            paths[f"plan{i}"] = export_timed(candidate, source, point.plan, target.batch, timed / f"plan{i}.onnx",
                                             raw / f"plan{i}.onnx")
    for stale in set(timed.glob("plan*.onnx")) - set(paths.values()):
        stale.unlink()                           # a correction timed fewer plans than the attempt before
    progress(f"timing the original, its A/A copy and {len(plans)} plans whole, side by side in a fresh process "
             f"(batch {target.batch}, {target.threads} threads)")
    timing = TimingConfig(threads=target.threads or 1, iterations=config.whole_iterations, rounds=config.whole_rounds,
                          sessions=config.whole_sessions, seed=config.search.seed)
    fresh = time_fresh(paths, "original", timing, target.batch)
    stats = fresh["graphs"]
    base = stats["original"]["median_ms"]
    rows = [{"plan": p.plan, "predicted_ms": p.predicted_ms, "measured_ms": stats[f"plan{i}"]["median_ms"],
             "p90_ms": stats[f"plan{i}"]["p90_ms"], "speedup": stats[f"plan{i}"]["speedup"],
             "speedup_interval": [stats[f"plan{i}"]["low"], stats[f"plan{i}"]["high"]],
             "predicted_speedup": result.original.predicted_ms / p.predicted_ms,
             "prediction_error": p.predicted_ms / (base / stats[f"plan{i}"]["speedup"]) - 1, "kl": p.kl,
             "agreement": p.agreement, "floor_margin": p.floor_margin,
             "graph": paths[f"plan{i}"].relative_to(folder).as_posix()}
            for i, p in enumerate(plans)]
    aa = fresh["aa_control"]
    return {"original_ms": base, "original_predicted_ms": result.original.predicted_ms,
            "aa_ratio": 1 / aa["speedup"], "aa_control": aa, "noisy": fresh["noisy"], "plans": rows,
            "graphs": {name: path.relative_to(folder).as_posix() for name, path in paths.items()},
            "contention": fresh["contention"],
            "protocol": {**asdict(timing), "batch": target.batch, "backend": "onnxruntime (CPU)",
                         "order": "interleaved (edge.profile.sidebyside), A/A copy of the original",
                         "speedup": fresh["method"], "iterations_per_round": fresh["iterations_per_round"],
                         "process": "fresh: " + " ".join(fresh["process"]["command"]),
                         "graphs": "edge export (verified against PyTorch), then edge clean (default passes)",
                         "retime": "python " + shlex.join(fresh_command(
                             {n: Path("OUT") / p.relative_to(folder) for n, p in paths.items()}, "original", timing,
                             target.batch)[1:])}}


def time_mix(model: nn.Module, source: dict, plans: list[Point], result: SearchResult, config: PlanJobConfig,
             mix: LatencyMix, folder: Path, progress: Callable[[str], None]) -> dict:
    """:func:`time_plans` at each batch of ``mix`` (graphs in ``folder/timed``, with several batches in
    ``folder/timed/bN``); with several, the rows hold the mix of the measured ratios (in ms: the original's
    measured weighted mean times the plan's share), each batch's timing under ``batches``."""
    if len(mix.tables) == 1:
        return time_plans(model, source, plans, result, config, mix.target, folder, folder / TIMED_DIR, progress)
    per: dict[int, dict] = {}
    for table in mix.tables:
        per[table.target.batch] = time_plans(model, source, plans, result, config, table.target, folder,
                                             folder / TIMED_DIR / f"b{table.target.batch}", progress)
    shares = dict(zip(mix.batches, mix.shares))
    reference = sum(shares[b] * per[b]["original_ms"] for b in per)
    rows = []
    for i, point in enumerate(plans):
        share = sum(shares[b] / per[b]["plans"][i]["speedup"] for b in per)
        predicted_share = point.predicted_ms / result.original.predicted_ms
        rows.append({"plan": point.plan, "predicted_ms": point.predicted_ms, "measured_ms": reference * share,
                     "p90_ms": None, "speedup": 1 / share, "predicted_speedup": 1 / predicted_share,
                     "prediction_error": predicted_share / share - 1, "kl": point.kl, "agreement": point.agreement,
                     "floor_margin": point.floor_margin,
                     "batch_speedup": {str(b): per[b]["plans"][i]["speedup"] for b in per}})
    return {"original_ms": reference, "original_predicted_ms": result.original.predicted_ms,
            "aa_ratio": sum(shares[b] * per[b]["aa_ratio"] for b in per), "plans": rows,
            "batches": {str(b): per[b] for b in per},
            "protocol": {"batches": list(per), "weights": [shares[b] for b in per],
                         "cost": "weighted sum of each batch's measured latency ratio to the original"}}


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
    given = load_tables(config.target)
    batches = asked_batches(config.target, [t for _, t in given.values()])
    check_budget(config.search.budget_ms, batches)
    for batch in batches:
        if batch not in given:
            wanted_target(config.target, None, batch)   # refuses a target that has to be given a table
    with atomic_folder(out) as folder:
        mix, table_names = latency_mix(model, source, config, given, folder, say)
        table = mix.tables[0]
        walk = Search(model, source, config.search, mix, progress=say)
        asked_ms = budget_ms = walk.budget_ms()
        walk.run_to(budget_ms)
        result, timed, corrections = walk.result(budget_ms), None, []
        if all(_is_here(t.target) for t in mix.tables) and config.measure:
            for attempt in range(config.correct + 1):
                timed = time_mix(model, source, _front_to_time(result, config.measure), result, config, mix,
                                 folder, say)
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
            say(f"whole-model latency not measured: the target ({mix.describe()}) is not "
                "ONNX Runtime on this machine")
        say(f"chose {result.chosen.plan} ({result.chosen.predicted_ms:.4g} ms predicted, "
            f"{result.original.predicted_ms / result.chosen.predicted_ms:.3f}x; KL {result.chosen.kl:.4g})")
        compress_config = replace(result.compress_config, plan=result.chosen.plan)
        compressed, manifest = compress(copy.deepcopy(model), source, compress_config, cache=result.cache)
        manifest["latency_plan"] = {"budget_ms": result.budget_ms, "asked_budget_ms": asked_ms,
                                    "target": mix.describe(), "predicted_ms": result.chosen.predicted_ms,
                                    "original_predicted_ms": result.original.predicted_ms,
                                    "batch_ms": dict((str(b), ms) for b, ms in result.chosen.batch_ms)}
        save_artifact(compressed, folder / MODEL_DIR, manifest)
        tuned = None
        if config.finetune:
            tuned = _finetune(model, folder, source, config, say)
        record = {
            "format": "edge-plan", "format_version": 1, "edge": __version__,
            "model": source, "budget": config.search.budget, "budget_ms": asked_ms,
            "searched_budget_ms": result.budget_ms, "corrections": corrections,
            "target": asdict(table.target), "table": table_names[0],
            "batches": [{"batch": t.target.batch, "weight": w, "table": name, "target": t.target.describe()}
                        for t, w, name in zip(mix.tables, mix.shares, table_names)],
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
    from edge.models import data_for
    from edge.runtime import resolve_device

    tune = FinetuneConfig(data=data_for(config.search.data, source.get("model")), epochs=config.finetune,
                          seed=config.search.seed, max_steps=config.finetune_max_steps, threads=config.train_threads,
                          device=config.search.device)
    say(f"distilling the chosen plan from the original for {config.finetune} epoch(s) of {tune.data}")
    finetune(folder / MODEL_DIR, folder / TUNED_DIR, tune, resume=False,
             student_name=f"{source.get('model')} planned (training-free)")
    last = read_manifest(folder / TUNED_DIR)["finetune"][-1]
    test = load_dataset(tune.data, "test")
    original = evaluate(model, test, InputSpec.from_data_config(data_config(model)), show_progress=False,
                        device=resolve_device(config.search.device))
    after = last["eval"]
    return {"epochs": config.finetune, "steps": last["steps"], "before": last["eval_before"], "after": after,
            "original": {"data": test.name, "images": len(test), "accuracy": original["accuracy"]},
            "drop_pt": 100 * (original["accuracy"] - after["accuracy"]), "record": last}
