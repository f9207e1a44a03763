"""The steps of the main job, each one library call run through the :class:`~edge.pipeline.cache.StepCache`,
so a rerun redoes only the steps whose inputs changed. ``edge.pipeline.run`` runs them in order.

One job a module, each importing only the ones below it (``.importlinter``):

    analysis, plan, profile, bundle   the steps over the whole run: the original's analysis, the plan search,
                                      every graph timed side by side (one measurement), the bundle
    precision    a variant's FP16/INT8 graphs: quantize, evaluate
    variant      a variant's float32 steps: compress, count, export, clean, verify, evaluate, estimate
    evaluate     a graph's accuracy on its test images (the headline's, or the fixed subset), paired figures
    context      what every step of a run shares, and :func:`~edge.pipeline.steps.context.step`, which runs one
"""
