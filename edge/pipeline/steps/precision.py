"""A variant's FP16 or INT8 graphs: the quantize step (``edge quantize`` of its two cleaned graphs), then their
evaluation, paired with float32 on the same images."""

from __future__ import annotations

from edge.pipeline.cache import StepRecord
from edge.pipeline.layout import BATCHED, DEPLOYED, clean_name, reference_variant
from edge.pipeline.steps.context import step
from edge.pipeline.steps.evaluate import evaluate_graph
from edge.pipeline.steps.variant import VariantRun


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
