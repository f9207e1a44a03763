"""The main job: for every variant of a recipe compress, count, export, clean, verify, evaluate; then
profile all variants together (side by side, with an A/A control).

Every step is one library call (``edge.compress``, ``edge.export``, ``edge.graph.clean``,
``edge.check.verify``, ``edge.check.accuracy``, ``edge.profile.sidebyside``) run through the :class:`StepCache`,
so a rerun redoes only the steps whose inputs changed; the profile step is one step over all
variants, so latency ratios always come from one measurement. Layout of ``OUT``::

    OUT/report.json, report.md, report.html
    OUT/onnxruntime.log                ONNX Runtime's notes of the last run that had any (kept off the terminal)
    OUT/analysis/                      analysis.json and heatmaps of the original model
    OUT/analysis.done.json, profile.done.json   the shared steps' cache markers
    OUT/variants/NAME/model/           the compressed artifact (variants with a plan)
    OUT/variants/NAME/model.onnx       static batch: verified, cleaned, profiled (deployment form)
    OUT/variants/NAME/model.clean.onnx
    OUT/variants/NAME/model.batched.onnx, model.batched.clean.onnx   dynamic batch: accuracy
    OUT/variants/NAME/STEP.done.json   the cache markers (key, output hashes, result)

Everything the recipe names is checked before anything is written.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from edge.errors import EdgeError, plural
from edge.fileio import atomic_folder, sha256_file
from edge.pipeline.cache import StepCache, StepRecord
from edge.pipeline.layout import (ARTIFACT, BATCHED, BUNDLE, DEPLOYED, ORT_LOG, PLAN, STEPS, VARIANTS, clean_name,
                                  headline_variants, reference_variant)
from edge.pipeline.recipe import Recipe, Variant
from edge.progress import log

VERIFY_BATCH = 8


def data_fingerprint(dataset) -> str:
    """sha256 of a split's pixels and labels (in-memory sets) or of its files and labels (image folders)."""
    return dataset.fingerprint()


def resolve_data(recipe: Recipe) -> tuple[str, str | None]:
    """The data set the run uses, and the notice when a fallback replaced it. Without ``data`` a bundled model
    uses its own data set, falling back to its smaller check set when that is not installed; a recipe that names
    data that cannot be read stops the run there (exit 2) unless it names a ``fallback_data`` too."""
    from edge.data import load_dataset
    from edge.models import bundled_source

    try:
        data, fallback = recipe.data, recipe.fallback_data
        if data is None:
            bundled = bundled_source(recipe.model)
            if bundled is None:
                raise EdgeError(f"the recipe names no data for {recipe.model}, which is not a model bundled with "
                                "edge", expected="data: your images (a folder with train/ and val/ or test/)",
                                fix="add `data: DIR` to the recipe or pass --data DIR (docs/your-own-model.md)")
            data, fallback = bundled.data, fallback or bundled.check_data
    except EdgeError as e:
        raise e.at(f"recipe {recipe.source}, key data") from e
    try:
        load_dataset(data, "test")
        return data, None
    except EdgeError as e:
        if not fallback or fallback == data:
            raise e.at(f"recipe {recipe.source}, key data") from e
        load_dataset(fallback, "test")
        return fallback, f"data {data!r} is not available ({e.what}); using {fallback!r} instead"


def check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise EdgeError(f"--out {out} is a file", expected="a folder (new, or one written by edge pipeline)")
    ours = (VARIANTS, "report.json", "analysis.done.json")
    if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in ours):
        raise EdgeError(f"--out {out} is a folder that edge pipeline did not write",
                        fix="choose a new or empty folder (a previous pipeline folder is reused: cached steps "
                            "are not redone)")


def check_plans(recipe: Recipe, num_blocks: int) -> None:
    from edge.compress.plan import parse_plan

    for index, variant in enumerate(recipe.variants):
        if variant.plan is None:
            continue
        try:
            parse_plan(variant.plan).validate(num_blocks)
        except EdgeError as e:
            raise e.at(f"recipe {recipe.source}, key variants[{index}].plan",
                       default_fix=f"{recipe.model} has {num_blocks} blocks (0..{num_blocks - 1})") from e


@dataclass
class Context:
    """What every step of one run shares: the recipe, the folder, the cache, the source model, data."""

    recipe: Recipe
    out: Path
    cache: StepCache
    data: str
    model: nn.Module
    source_hash: str
    records: dict = field(default_factory=dict)  # variant -> {step: StepRecord}

    @property
    def source(self) -> dict:
        return {"model": self.recipe.model, "weights": self.recipe.weights, "img_size": self.recipe.img_size}

    @property
    def gate_data(self) -> str:
        """The accuracy gates' images: a bundled model's check set when the run uses its own data (the gate's
        figures stay those of edge quantize's defaults), else the run's data (its test split)."""
        from edge.models import bundled_source

        bundled = bundled_source(self.recipe.model)
        return bundled.check_data if bundled is not None and self.data == bundled.data else self.data

    @cached_property
    def test_set(self):
        from edge.data import load_dataset

        return load_dataset(self.data, "test")

    @cached_property
    def test_hash(self) -> str:
        return data_fingerprint(self.test_set)

    @cached_property
    def train_hash(self) -> str:
        from edge.data import load_dataset

        return data_fingerprint(load_dataset(self.data, "train"))

    @cached_property
    def data_config(self) -> dict:
        from edge.models import data_config

        return data_config(self.model)

    @property
    def input_spec(self):
        from edge.data import InputSpec

        return InputSpec.from_data_config(self.data_config)

    def real_images(self):
        """The test images the verifications take their first few from."""
        return self.test_set


SHARED = "<shared>"  # records of the steps that belong to no variant (not a valid variant name)


def step(ctx: Context, variant: str, name: str, folder: Path, inputs: dict, work, outputs=()) -> StepRecord:
    label = f"[{variant if variant != SHARED else name}] {name}"
    record = ctx.cache.run(folder, name, inputs, work, tuple(outputs), on_start=lambda: log(f"{label} ..."))
    done = f"ran in {record.seconds:.1f} s" if record.status == "ran" else \
        f"cached (took {record.work_seconds:.1f} s when it ran)"
    log(f"{label}: {done}")
    ctx.records.setdefault(variant, {})[name] = record
    return record


def run_analysis(ctx: Context) -> StepRecord | None:
    settings = ctx.recipe.analysis
    if not settings.enabled:
        return None
    inputs = {"source": ctx.source_hash, "data": ctx.train_hash, "samples": settings.samples,
              "seed": ctx.recipe.seed}

    def work() -> dict:
        from edge.analysis.analyze import analyze
        from edge.data import calibration_set

        calibration = calibration_set(ctx.data, settings.samples, ctx.recipe.seed)
        with atomic_folder(ctx.out / "analysis") as folder:
            result = analyze(ctx.model, ctx.recipe.model, calibration, ctx.input_spec, folder)
        br = result["block_redundancy"]
        return {"samples": result["samples"], "data": result["data"], "num_blocks": result["num_blocks"],
                "block_redundancy": br, "most_redundant_block": max(range(len(br)), key=br.__getitem__),
                "pictures": {k: f"analysis/{v}" for k, v in result["pictures"].items()},
                "json": "analysis/analysis.json", "seconds": result["seconds"]}

    return step(ctx, SHARED, "analysis", ctx.out, inputs, work, ("analysis",))


class VariantRun:
    """The steps of one variant; its model is built only when a step that needs it runs."""

    def __init__(self, ctx: Context, variant: Variant) -> None:
        self.ctx = ctx
        self.variant = variant
        self.folder = ctx.out / VARIANTS / variant.name
        self.content_hash = ctx.source_hash
        self.plan = variant.plan

    @property
    def artifact(self) -> Path:
        return self.folder / ARTIFACT

    @cached_property
    def model(self) -> nn.Module:
        if self.variant.plan is None and not self.variant.searched:
            return self.ctx.model
        from edge.compress import load_artifact

        return load_artifact(self.artifact)[0]

    def _step(self, name: str, inputs: dict, work, outputs=()) -> StepRecord:
        return step(self.ctx, self.variant.name, name, self.folder, inputs, work, outputs)

    def compress(self) -> None:
        recipe = self.ctx.recipe
        if self.variant.plan is None:
            return
        calibration = recipe.calibration
        # the weights by content (not by path); the architecture by name (the artifact rebuilds it from that)
        inputs = {"source": self.ctx.source_hash, "architecture": [recipe.model, recipe.img_size],
                  "plan": self.variant.plan,
                  "data": self.ctx.train_hash, "samples": calibration.samples, "holdout": calibration.holdout,
                  "seed": recipe.seed}

        def work() -> dict:
            from edge.compress import CompressConfig, compress, save_artifact

            model, manifest = compress(copy.deepcopy(self.ctx.model), self.ctx.source,
                                       CompressConfig(plan=self.variant.plan, data=self.ctx.data,
                                                      samples=calibration.samples, seed=recipe.seed,
                                                      holdout=calibration.holdout))
            save_artifact(model, self.artifact, manifest)
            return {key: manifest[key] for key in ("plan", "requested_plan", "calibration", "fit", "planner",
                                                   "before", "after", "seconds")}

        record = self._step("compress", inputs, work, (ARTIFACT,))
        self.plan = record.result["plan"]
        weights = sha256_file(self.artifact / "model.safetensors")
        self.content_hash = hashlib.sha256(f"{weights}\0{self.plan}".encode()).hexdigest()

    def count(self) -> StepRecord:
        def work() -> dict:
            from edge.compress.compressor import costs

            return costs(self.model)

        return self._step("count", {"model": self.content_hash}, work)

    def export(self) -> StepRecord:
        settings = self.ctx.recipe.export
        inputs = {"model": self.content_hash, "plan": self.plan, "source": self.ctx.recipe.model,
                  "batch": settings.batch, "opset": settings.opset, "data": self.ctx.test_hash}

        def work() -> dict:
            from edge.export import ExportConfig, export

            real = self.ctx.real_images().inputs(self.ctx.input_spec, VERIFY_BATCH)
            reports = {}
            for graph, config in ((DEPLOYED, ExportConfig(settings.batch, False, settings.opset)),
                                  (BATCHED, ExportConfig(1, True, settings.opset))):
                report = export(self.model, self.folder / graph, source=self.ctx.recipe.model, plan=self.plan,
                                data_config=self.ctx.data_config, config=config, real_inputs=real)
                report.pop("out")
                reports[graph] = report
            return reports

        return self._step("export", inputs, work, (DEPLOYED, BATCHED))

    def clean(self, exported: StepRecord) -> StepRecord:
        def work() -> dict:
            from edge.graph.clean import clean_file

            results = {}
            for graph in (DEPLOYED, BATCHED):
                result = clean_file(self.folder / graph, self.folder / clean_name(graph))
                results[graph] = {"report": result["report"], "verification": result["verification"]}
            return results

        from edge.graph.passes import DEFAULT_PASSES

        inputs = {"graphs": exported.outputs, "passes": [p.name for p in DEFAULT_PASSES]}
        return self._step("clean", inputs, work, tuple(clean_name(g) for g in (DEPLOYED, BATCHED)))

    def verify(self, cleaned: StepRecord) -> StepRecord:
        """The cleaned graphs against the PyTorch model they came from (end to end), random and real inputs."""
        recipe = self.ctx.recipe
        inputs = {"model": self.content_hash, "graphs": cleaned.outputs, "data": self.ctx.test_hash,
                  "seed": recipe.seed, "batch": VERIFY_BATCH}

        def work() -> dict:
            from edge.check.verify import Side, onnx_side, verify_pair

            reference = Side(self.variant.name, "torch", self.ctx.data_config, self._torch_run())
            real = self.ctx.real_images()
            return {graph: verify_pair(reference, onnx_side(str(self.folder / graph), threads=recipe.threads),
                                       real=real, batch=VERIFY_BATCH, seed=recipe.seed)
                    for graph in cleaned.outputs}

        return self._step("verify", inputs, work)

    def _torch_run(self):
        import torch

        model = self.model.eval()

        @torch.no_grad()
        def run(x):
            return model(x).float().numpy()

        return run

    def evaluate(self, cleaned: StepRecord) -> StepRecord:
        """Accuracy of the cleaned dynamic-batch graph: a headline variant on ``evaluate.samples`` (the whole split),
        any other on ``evaluate.subset``, paired there with the reference's figures on the same images."""
        graph, name = clean_name(BATCHED), self.variant.name
        reference = reference_variant(self.ctx.recipe)
        against = None
        if name not in headline_variants(self.ctx.recipe) and "evaluate" in self.ctx.records.get(reference, {}):
            against = {reference: self.ctx.records[reference]["evaluate"]}
        return evaluate_graph(self.ctx, name, self.folder, graph, cleaned.outputs[graph], against)

    def estimate(self) -> StepRecord | None:
        """The variant's latency on a Jetson Orin Nano as edge.latency.orin estimates it, at every precision."""
        settings = self.ctx.recipe.estimate
        if settings is None:
            return None

        def work() -> dict:
            from edge.latency import model_parts, predict_parts, orin

            parts = model_parts(self.model)
            ms = {precision: predict_parts(parts, orin.estimate_table(parts, settings.power_mode, precision,
                                                                      settings.batch)).total_ms
                  for precision in orin.PRECISIONS}
            return {"ms": ms, "device": orin.DEVICE, "power_mode": settings.power_mode, "batch": settings.batch,
                    "backend": orin.BACKEND}

        return self._step("estimate", {"model": self.content_hash, "settings": dataclasses.asdict(settings)}, work)

    def run(self) -> StepRecord:
        """Every step but profiling (all variants are profiled together); the clean step's record."""
        self.compress()
        self.count()
        cleaned = self.clean(self.export())
        self.verify(cleaned)
        self.evaluate(cleaned)
        self.estimate()
        return cleaned


def evaluate_graph(ctx: Context, label: str, folder: Path, graph: str, digest: str,
                   against: dict[str, StepRecord] | None = None, converted: bool = False) -> StepRecord:
    """Top-1 accuracy of ``folder/graph`` (a dynamic-batch graph) with ONNX Runtime on its test images
    (:func:`test_indices`), keeping every image's prediction. ``against``: float32 variants' evaluations by name
    (a converted graph's own variant and the reference; a subset variant's reference), each one's accuracy on
    this graph's images and the share of them it answers alike (paired figures)."""
    recipe = ctx.recipe
    picked = test_indices(ctx, label, converted)
    inputs = {"graph": digest, "data": ctx.test_hash, "batch_size": recipe.evaluate.batch_size,
              "images": None if picked is None else hashlib.sha256(picked.numpy().tobytes()).hexdigest(),
              "seed": recipe.seed, "predictions": True,
              "against": None if against is None else {"evaluations": {n: r.key for n, r in against.items()}}}

    def work() -> dict:
        from edge.check.accuracy import evaluate
        from edge.check.onnx_classifier import OnnxClassifier
        from edge.data import InputSpec

        dataset = ctx.test_set
        if picked is not None:
            dataset = dataset.subset(picked, f"{dataset.name}[{len(picked)}]")
        classifier = OnnxClassifier(folder / graph, threads=recipe.threads)
        result = evaluate(classifier, dataset, InputSpec.from_data_config(classifier.data_config()),
                          batch_size=recipe.evaluate.batch_size, predictions=True)
        if against is not None:   # each float32 graph's predictions are in the order of its own images
            result["same_images"] = {name: same_images(record, test_indices(ctx, name), picked, dataset.labels,
                                                       result["predictions"]) for name, record in against.items()}
        result["images"] = images_label(len(dataset), len(ctx.test_set))
        return {**result, "graph": graph, "backend": "onnxruntime"}

    return step(ctx, label, "evaluate", folder, inputs, work)


def images_label(images: int, split: int) -> str:
    """How the report names a graph's test images: ``full split (10,000)`` or ``subset (2,000)``."""
    return f"full split ({split:,})" if images == split else f"subset ({images:,})"


def _balanced(ctx: Context, pool, wanted: int | None, key: str, among: str):
    """``wanted`` class-balanced, seeded indices of ``pool`` (sorted; None: all of the split), ``pool`` itself (None:
    all) when it holds no more; an EdgeError naming the recipe's ``key`` when the classes cannot be balanced."""
    from edge.data import balanced_indices

    labels = ctx.test_set.labels
    every = torch.arange(len(labels)) if pool is None else pool
    if wanted is None or wanted >= len(every):
        return pool
    try:
        return every[balanced_indices(labels[every], wanted, ctx.recipe.seed, ctx.test_set.num_classes).sort().values]
    except EdgeError as e:
        raise EdgeError(f"{key} {wanted}: no class-balanced set of {wanted} among {among}", found=str(e),
                        fix=f"lower {key} in the recipe, or set it to null (all of them)") from e


def test_indices(ctx: Context, name: str, converted: bool = False):
    """The test images graph ``name`` is evaluated on (sorted indices into the test split; None: all of them): a
    headline float32 graph (:func:`headline_variants`) ``evaluate.samples`` of them (seeded, balanced); every
    other graph a fixed balanced ``evaluate.subset`` of those, the same for all; a converted one (``converted``)
    ``precision.test_images`` of that subset, balanced again. Every set lies within the headline's images, so a
    float32 graph's predictions give its figures on any other graph's images."""
    recipe = ctx.recipe
    split = f"the {len(ctx.test_set):,} test images"
    headline = _balanced(ctx, None, recipe.evaluate.samples, "evaluate.samples", split)
    if name in headline_variants(recipe) and not converted:
        return headline
    subset = _balanced(ctx, headline, recipe.evaluate.subset, "evaluate.subset", "the headline's test images")
    if not converted or recipe.precision is None:
        return subset
    return _balanced(ctx, subset, recipe.precision.test_images, "precision.test_images", "evaluate.subset's images")


def same_images(record: StepRecord, evaluated, picked, labels, predicted: list[int]) -> dict:
    """A float32 graph's figures on the images a converted graph was evaluated on (``picked``: indices into the
    test split, None: all), from its evaluation's predictions (made on ``evaluated``, None: all, in that order):
    its accuracy there and the top-1 agreement."""
    reference = torch.tensor(record.result["predictions"])
    if picked is not None:
        reference = reference[picked if evaluated is None else torch.searchsorted(evaluated, picked)]
    ours = torch.tensor(predicted)
    correct = int((reference == labels).sum())
    return {"accuracy": correct / len(ours), "correct": correct,
            "top1_agreement": float((reference == ours).double().mean())}


class PlannedRun(VariantRun):
    """The plan search's choice as a variant: its artifact is ``OUT/plan/model`` (no compress step of its own)."""

    def __init__(self, ctx: Context, variant: Variant, planned: StepRecord) -> None:
        super().__init__(ctx, variant)
        self.planned = planned

    @property
    def artifact(self) -> Path:
        return self.ctx.out / PLAN / ARTIFACT

    def compress(self) -> None:
        self.plan = self.planned.result["chosen"]["plan"]
        weights = sha256_file(self.artifact / "model.safetensors")
        self.content_hash = hashlib.sha256(f"{weights}\0{self.plan}".encode()).hexdigest()


class PrecisionRun:
    """A variant's fp16 or int8 graphs (``edge quantize`` of its two cleaned graphs), evaluated and timed."""

    def __init__(self, base: VariantRun, precision: str) -> None:
        self.base, self.precision = base, precision
        self.ctx = base.ctx
        self.name = f"{base.variant.name}.{precision}"
        self.folder = base.folder / precision

    def quantize(self, cleaned: StepRecord) -> StepRecord:
        recipe, settings = self.ctx.recipe, self.ctx.recipe.precision
        images = {DEPLOYED: settings.static_gate_images, BATCHED: settings.gate_images}
        inputs = {"graphs": {g: cleaned.outputs[clean_name(g)] for g in (DEPLOYED, BATCHED)},
                  "precision": self.precision, "samples": settings.samples, "data": self.ctx.train_hash,
                  "seed": recipe.seed, "gate_images": images}

        def work() -> dict:
            from edge.precision.gate import GateConfig
            from edge.precision.int8 import Int8Config
            from edge.precision.quantize import quantize_file

            int8 = Int8Config(data=self.ctx.data, samples=settings.samples, seed=recipe.seed) \
                if self.precision == "int8" else None
            # a graph below the accuracy gate is written for the report (its accuracy says what the gate saw)
            # and marked; the bundle leaves it out (edge bundle would refuse it)
            return {graph: quantize_summary(quantize_file(self.base.folder / clean_name(graph), self.folder / graph,
                                                          self.precision, int8=int8, check_data=self.ctx.gate_data,
                                                          gate=GateConfig(images=images[graph], accept_loss=True)))
                    for graph in (DEPLOYED, BATCHED)}

        return step(self.ctx, self.name, "quantize", self.folder, inputs, work, (DEPLOYED, BATCHED))

    @staticmethod
    def below_gate(quantized: StepRecord) -> bool:
        """Whether either graph fell below the accuracy gate (written with the loss accepted, marked)."""
        return any((q.get("gate") or q["check"]).get("accepted_loss") for q in quantized.result.values())

    def run(self, cleaned: StepRecord) -> StepRecord:
        quantized = self.quantize(cleaned)
        names = (self.base.variant.name, reference_variant(self.ctx.recipe))
        evaluate_graph(self.ctx, self.name, self.folder, BATCHED, quantized.outputs[BATCHED],
                       against={name: self.ctx.records[name]["evaluate"] for name in names}, converted=True)
        return quantized


def quantize_summary(result: dict) -> dict:
    """What the report keeps of ``quantize_file``'s result: the accuracy gate's figures and how it was made."""
    config = result.get("config") or {}
    return {"precision": result["precision"], "check": result["check"], "gate": result.get("gate"),
            "calibration": result.get("calibration"), "placement": config.get("placement"),
            "bytes": result["bytes"], "nodes": result["nodes"]}


def run_profile(ctx: Context, runs: list[VariantRun], cleaned: list[StepRecord],
                precisions: Sequence[tuple[PrecisionRun, StepRecord]] = ()) -> StepRecord:
    """Every variant's cleaned static-batch graph timed side by side, in one run, with an A/A control.

    One step for all variants: their latency ratios always come from one measurement, so a variant
    whose graph changed has every variant timed again.
    """
    from edge.runtime import cpu_name

    recipe = ctx.recipe
    graph = clean_name(DEPLOYED)
    graphs = {run.variant.name: (run.folder / graph, record.outputs[graph]) for run, record in zip(runs, cleaned)}
    graphs |= {run.name: (run.folder / DEPLOYED, record.outputs[DEPLOYED]) for run, record in precisions}
    reference = reference_variant(recipe)
    inputs = {"graphs": {name: digest for name, (_, digest) in graphs.items()}, "reference": reference,
              "settings": dataclasses.asdict(recipe.profile),
              "threads": recipe.threads, "seed": recipe.seed,
              "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count()}}

    def work() -> dict:
        from edge.latency.fresh import time_fresh_settings
        from edge.profile.sidebyside import SideBySideConfig

        # in a new interpreter, as edge plan times its front (edge.latency.fresh: a process after a plan search
        # timed its plan 2.19x, a new one 1.87-1.91x): this one's heap and thread pools are not a user's
        settings = dataclasses.asdict(recipe.profile)
        processes = settings.pop("processes") or recipe.profile.sessions    # None: one per session set
        config = SideBySideConfig(**settings, seed=recipe.seed)
        summary = time_fresh_settings({name: path for name, (path, _) in graphs.items()}, reference, config,
                                      recipe.threads, seed=recipe.seed, processes=processes)
        return {**summary, "graph": graph}

    return step(ctx, SHARED, "profile", ctx.out, inputs, work)


def run_plan(ctx: Context) -> StepRecord | None:
    """``edge plan``'s search to the recipe's budget on its target, into ``OUT/plan`` (its model: the planned
    variant)."""
    settings, recipe = ctx.recipe.plan, ctx.recipe
    if settings is None:
        return None
    inputs = {"source": ctx.source_hash, "architecture": [recipe.model, recipe.img_size], "data": ctx.train_hash,
              "settings": dataclasses.asdict(settings), "seed": recipe.seed, "threads": recipe.threads,
              "table": sha256_file(Path(settings.table)) if settings.table else None}

    def work() -> dict:
        from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget
        from edge.planner.search import SearchConfig

        search = SearchConfig(budget=settings.budget, data=ctx.data, samples=settings.samples,
                              holdout=settings.holdout, seed=recipe.seed, shortlist=settings.shortlist,
                              refresh=settings.refresh, min_step=settings.min_step)
        estimate = settings.backend == "estimate"
        target = TargetConfig(table=settings.table, backend=settings.backend, precision=settings.precision,
                              batch=settings.batch, threads=None if estimate else recipe.threads,
                              power_mode=settings.power_mode if estimate else None)
        # no whole-model timing in the search: the pipeline times the chosen plan beside every variant
        record = plan_to_budget(ctx.model, ctx.source, ctx.out / PLAN,
                                PlanJobConfig(search=search, target=target, measure=0, correct=0), progress=log)
        return plan_summary(record)

    return step(ctx, SHARED, "plan", ctx.out, inputs, work, (PLAN,))


def plan_summary(record: dict) -> dict:
    """What the report keeps of ``plan.json``: the budget, the target, the choice, every round and why, the front."""
    result = record["result"]
    rounds = [{k: r[k] for k in ("round", "method", "move", "label", "plan", "kl", "agreement", "predicted_ms",
                                  "saved_ms", "cost_kl_per_ms", "why", "measured")} for r in result["rounds"]]
    return {"budget": record["budget"], "budget_ms": record["budget_ms"], "target": record["target"],
            "table": record["table"], "search": record["search"], "chosen": result["chosen"],
            "original": result["original"], "rounds": rounds, "front": result["front"],
            "measured_plans": len(result["points"]), "refused": len(result["refused"]), "builds": result["builds"],
            "methods": result["methods"], "seconds": result["seconds"],
            "files": {k: f"{PLAN}/{v}" for k, v in (("record", "plan.json"), ("markdown", "plan.md"),
                                                     ("plot", "pareto.png"), ("model", ARTIFACT))}}


def run_bundle(ctx: Context, runs: dict[str, VariantRun], cleaned: dict[str, StepRecord],
               precisions: Sequence[tuple[PrecisionRun, StepRecord]] = ()) -> StepRecord | None:
    """``edge bundle`` of the recipe's variants' cleaned static-batch graphs into ``OUT/bundle``. A precision the
    run already made (``precisions``: the graphs the report evaluated) is shipped as it is, not made again; one
    that fell below the accuracy gate is left out (edge bundle refuses it)."""
    settings = ctx.recipe.bundle
    if settings is None:
        return None
    graph = clean_name(DEPLOYED)
    below_gate, made = set(), {}
    for p, record in precisions:
        key = (p.base.variant.name, p.precision)
        if p.below_gate(record):
            below_gate.add(key)
        else:
            made[key] = (p.folder / DEPLOYED, record.outputs[DEPLOYED])
    kept = {name: tuple(p for p in settings.precisions if (name, p) not in below_gate) for name in settings.variants}
    inputs = {"graphs": {name: cleaned[name].outputs[graph] for name in settings.variants},
              "made": {f"{n}.{p}": digest for (n, p), (_, digest) in sorted(made.items())},
              "settings": dataclasses.asdict(settings), "data": ctx.train_hash, "precisions": kept}

    def work() -> dict:
        from edge.bundle import BundleConfig, SourceGraph, make_bundle

        config = BundleConfig(precisions=settings.precisions, data=ctx.data, check_data=ctx.gate_data,
                              samples=settings.samples,
                              gate_images=settings.gate_images)
        graphs = [SourceGraph(name, runs[name].folder / graph, kept[name],
                              {p: path for (n, p), (path, _) in made.items() if n == name and p in kept[name]})
                  for name in settings.variants if kept[name]]
        manifest = make_bundle(graphs, ctx.out / BUNDLE, config, force=True, progress=log,
                               source={"kind": "pipeline",
                                       "paths": [f"{VARIANTS}/{n}/{graph}" for n in settings.variants]})
        return {"folder": BUNDLE, "variants": [f"{v['name']}.{v['precision']}" for v in manifest["variants"]],
                "files": len(manifest["files"]), "precisions": list(settings.precisions),
                "left_out": sorted(f"{n}.{p}" for n, p in below_gate if n in kept and p in settings.precisions),
                "reused": sorted(f"{n}.{p}" for n, p in made if n in kept and p in kept[n]),
                "gate_images": settings.gate_images}

    return step(ctx, SHARED, "bundle", ctx.out, inputs, work, (BUNDLE,))


def run_pipeline(recipe: Recipe, out: str | Path, *, redo: tuple[str, ...] = ()) -> dict:
    """Run (or find in the cache) every step of ``recipe`` in ``out``; write the reports; return report.json."""
    import torch

    from edge.compress.artifact import source_state_sha256
    from edge.compress.load import load_model
    from edge.models import model_info
    from edge.pipeline.report.model import build_report
    from edge.pipeline.report.write import write_reports
    from edge.runtime import set_threads

    start = time.perf_counter()
    out = Path(out)
    unknown = sorted(set(redo) - set(STEPS))
    if unknown:
        raise EdgeError(f"--redo {unknown[0]} is not a step", expected=f"one of {', '.join(STEPS)}")
    check_out_dir(out)
    set_threads(recipe.threads)
    data, notice = resolve_data(recipe)
    if notice:
        log(f"edge pipeline: {notice}")
    torch.manual_seed(recipe.seed)  # timm architectures without weights: the same random model every run
    model = load_model(recipe.model, weights=recipe.weights, img_size=recipe.img_size)
    check_plans(recipe, model_info(model).num_blocks)
    ctx = Context(recipe, out, StepCache(redo), data, model, source_state_sha256(model))
    out.mkdir(parents=True, exist_ok=True)
    log(f"edge pipeline: {plural(len(recipe.variants), 'variant')} of {recipe.model} on {data} -> {out}")
    analysis = run_analysis(ctx)
    planned = run_plan(ctx)
    runs: list[VariantRun] = []
    for variant in recipe.run_variants():
        if variant.searched:
            assert planned is not None  # a searched variant comes from the plan section
            runs.append(PlannedRun(ctx, variant, planned))
        else:
            runs.append(VariantRun(ctx, variant))
    reference = reference_variant(recipe)   # first: the other variants' subset figures are paired with its own
    order = sorted(range(len(runs)), key=lambda i: runs[i].variant.name != reference)
    done = {i: runs[i].run() for i in order}
    cleaned = [done[i] for i in range(len(runs))]
    by_name = {run.variant.name: (run, record) for run, record in zip(runs, cleaned)}
    precisions = []
    if recipe.precision is not None:
        for name in recipe.precision.variants:
            base, record = by_name[name]
            for precision in recipe.precision.precisions:
                precision_run = PrecisionRun(base, precision)
                precisions.append((precision_run, precision_run.run(record)))
    latency = run_profile(ctx, runs, cleaned, precisions)
    bundle = run_bundle(ctx, {n: r for n, (r, _) in by_name.items()}, {n: c for n, (_, c) in by_name.items()},
                        precisions)
    ort_log = write_ort_messages(out)
    report = build_report(ctx, runs, analysis, latency, ort_log, notice, time.perf_counter() - start,
                          planned=planned, precisions=[p for p, _ in precisions], bundle=bundle)
    write_reports(out, report)
    return report


def write_ort_messages(out: Path) -> dict:
    """ONNX Runtime's notes of this run (kept off the terminal) to ``OUT/onnxruntime.log``, with their count."""
    from edge.check.compare import ORT_MESSAGES, write_ort_log

    lines = ORT_MESSAGES.take()
    path = out / ORT_LOG
    if not lines:
        path.unlink(missing_ok=True)
        return {"lines": 0, "file": None}
    write_ort_log(lines, path)
    log(f"edge pipeline: {len(lines)} ONNX Runtime notes (warnings about its own optimisations, not errors) "
        f"are in {path}")
    return {"lines": len(lines), "file": ORT_LOG}
