"""The names a pipeline run shares between its runner, its recipe and its report: steps and files in ``OUT``.

``OUT/variants/NAME/`` holds a variant's files: ``model/`` (the compressed artifact, variants with
a plan), :data:`DEPLOYED` (static batch: verified, cleaned, profiled), :data:`BATCHED` (dynamic
batch: accuracy), and the cleaned graph of each (:func:`clean_name`).
"""

VARIANT_STEPS = ("compress", "count", "export", "clean", "verify", "evaluate", "profile")
STEPS = ("analysis", *VARIANT_STEPS)  # the step names of a run (``--redo`` choices)

VARIANTS = "variants"  # OUT/variants/NAME/
ARTIFACT = "model"     # OUT/variants/NAME/model/
DEPLOYED, BATCHED = "model.onnx", "model.batched.onnx"


def clean_name(graph: str) -> str:
    return graph.removesuffix(".onnx") + ".clean.onnx"
