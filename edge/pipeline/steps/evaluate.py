"""The evaluate step: a graph's top-1 accuracy on its test images (the headline's, or the one fixed subset within
them), with every image's prediction, and its float32 variants' figures on the same images (paired)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from edge.errors import EdgeError
from edge.pipeline.cache import StepRecord
from edge.pipeline.layout import headline_variants
from edge.pipeline.steps.context import Context, step


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
        from edge.check.compare import concurrent_calls
        from edge.check.onnx_classifier import OnnxClassifier
        from edge.data import InputSpec

        dataset = ctx.test_set
        if picked is not None:
            dataset = dataset.subset(picked, f"{dataset.name}[{len(picked)}]")
        calls, threads = concurrent_calls(recipe.threads)
        classifier = OnnxClassifier(folder / graph, threads=threads, calls=calls)
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
