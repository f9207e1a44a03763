"""What every step of one run shares (the recipe, the folder, the cache, the source model, its data), and
:func:`step`, which runs one step through the cache and records it."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from torch import nn

from edge.pipeline.cache import StepCache, StepRecord
from edge.pipeline.recipe import Recipe
from edge.progress import log


def data_fingerprint(dataset) -> str:
    """sha256 of a split's pixels and labels (in-memory sets) or of its files and labels (image folders)."""
    return dataset.fingerprint()


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
