"""The names a pipeline run shares between its runner, its recipe and its report: steps and files in ``OUT``.

``OUT/variants/NAME/`` holds a variant's files: ``model/`` (the compressed artifact, variants with
a plan), :data:`DEPLOYED` (static batch: verified, cleaned, profiled), :data:`BATCHED` (dynamic
batch: accuracy), and the cleaned graph of each (:func:`clean_name`); ``fp16/`` and ``int8/`` the
same two graphs at that precision. ``OUT/plan/`` is the plan search's folder (its ``model/`` the
planned variant's artifact), ``OUT/bundle/`` the bundle for the devices. ``OUT/report.json`` (with
``report.md`` and ``report.html``) is the report; ``OUT/device/`` holds what ``edge deploy --report OUT``
fetched from the devices.
"""

VARIANT_STEPS = ("compress", "count", "export", "clean", "verify", "evaluate")
PRECISION_STEPS = ("quantize", "evaluate")  # OUT/variants/NAME/PRECISION/: a variant's fp16 or int8 graphs
# the step names of a run (``--redo`` choices); plan, profile and bundle: one step for all variants
STEPS = ("analysis", "plan", *VARIANT_STEPS, "estimate", "quantize", "profile", "bundle")

VARIANTS = "variants"  # OUT/variants/NAME/
ARTIFACT = "model"     # OUT/variants/NAME/model/
DEPLOYED, BATCHED = "model.onnx", "model.batched.onnx"
REPORT = "report.json"  # OUT/report.json (report.md, report.html beside it)
DEVICE_RESULTS = "device"  # OUT/device/LABEL/: one device's fetched results
PLAN = "plan"          # OUT/plan/: edge plan's folder (plan.json, plan.md, pareto.png, model/)
BUNDLE = "bundle"      # OUT/bundle/: what edge bundle makes, for edge deploy
ORT_LOG = "onnxruntime.log"  # OUT/onnxruntime.log: ONNX Runtime's notes, kept off the terminal


def clean_name(graph: str) -> str:
    return graph.removesuffix(".onnx") + ".clean.onnx"


def reference_variant(recipe) -> str:
    """The variant the others' speedups are measured against: the first without a plan, else the first."""
    return next((v.name for v in recipe.variants if v.plan is None), recipe.variants[0].name)


def headline_variants(recipe) -> set[str]:
    """The variants whose float32 accuracy is the headline, on ``evaluate.samples`` (the whole test split): the
    reference (the original) and the planned model."""
    return {reference_variant(recipe), *([recipe.plan.name] if recipe.plan is not None else [])}
