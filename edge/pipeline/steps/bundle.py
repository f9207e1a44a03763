"""The bundle step: ``edge bundle`` of the recipe's variants into ``OUT/bundle``, shipping the FP16/INT8 graphs the
run already made and evaluated."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from edge.pipeline.cache import StepRecord
from edge.pipeline.layout import BUNDLE, DEPLOYED, VARIANTS, clean_name
from edge.pipeline.steps.context import SHARED, Context, step
from edge.pipeline.steps.precision import PrecisionRun
from edge.pipeline.steps.variant import VariantRun
from edge.progress import log


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
