"""``edge pipeline``: the main job, a recipe of variants measured end to end, with a report."""

from __future__ import annotations

from edge.cli.common import add_command, add_data_option, add_field, add_out_folder, emit
from edge.cli.options import ExistingFile

EXAMPLES = """  edge pipeline --out runs/pipeline                    # the built-in default recipe
  edge pipeline --print-recipe > recipe.yaml           # start your own recipe from it
  edge pipeline --recipe recipe.yaml --out runs/mine --json
  edge pipeline --out runs/pipeline --redo profile     # measure latency again, keep the rest"""


def register(subparsers) -> None:
    from edge.pipeline import STEPS

    parser = add_command(
        subparsers, "pipeline", "run a recipe: compress, export, clean, verify, evaluate, count and profile variants",
        "A recipe (YAML; `--print-recipe` shows the built-in default) names a model, data and variants (the\n"
        "original plus compression plans). For each variant: compress, count params and FLOPs, export to ONNX,\n"
        "clean, verify against PyTorch, evaluate accuracy with ONNX Runtime; then every variant's latency,\n"
        "side by side in one run (interleaved rounds, an A/A control), with its speedup against the\n"
        "original and a confidence interval. Writes OUT/report.json, OUT/report.md and a self-contained\n"
        "OUT/report.html (table, accuracy-vs-latency chart with the Pareto front, analysis heatmaps).\n"
        "Steps whose inputs (content hashes) did not change are not redone; when any variant changed, all\n"
        "are timed again together. Exit status 1 when a cleaned graph disagrees with its PyTorch model, 2 for a bad\n"
        "recipe (nothing is written then).", EXAMPLES)
    from edge.pipeline.recipe import Recipe

    parser.add_argument("--recipe", metavar="FILE", type=ExistingFile(
                        "recipe", fix="`edge pipeline --print-recipe > recipe.yaml` writes one to edit"),
                        help="recipe file (YAML); default: the built-in recipe")
    add_out_folder(parser, "output folder (reused: cached steps are not redone)", required=False)
    add_data_option(parser, None, "override the recipe's data (no fallback then)")
    add_field(parser, "--threads", Recipe, default=None, help="override the recipe's threads")
    parser.add_argument("--redo", action="append", default=[], choices=STEPS,
                        help="run this step again even where cached (repeatable)")
    parser.add_argument("--print-recipe", action="store_true", help="print the built-in default recipe and exit")
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.errors import EdgeError
    from edge.pipeline import default_recipe_text, load_recipe, run_pipeline, with_overrides

    if args.print_recipe:
        print(default_recipe_text(), end="")
        return 0
    if not args.out:
        raise EdgeError("edge pipeline needs --out DIR", fix="e.g. edge pipeline --out runs/pipeline")
    recipe = with_overrides(load_recipe(args.recipe), data=args.data, threads=args.threads)
    report = run_pipeline(recipe, args.out, redo=tuple(args.redo))
    lines = summary_lines(report)
    lines.append(f"wrote {args.out}/report.html, report.md, report.json")
    emit(report, args.json, "\n".join(lines))
    if not report["passed"]:
        import sys

        print(f"edge pipeline: a graph failed verification; see {args.out}/report.json", file=sys.stderr)
        return 1
    return 0


def summary_lines(report: dict) -> list[str]:
    from edge.pipeline.report import speedup_cell

    latency = report["latency"]
    width = max(len(v["name"]) for v in report["variants"])
    lines = [f"{'variant':<{width}}  {'accuracy':>8}  {'median ms':>9}  {'speedup [95 % interval]':<26}  "
             f"{'MFLOPs':>7}  plan"]
    for v in report["variants"]:
        verdict = "reference" if v["name"] == latency["reference"] else v["speedup"]["verdict"]
        lines.append(f"{v['name']:<{width}}  {100 * v['accuracy']:>7.2f}%  {v['latency']['median_ms']:>9.3f}  "
                     f"{speedup_cell(v['speedup']):<26}  {v['flops'] / 1e6:>7.1f}  {v['plan'] or '(original)'}  "
                     f"{verdict}" + ("  *" if v["pareto"] else ""))
    aa = latency["aa_control"]
    bound = latency["settings"]["aa_tolerance"]
    lines.append(f"A/A control ({aa['of']} against itself): {speedup_cell(aa)}, "
                 f"deviation {100 * aa['deviation']:.1f} % "
                 + (f"> {100 * bound:.0f} %: too noisy to rank variants that close; rerun with --redo profile on a "
                    "quieter machine" if latency["noisy"] else f"<= {100 * bound:.0f} %"))
    lines.append(f"* Pareto front; {report['steps']['ran']} steps ran, {report['steps']['cached']} cached, "
                 f"{report['seconds']:.1f} s")
    return lines
