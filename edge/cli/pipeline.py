"""``edge pipeline``: the main job, a recipe of variants measured end to end, with a report."""

from __future__ import annotations

from edge.cli.common import add_command, add_data_option, add_field, add_out_folder, emit

EXAMPLES = """  edge pipeline --out runs/pipeline                    # the built-in recipe (what scripts/main.sh runs)
  edge pipeline --print-recipe > recipe.yaml           # start your own recipe from it
  edge pipeline --recipe spans --out runs/spans        # the three-span recipe of earlier releases
  edge pipeline --recipe recipe.yaml --out runs/mine --json
  edge pipeline --out runs/pipeline --redo profile     # measure latency again, keep the rest"""


def register(subparsers) -> None:
    from edge.pipeline import STEPS

    parser = add_command(
        subparsers, "pipeline", "run a recipe: plan, compress, export, clean, verify, evaluate, quantize, profile, "
        "bundle",
        "A recipe (YAML; `--print-recipe` shows the built-in one) names a model, data and variants (the\n"
        "original plus compression plans), and optionally a plan search to a latency budget on a target\n"
        "(edge plan; its choice becomes a variant), FP16/INT8 graphs of some variants (edge quantize), each\n"
        "variant's Orin Nano estimate and a bundle (edge bundle). For each variant: compress, count params and\n"
        "FLOPs, export to ONNX, clean, verify against PyTorch, evaluate accuracy with ONNX Runtime; then every\n"
        "graph's latency side by side in one run (interleaved rounds, an A/A control), with its speedup\n"
        "against the original and a confidence interval. Writes OUT/report.json, OUT/report.md and a\n"
        "self-contained OUT/report.html (the plan and why, the variants, precision, the Orin estimate, the\n"
        "bundle and the commands to deploy it; accuracy-vs-speed chart, analysis heatmaps).\n"
        "Steps whose inputs (content hashes) did not change are not redone; when any variant changed, all\n"
        "are timed again together. Exit status 1 when a cleaned graph disagrees with its PyTorch model, 2 for a bad\n"
        "recipe (nothing is written then).", EXAMPLES)
    from edge.cli.options import Text
    from edge.pipeline.recipe import Recipe, named_recipes

    parser.add_argument("--recipe", metavar="FILE", type=Text(),  # a missing file: load_recipe names the shipped ones
                        help="recipe file (YAML), or a shipped recipe by name: "
                        f"{' or '.join(named_recipes())} (default: the built-in recipe)")
    add_out_folder(parser, "output folder (reused: cached steps are not redone)", required=False)
    add_data_option(parser, None, "override the recipe's data (no fallback then)")
    add_field(parser, "--threads", Recipe, default=None, help="override the recipe's threads")
    parser.add_argument("--full-split", action="store_true",
                        help="every graph's accuracy on the whole test split (default: the original and the planned "
                             "model; the other graphs on the recipe's evaluate.subset, 2,000 images)")
    parser.add_argument("--redo", action="append", default=[], choices=STEPS,
                        help="run this step again even where cached (repeatable)")
    parser.add_argument("--print-recipe", nargs="?", const="default", metavar="NAME", choices=["default", *named_recipes()],
                        help="print the built-in recipe (or the shipped recipe NAME) and exit")
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.errors import EdgeError
    from edge.pipeline import default_recipe_text, load_recipe, run_pipeline, with_overrides

    if args.print_recipe:
        print(default_recipe_text(args.print_recipe), end="")
        return 0
    if not args.out:
        raise EdgeError("edge pipeline needs --out DIR", fix="e.g. edge pipeline --out runs/pipeline")
    recipe = with_overrides(load_recipe(args.recipe), data=args.data, threads=args.threads,
                            full_split=args.full_split)
    report = run_pipeline(recipe, args.out, redo=tuple(args.redo))
    lines = summary_lines(report)
    lines.append(f"wrote {args.out}/report.html, report.md, report.json")
    lines += next_lines(report)
    emit(report, args.json, "\n".join(lines))
    if not report["passed"]:
        import sys

        print(f"edge pipeline: a graph failed verification; see {args.out}/report.json", file=sys.stderr)
        return 1
    return 0


def summary_lines(report: dict) -> list[str]:
    from edge.pipeline.report.tables import speedup_cell

    latency, plan, orin = report["latency"], report["plan"], report["orin_estimate"]
    lines = []
    if plan:
        chosen, original = plan["chosen"], plan["original"]
        target = plan["target"]
        lines.append(f"plan: budget {plan['budget']:g}x on {target['device']} ({target['backend']}, "
                     f"{target['precision']}): chose {chosen['plan']} -> `{plan['variant']}`, "
                     f"{original['predicted_ms'] / chosen['predicted_ms']:.2f}x predicted, held-out agreement "
                     f"{100 * chosen['agreement']:.2f} % ({len(plan['rounds'])} rounds)")
    rows = [*report["variants"], *report["precision"]]
    estimates = {r["name"]: r for r in orin["rows"]} if orin else {}
    width = max(len(v["name"]) for v in rows)
    lines.append(f"{'variant':<{width}}  {'accuracy':>8}  {'median ms':>9}  {'speedup [95 % interval]':<26}  "
                 f"{'Orin est.':>9}  plan")
    for v in rows:
        verdict = "reference" if v["name"] == latency["reference"] else v["speedup"]["verdict"]
        if v["speedup"].get("noisy") and v["name"] != latency["reference"]:
            verdict += f", noisy ({100 * v['speedup']['process_spread']:.1f} % across timing processes)"
        estimate = estimates.get(v["name"])
        orin_cell = f"{estimate['speedup']:.2f}x" if estimate else "-"
        accuracy = f"{100 * v['accuracy']:.2f}%" + ("\N{DAGGER}" if v["samples"] != report["variants"][0]["samples"]
                                                     else "")
        lines.append(f"{v['name']:<{width}}  {accuracy:>8}  {v['latency']['median_ms']:>9.3f}  "
                     f"{speedup_cell(v['speedup']):<26}  {orin_cell:>9}  {v['plan'] or '(original)'}  "
                     f"{verdict}" + ("  *" if v.get("pareto") else ""))
    aa = latency["aa_control"]
    bound = latency["settings"]["aa_tolerance"]
    lines.append(f"A/A control ({aa['of']} against itself): {speedup_cell(aa)}, "
                 f"deviation {100 * aa['deviation']:.1f} % "
                 + (f"> {100 * bound:.0f} %: too noisy to rank variants that close; rerun with --redo profile on a "
                    "quieter machine" if latency["noisy"] else f"<= {100 * bound:.0f} %"))
    first = report["variants"][0]
    subsets = [v for v in rows if v["samples"] != first["samples"]]
    if subsets:
        label = subsets[0].get("images") or f"{subsets[0]['samples']:,} images"
        lines.append(f"\N{DAGGER} accuracy on a {label} of the test split (balanced; the others: "
                     f"{first.get('images') or first['samples']}), paired with the same images: "
                     + ", ".join(f"{v['name']} {v.get('accuracy_delta_pt_vs_fp32', v['accuracy_delta_pt']):+.2f} pt "
                                 f"vs {'float32' if 'accuracy_delta_pt_vs_fp32' in v else latency['reference']}"
                                 for v in subsets) + "; `--full-split`: every graph on the whole split")
    if orin:
        lines.append(f"Orin est.: speedup on a {orin['device']} ({orin['power_mode']}), estimated, not measured: "
                     f"{orin['note']}")
    lines.append(f"* Pareto front; {report['steps']['ran']} steps ran, {report['steps']['cached']} cached, "
                 f"{report['seconds']:.1f} s")
    if report["bundle"]:
        lines.append(f"bundle: {report['bundle']['path']} ({', '.join(report['bundle']['variants'])})")
    return lines


def next_lines(report: dict) -> list[str]:
    return ["next, on a Jetson:", *(f"  {command}" for command in report["next_commands"])]
