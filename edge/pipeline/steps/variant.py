"""The float32 steps of one variant: compress, count, export, clean, verify, evaluate, estimate; and the planned
variant, whose artifact the plan step made."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from functools import cached_property
from pathlib import Path

from torch import nn

from edge.fileio import sha256_file
from edge.pipeline.cache import StepRecord
from edge.pipeline.layout import (
    ARTIFACT,
    BATCHED,
    DEPLOYED,
    PLAN,
    VARIANTS,
    clean_name,
    headline_variants,
    reference_variant,
)
from edge.pipeline.recipe import Variant
from edge.pipeline.steps.context import Context, step
from edge.pipeline.steps.evaluate import evaluate_graph

VERIFY_BATCH = 8


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
            from edge.latency import model_parts, orin, predict_parts

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
