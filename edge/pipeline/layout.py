"""The names a pipeline run shares between its runner, its recipe and its report: steps and files in ``OUT``.

``OUT/variants/NAME/`` holds a variant's files: ``model/`` (the compressed artifact, variants with
a plan), :data:`DEPLOYED` (static batch: verified, cleaned, profiled), :data:`BATCHED` (dynamic
batch: accuracy), and the cleaned graph of each (:func:`clean_name`). ``OUT/report.json`` (with
``report.md`` and ``report.html``) is the report; ``OUT/device/`` holds what ``edge deploy --report OUT``
fetched from the devices.
"""

VARIANT_STEPS = ("compress", "count", "export", "clean", "verify", "evaluate")
STEPS = ("analysis", *VARIANT_STEPS, "profile")  # the step names of a run (``--redo`` choices); profile: all variants

VARIANTS = "variants"  # OUT/variants/NAME/
ARTIFACT = "model"     # OUT/variants/NAME/model/
DEPLOYED, BATCHED = "model.onnx", "model.batched.onnx"
REPORT = "report.json"  # OUT/report.json (report.md, report.html beside it)
DEVICE_RESULTS = "device"  # OUT/device/LABEL/: one device's fetched results
ORT_LOG = "onnxruntime.log"  # OUT/onnxruntime.log: ONNX Runtime's notes, kept off the terminal


def clean_name(graph: str) -> str:
    return graph.removesuffix(".onnx") + ".clean.onnx"
