import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from edge.cli import main
from edge.errors import EdgeError
from edge.fileio import sha256_file
from edge.pipeline import STEPS, add_device_results, device_report, load_recipe
from edge.pipeline.cache import StepCache
from edge.pipeline.layout import VARIANT_STEPS
from edge.pipeline.recipe import parse_recipe
from edge.pipeline.report.html_page import html_report
from edge.pipeline.report.markdown import markdown
from edge.pipeline.report.model import pareto_front
from edge.pipeline.report.tables import table_rows
from tests.conftest import TINY, needs_fmnist


def recipe_text(weights, lin_plan="linear:1-3", extra="") -> str:
    return f"""model: {TINY}
weights: {weights}
data: fmnist-mini
calibration: {{samples: 40}}
analysis: {{samples: 40}}
evaluate: {{samples: 200, batch_size: 100}}
profile: {{warmup: 2, rounds: 4, sessions: 2, iterations: 5}}
{extra}variants:
  - name: original
  - name: lin
    plan: {lin_plan}
"""


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, weights):
    root = tmp_path_factory.mktemp("pipeline")
    recipe = root / "recipe.yaml"
    recipe.write_text(recipe_text(weights))
    out = root / "out"
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out)]) == 0
    return recipe, out, json.loads((out / "report.json").read_text())


def _statuses(report: dict) -> dict:
    return {v["name"]: {s: r["status"] for s, r in v["steps"].items()} for v in report["variants"]}


def test_report_files_and_fields(first_run):
    recipe, out, report = first_run
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert report["recipe"]["model"] == TINY and report["recipe"]["source"] == str(recipe)
    assert report["data"]["used"] == "fmnist-mini" and report["data"]["fallback_notice"] is None
    assert report["threads"] == 2 and report["hardware"]["cpu_count"] >= 1
    assert report["versions"]["onnxruntime"] and report["versions"]["torch"].startswith("2.13.0")
    original, lin = report["variants"]
    assert (original["plan"], lin["plan"], lin["requested_plan"]) == (None, "linear:1-3", "linear:1-3")
    assert lin["params"] < original["params"] and lin["flops"] < original["flops"]
    for v in (original, lin):
        assert v["samples"] == 200 and 0.0 <= v["accuracy"] <= 1.0 and v["correct"] == round(200 * v["accuracy"])
        assert v["verification"]["passed"] and v["verification"]["max_abs"] <= 1e-4
        assert set(v["verification"]["clean_vs_torch"]) == {"model.clean.onnx", "model.batched.clean.onnx"}
        deployed = v["graphs"]["model.onnx"]
        assert deployed["batch"] == 1 and v["graphs"]["model.batched.onnx"]["batch"] == "dynamic"
        assert 0 < deployed["nodes_after_clean"] <= deployed["nodes_before_clean"]
        latency, speedup = v["latency"], v["speedup"]
        assert latency["iterations"] == 4 * 5 and latency["min_ms"] <= latency["median_ms"] <= latency["p99_ms"]
        assert latency["p10_ms"] <= latency["median_ms"] <= latency["p90_ms"] and len(latency["round_medians_ms"]) == 4
        assert latency["cv"] >= 0 and v["profile"]["threads"] == 2 and v["profile"]["precision"] == "float32"
        assert speedup["low"] <= speedup["speedup"] <= speedup["high"] and speedup["rounds"] == 4
        assert set(v["steps"]) == set(VARIANT_STEPS) - ({"compress"} if v["plan"] is None else set())
        assert all(s["status"] == "ran" for s in v["steps"].values())
        assert (out / deployed["clean_file"]).is_file()
    assert original["speedup"] == {**original["speedup"], "speedup": 1.0, "low": 1.0, "high": 1.0}
    # all variants and the A/A control were timed in one run, their sessions created afresh in rotated order
    timing = report["latency"]
    assert timing["reference"] == "original" and timing["steps"]["profile"]["status"] == "ran"
    assert timing["creation_orders"] == [["original", "lin", "original (A/A)"], ["lin", "original (A/A)", "original"]]
    aa = timing["aa_control"]
    assert aa["of"] == "original" and aa["low"] <= aa["speedup"] <= aa["high"]
    assert aa["deviation"] == max(abs(aa[k] - 1) for k in ("speedup", "low", "high"))
    assert timing["noisy"] == (aa["deviation"] > 0.03) and timing["settings"]["aa_tolerance"] == 0.03
    assert timing["onnxruntime"] == report["versions"]["onnxruntime"] and timing["threads"] == 2
    assert timing["settings"]["warmup"] == 2 and set(timing["iterations_per_round"].values()) == {5}
    # processes: null, so each of the 2 session sets in its own new process, pooled into one comparison
    assert timing["processes"] == 2 and timing["contention"]["processes"] == 2
    assert "one per new process (2 processes, one after the other, their timings pooled)" in \
        (out / "report.md").read_text()
    assert original["accuracy_delta_pt"] == 0.0
    assert lin["accuracy_delta_pt"] == pytest.approx(100 * (lin["accuracy"] - original["accuracy"]), abs=1e-6)
    assert (out / lin["artifact"] / "edge-model.json").is_file() and original["artifact"] is None
    assert report["pareto_front"] and set(report["pareto_front"]) <= {"original", "lin"}
    # constant folding of the dynamic-batch graphs makes ONNX Runtime note Unsqueezes it cannot remove
    assert report["onnxruntime_log"]["lines"] == len((out / "onnxruntime.log").read_text().splitlines()) > 0
    assert report["analysis"]["num_blocks"] == 4 and len(report["analysis"]["block_redundancy"]) == 4
    assert all((out / p).is_file() for p in report["analysis"]["pictures"].values())
    table = (out / "report.md").read_text()
    assert "| lin | linear:1-3 |" in table and f"{100 * lin['accuracy']:.2f}" in table
    assert f"{lin['speedup']['speedup']:.3f}x [{lin['speedup']['low']:.3f}, {lin['speedup']['high']:.3f}]" in table
    assert ("Too noisy to rank" in table) == timing["noisy"] and "A/A control" in table


def test_html_report_is_self_contained(first_run):
    _, out, report = first_run
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]+"', page)
    assert len(images) == 1 + len(report["analysis"]["pictures"])  # the Pareto chart and the heatmaps
    stripped = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert "<table>" in stripped and "Pareto" in stripped
    for external in ("http:", "https:", "//", "<link", "<script", "@import", "url("):
        assert external not in stripped, external


@dataclass(frozen=True)
class Fetched:
    """A device folder's results as edge.deploy.fetched_devices reads them back."""

    folder: Path
    record: dict
    run: dict | None
    results: dict


def test_device_results_are_rendered_by_the_reports_one_writer(first_run, tmp_path):
    """``edge deploy --report`` hands the fetched results to edge.pipeline: report.json gains ``device``;
    report.md and report.html are the pipeline's own followed by the device section, as before the writer
    was one (deploy appended the section to the pipeline's rendering)."""
    _, out, report = first_run
    run = Path(shutil.copytree(out, tmp_path / "run"))
    record = {"host": "nvidia@jetson", "label": "nvidia@jetson_22", "status": "failed", "error": "no route",
              "finished": "2026-11-26T20:00:00+00:00"}
    summary = {"backend": "ort", "variants": {"original.fp32": {"status": "done", "result": "original.fp32.json"}}}
    result = {"variant": "original", "precision": "fp32", "backend": "onnxruntime",
              "latency": {k: 1.5 for k in device_report.LATENCY_KEYS}}
    fetched = [Fetched(run / "device" / record["label"], record, summary, {"original.fp32": result})]
    assert add_device_results(run, fetched) == run / "report.json"
    written = json.loads((run / "report.json").read_text())
    section = written.pop("device")
    assert written == report  # the pipeline's own sections kept as they were
    assert section["failed"] == ["nvidia@jetson_22"] and section["devices"][0]["folder"] == "device/nvidia@jetson_22"
    assert section["devices"][0]["variants"][0]["latency"]["median_ms"] == 1.5
    assert section["devices"][0]["variants"][0]["result"] == "device/nvidia@jetson_22/results/original.fp32.json"
    expected_md = markdown(report).rstrip("\n") + "\n\n" + "\n".join(device_report.device_markdown(section))
    assert (run / "report.md").read_text() == expected_md
    head, tail = html_report(report, run).rsplit("</body>", 1)
    assert (run / "report.html").read_text() == f"{head}{device_report.device_html(section)}\n</body>{tail}"


def test_second_run_is_fully_cached_and_identical(first_run, capsys):
    recipe, out, report = first_run
    capsys.readouterr()
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    again = json.loads(captured.out)
    assert again["steps"] == {"ran": 0, "cached": report["steps"]["ran"]}
    assert again["analysis"]["steps"]["analysis"]["status"] == "cached"
    assert again["latency"]["steps"]["profile"]["status"] == "cached"
    assert all(status == "cached" for steps in _statuses(again).values() for status in steps.values())
    for before, after in zip(report["variants"], again["variants"]):
        for key in ("plan", "accuracy", "correct", "params", "flops", "latency", "speedup", "verification"):
            assert before[key] == after[key], key
    assert "[lin] export: cached" in captured.err and "ran in" not in captured.err
    assert [row[:-1] for row in table_rows(again)] == [row[:-1] for row in table_rows(report)]  # all but "steps"


def test_changing_one_variant_redoes_only_it(first_run, weights, tmp_path, capsys):
    _, out, report = first_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(weights, lin_plan="affine:1-3"))
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(copy), "--json"]) == 0
    changed = json.loads(capsys.readouterr().out)
    statuses = _statuses(changed)
    assert all(s == "ran" for s in statuses["lin"].values())
    assert all(s == "cached" for s in statuses["original"].values())
    assert changed["latency"]["steps"]["profile"]["status"] == "ran"  # lin changed: both are timed again, together
    assert changed["analysis"]["steps"]["analysis"]["status"] == "cached"
    assert changed["variants"][1]["plan"] == "affine:1-3"
    assert changed["variants"][0]["accuracy"] == report["variants"][0]["accuracy"]
    assert json.loads((copy / "variants/lin/model/edge-model.json").read_text())["plan"] == "affine:1-3"


def test_an_interrupted_step_is_not_marked_done(tmp_path):
    cache = StepCache()
    calls = []

    def work_then_fail():
        (tmp_path / "a.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.run(tmp_path, "export", {"x": 1}, work_then_fail, ("a.bin",))
    assert not StepCache.marker(tmp_path, "export").exists()

    def work():
        calls.append(1)
        (tmp_path / "a.bin").write_bytes(b"whole")
        return {"n": 1}

    assert cache.run(tmp_path, "export", {"x": 1}, work, ("a.bin",)).status == "ran"
    assert cache.run(tmp_path, "export", {"x": 1}, work, ("a.bin",)).status == "cached"
    assert cache.run(tmp_path, "export", {"x": 2}, work, ("a.bin",)).status == "ran"  # another input
    (tmp_path / "a.bin").write_bytes(b"tampered")
    assert cache.run(tmp_path, "export", {"x": 2}, work, ("a.bin",)).status == "ran"  # output changed
    assert StepCache(redo={"export"}).run(tmp_path, "export", {"x": 2}, work, ("a.bin",)).status == "ran"
    assert len(calls) == 4


BAD_RECIPES = {
    "unknown key": ("modle: fmnist-deit-tiny\n", "unknown key 'modle'", "did you mean 'model'"),
    "unknown nested key": ("", "unknown key profile.'iters'", "did you mean 'iterations'"),
    "key given twice": ("threads: 1\nthreads: 2\n", "is not valid YAML (line 2", "key 'threads' is given twice"),
    "malformed plan": ("", "variants[1].plan", "has no span"),
    "unknown model": ("", "key model", "unknown model 'timm:vit_nope'"),
    "plan out of range": ("", "variants[1].plan", "out of range for a model with 4 blocks"),
    "wrong type": ("threads: two\n", "key threads has the wrong type", "an integer"),
    "duplicate name": ("", "are both named 'lin'", "give every variant its own name"),
    "bad input size": ("img_size: 28x\n", "key img_size: input size '28x'", "HxW"),
}


@pytest.mark.parametrize("value, size", [(28, 28), ("28", 28), ("28x42", (28, 42)), ([28, 42], (28, 42)), (None, None)])
def test_recipe_input_size_is_n_or_hxw(value, size):
    assert parse_recipe({"variants": [{"name": "original"}], "img_size": value}).img_size == size


@pytest.mark.parametrize("case", sorted(BAD_RECIPES))
def test_bad_recipe_exits_2_naming_the_problem_and_writes_nothing(case, weights, tmp_path, capsys):
    extra, *needles = BAD_RECIPES[case]
    text = extra + recipe_text(weights)
    if case == "unknown nested key":
        text = text.replace("iterations: 5", "iters: 5")  # profile.iterations
    elif case == "malformed plan":
        text = text.replace("plan: linear:1-3", "plan: linear:3")
    elif case == "unknown model":
        text = text.replace(TINY, "timm:vit_nope")
    elif case == "plan out of range":
        text = text.replace("plan: linear:1-3", "plan: linear:1-9")
    elif case == "duplicate name":
        text += "  - name: lin\n    plan: linear:0-1\n"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    out = tmp_path / "out"
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(recipe) in err and "Traceback" not in err
    for needle in needles:
        assert needle in err
    assert not out.exists()


def test_missing_recipe_file_and_missing_out(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["pipeline", "--recipe", str(missing), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"recipe {missing} does not exist" in err and "--print-recipe" in err
    assert main(["pipeline"]) == 2 and "needs --out" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_invalid_yaml_names_the_line(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: fmnist-deit-tiny\nvariants: [\n")
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is not valid YAML (line 3" in err


def test_foreign_out_folder_is_refused(weights, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(weights))
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out)]) == 2
    assert "edge pipeline did not write" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


def test_printed_default_recipe_is_the_default(tmp_path, capsys):
    assert main(["pipeline", "--print-recipe"]) == 0
    path = tmp_path / "recipe.yaml"
    path.write_text(capsys.readouterr().out)
    printed, default = load_recipe(path), load_recipe(None)
    assert printed.as_dict() | {"source": None} == default.as_dict() | {"source": None}
    # the bundled model's own data (Fashion-MNIST, falling back to fmnist-mini): edge.pipeline.run.resolve_data
    assert default.model == "fmnist-deit-tiny" and default.data is None and default.fallback_data is None
    assert default.evaluate.samples is None  # the whole test split
    assert default.variants[0].plan is None


def test_the_built_in_recipe_tells_the_whole_story():
    """The built-in recipe has every section: a plan to 0.5x for the Orin Nano (the estimator), one variant per
    method, FP16 and INT8 of the planned model and the original, the Orin estimate, a bundle of both."""
    from edge.compress.plan import parse_plan
    from edge.compress.registry import method_of, methods

    recipe = load_recipe(None)
    plan = recipe.plan
    assert (plan.budget, plan.backend, plan.power_mode, plan.precision, plan.batch) == \
        (0.5, "estimate", "MAXN_SUPER", "fp16", 1)
    names = [v.name for v in recipe.run_variants()]
    assert names[:2] == ["original", "planned"] and recipe.run_variants()[1].searched
    per_variant = [[method_of(s).name for s in parse_plan(v.plan).steps] for v in recipe.variants[1:]]
    assert sorted(m for ms in per_variant for m in ms) == sorted(m.name for m in methods())  # one each
    assert all(len(ms) == 1 for ms in per_variant)
    assert recipe.precision.variants == ("planned", "original") and recipe.precision.precisions == ("fp16", "int8")
    assert recipe.precision.samples == 200 and recipe.estimate.precision == "fp16"
    assert recipe.bundle.variants == ("planned", "original") and recipe.bundle.precisions == ("fp32", "fp16", "int8")


def test_the_three_span_recipe_is_shipped_by_name(capsys):
    spans = load_recipe("spans")
    assert spans.plan is None and spans.precision is None and spans.bundle is None and spans.estimate is None
    from edge.compress.plan import parse_plan

    replaced = sorted(sum(len(s.blocks) for s in parse_plan(v.plan).steps_of("block-approximation"))
                      for v in spans.variants[1:])
    assert replaced == [1, 2, 3]
    assert main(["pipeline", "--print-recipe", "spans"]) == 0
    assert "three-span recipe" in capsys.readouterr().out
    assert main(["pipeline", "--recipe", "nope", "--out", "x"]) == 2
    assert "a shipped recipe (default, spans)" in capsys.readouterr().err


STORY_BAD = {
    "unknown variant in precision": ("precision: {variants: [nope]}\n", "key precision.variants[0]",
                                     "one of original, lin"),
    "precision not made here": ("precision: {variants: [original], precisions: [fp8]}\n",
                                "key precision.precisions[0]", "fp16, int8"),
    "plan name taken": ("plan: {name: lin}\n", "plan.name and variants[1] are both named 'lin'", "plan.name"),
    "unknown power mode": ("estimate: {power_mode: 30W}\n", "key estimate.power_mode", "MAXN_SUPER"),
    "tensorrt plan without a table": ("plan: {backend: tensorrt}\n", "tensorrt without a table", "plan.table"),
    "budget above 1": ("plan: {budget: 1.5}\n", "key plan.budget is out of range", "<= 1"),
    "list expected": ("bundle: {variants: original}\n", "key bundle.variants has the wrong type",
                      "a non-empty list of strings"),
}


@pytest.mark.parametrize("case", sorted(STORY_BAD))
def test_bad_story_sections_exit_2_naming_the_key(case, weights, tmp_path, capsys):
    extra, *needles = STORY_BAD[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(extra + recipe_text(weights))
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err
    assert not (tmp_path / "out").exists()


STORY = """plan: {budget: 0.7, samples: 32, holdout: 32}
precision: {variants: [planned, original], precisions: [fp16, int8], samples: 32}
estimate: {}
bundle: {variants: [planned, original], precisions: [fp32, fp16, int8], samples: 32, gate_images: 8}
"""
METHOD_VARIANTS = """  - name: dw
    plan: dwconv:blocks=2
  - name: rm
    plan: attnrm:blocks=1:init=affine
  - name: w
    plan: wpac:keep=0.5:align=8:mlp_align=32
"""


@pytest.fixture(scope="module")
def story_run(tmp_path_factory, weights):
    root = tmp_path_factory.mktemp("story")
    recipe = root / "recipe.yaml"
    recipe.write_text(recipe_text(weights, extra=STORY).replace("analysis: {samples: 40}", "analysis: {enabled: false}")
                      .replace("evaluate: {samples: 200,", "evaluate: {samples: 200, subset: 120,") + METHOD_VARIANTS)
    out = root / "out"
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out)]) == 0
    return recipe, out, json.loads((out / "report.json").read_text())


def test_story_report_holds_plan_methods_precision_estimate_bundle_and_next_commands(story_run, capsys):
    _, out, report = story_run
    plan = report["plan"]
    assert plan["budget"] == 0.7 and plan["target"]["backend"] == "estimate" and plan["variant"] == "planned"
    assert plan["chosen"]["predicted_ms"] <= 0.7 * plan["original"]["predicted_ms"] + 1e-12
    assert plan["rounds"] and all(r["why"].startswith("least KL lost per ms saved") for r in plan["rounds"])
    assert plan["rounds"][-1]["plan"] == plan["chosen"]["plan"] and (out / plan["files"]["record"]).is_file()
    variants = {v["name"]: v for v in report["variants"]}
    assert [v["name"] for v in report["variants"]] == ["original", "planned", "lin", "dw", "rm", "w"]
    planned = variants["planned"]
    assert planned["kind"] == "planned" and planned["plan"] == plan["chosen"]["plan"]
    assert planned["artifact"] == "plan/model" and planned["verification"]["passed"]
    assert report["methods"] == {"block-approximation": ["lin"], "attnrm": ["rm"], "dwconv": ["dw"], "wpac": ["w"]}
    rows = {p["name"]: p for p in report["precision"]}
    assert sorted(rows) == ["original.fp16", "original.int8", "planned.fp16", "planned.int8"]
    for row in rows.values():
        assert row["samples"] == 120 and 0 <= row["accuracy"] <= 1   # evaluate.subset of the 200
        same = row["same_images"]   # the float32 graph and the reference on those images: paired figures
        assert set(same) == {row["variant"], "original"}
        assert row["accuracy_delta_pt_vs_fp32"] == pytest.approx(   # the report rounds to 1e-4 pt
            100 * (row["accuracy"] - same[row["variant"]]["accuracy"]), abs=1e-4)
        assert row["accuracy_delta_pt"] == pytest.approx(100 * (row["accuracy"] - same["original"]["accuracy"]),
                                                         abs=1e-4)
        assert row["top1_agreement_with_fp32"] >= 0.9
        for graph in ("model.onnx", "model.batched.onnx"):
            gate = row["gate"][graph]
            assert 0 <= gate["top1_agreement"] <= 1 and gate["max_abs"] >= 0 and gate["images"] > 0
        assert row["speedup"]["low"] <= row["speedup"]["speedup"] <= row["speedup"]["high"]
        assert (out / row["graphs"]["deployed"]).is_file() and row["orin_estimate_ms"] > 0
    assert rows["planned.int8"]["calibration"]["samples"] == 32
    # every graph timed in one side-by-side run with the A/A control
    timing = report["latency"]
    assert sorted(timing["creation_orders"][0]) == sorted([*variants, *rows, "original (A/A)"])
    assert timing["aa_control"]["low"] <= timing["aa_control"]["speedup"] <= timing["aa_control"]["high"]
    orin = report["orin_estimate"]
    assert orin["device"] == "Jetson Orin Nano 8GB" and orin["estimated"] and orin["precision"] == "fp16"
    assert [r["name"] for r in orin["rows"]] == [*variants, *rows]
    assert orin["rows"][0]["speedup"] == 1.0 and 0 < orin["error"]["largest_abs"] < 0.05
    for v in report["variants"]:
        assert v["orin_estimate"]["ms"]["int8"] < v["orin_estimate"]["ms"]["fp16"] < v["orin_estimate"]["ms"]["fp32"]
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert sorted(f"{v['name']}.{v['precision']}" for v in manifest["variants"]) == sorted(report["bundle"]["variants"])
    assert report["bundle"]["path"] == str(out / "bundle") and len(report["bundle"]["variants"]) == 6
    # the FP16/INT8 graphs the report evaluated are the ones shipped (not made a second time)
    shipped = {f"{v['name']}.{v['precision']}": v["graph_sha256"] for v in manifest["variants"]}
    assert report["bundle"]["reused"] == sorted(set(rows) & set(shipped)) != []
    for name in report["bundle"]["reused"]:
        assert shipped[name] == sha256_file(out / rows[name]["graphs"]["deployed"]), name
    assert report["next_commands"] == [
        "edge deploy --check --host user@jetson --power-mode MAXN_SUPER",
        f"edge deploy {out}/bundle --host user@jetson --power-mode MAXN_SUPER --report {out}"]
    assert any("No Jetson" in line for line in report["not_measured"]) and report["passed"]


def test_story_reads_top_down_and_ends_with_the_next_commands(story_run, capsys):
    recipe, out, report = story_run
    text = (out / "report.md").read_text()
    order = ["## What was asked", "## What was chosen and why", "## Accuracy and speed", "## Precision",
             "## On the Orin Nano (estimated)", "## The bundle, and what to run next", "## What was not measured",
             "## How it was measured"]
    assert [text.index(title) for title in order] == sorted(text.index(title) for title in order)
    assert report["next_commands"][1] in text and "Estimates, not measurements" in text
    page = (out / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 1   # accuracy vs speed, both series
    assert "On the Orin Nano (estimated)" in page and html_escape(report["next_commands"][1]) in page
    # a second run finds every step in the cache and prints the next commands last
    capsys.readouterr()
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    assert printed[-3:] == ["next, on a Jetson:", *(f"  {c}" for c in report["next_commands"])]
    again = json.loads((out / "report.json").read_text())
    assert again["steps"]["ran"] == 0 and again["steps"]["cached"] == report["steps"]["ran"]
    assert again["plan"]["chosen"] == report["plan"]["chosen"]


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def test_data_fallback_and_overrides(weights, tmp_path):
    from edge.pipeline import with_overrides
    from edge.pipeline.run import resolve_data

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(weights).replace("data: fmnist-mini", f"data: {tmp_path / 'absent'}\n"
                                                   "fallback_data: fmnist-mini"))
    loaded = load_recipe(recipe)
    data, notice = resolve_data(loaded)
    assert data == "fmnist-mini" and "absent" in notice
    strict = with_overrides(loaded, data=str(tmp_path / "absent"), threads=1)
    assert strict.fallback_data is None and strict.threads == 1
    with pytest.raises(EdgeError, match="key data"):
        resolve_data(strict)


def test_a_recipe_naming_a_missing_folder_stops_the_run_with_exit_2(weights, tmp_path, capsys):
    """No silent fallback: a recipe's own data that cannot be read ends the run before any step, naming it."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(weights).replace("data: fmnist-mini", f"data: {tmp_path / 'photos'}"))
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "photos") in err and "key data" in err
    assert not (tmp_path / "run").exists()
    other = tmp_path / "other.yaml"   # a model that is not bundled, and no data at all: refused, naming the key
    other.write_text(recipe_text(weights).replace("data: fmnist-mini\n", ""))
    assert main(["pipeline", "--recipe", str(other), "--out", str(tmp_path / "run")]) == 2
    assert "names no data for" in capsys.readouterr().err


def test_pareto_front():
    points = {"a": (1.0, 0.80), "b": (2.0, 0.85), "c": (2.5, 0.84), "d": (2.0, 0.85), "e": (0.5, 0.70)}
    # c is beaten by b (faster and more accurate); equal points b and d do not beat each other
    assert pareto_front(points) == ["e", "a", "b", "d"]
    assert "redo" not in STEPS and STEPS[0] == "analysis" and STEPS[-2:] == ("profile", "bundle")


@pytest.mark.slow
@needs_fmnist
def test_default_recipe_end_to_end(tmp_path):
    """The README's main job: the built-in recipe on the bundled model and the full test split."""
    out = tmp_path / "pipeline"
    assert main(["pipeline", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["used"] == "fmnist" and report["passed"]
    for v in report["variants"]:
        assert v["samples"] == 10000 and v["speedup"]["rounds"] == 40
    original = report["variants"][0]
    from edge.models import model_card

    card = model_card("fmnist-deit-tiny")["eval"]  # PyTorch on the same 10,000 images
    assert original["params"] == 5_353_738 and original["plan"] is None
    assert abs(original["accuracy"] - card["accuracy"]) <= 0.002
    assert len(report["methods"]) == 4 and len(report["precision"]) == 4 and (out / "bundle/manifest.json").is_file()


def test_a_graph_beyond_tolerance_exits_1_and_is_reported(first_run, tmp_path, monkeypatch, capsys):
    import edge.check.verify
    from edge.check.compare import Tolerance

    real_verify_pair = edge.check.verify.verify_pair

    def exact(a, b, **kwargs):  # zero tolerance: float32 round-off is now "beyond tolerance"
        return real_verify_pair(a, b, **{**kwargs, "tolerance": Tolerance(0.0, 0.0)})

    monkeypatch.setattr(edge.check.verify, "verify_pair", exact)
    recipe, out, _ = first_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(copy), "--redo", "verify"]) == 1
    assert "failed verification" in capsys.readouterr().err
    report = json.loads((copy / "report.json").read_text())
    assert report["passed"] is False and not report["variants"][0]["verification"]["passed"]
    assert "FAILED" in (copy / "report.md").read_text()


def test_a_report_of_an_earlier_edge_renders_again(first_run):
    """`edge deploy --report` renders a run's report again: one written before the story's keys existed too."""
    from edge.pipeline.report.model import STORY_KEYS

    _, out, report = first_run
    earlier = {k: v for k, v in report.items() if k not in STORY_KEYS}
    text = markdown(earlier)
    assert "## Accuracy and speed" in text and "## Precision" not in text and "next, on" not in text.lower()
    assert "<h2>Accuracy and speed</h2>" in html_report(earlier, out)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless browser here (Debian: apt-get install chromium)")
def test_the_html_report_renders_in_a_headless_browser(story_run, tmp_path):
    """report.html as a browser shows it: every section and its chart laid out (not a blank page)."""
    import subprocess

    from PIL import Image

    _, out, report = story_run
    page = (out / "report.html").resolve().as_uri()
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*browser, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True).stdout
    for title in ("What was asked", "What was chosen and why", "Accuracy and speed", "Precision",
                  "On the Orin Nano (estimated)", "The bundle, and what to run next", "What was not measured"):
        assert f">{title}</h2>" in dom, title
    assert html_escape(report["next_commands"][1]) in dom
    shot = tmp_path / "report.png"
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1280,4000", page], capture_output=True,
                   timeout=120, check=True)
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 4000)
    # text and the chart drawn: far from one colour, ink in the top and the lower half of the page
    top, lower = image.crop((0, 0, 1280, 1000)), image.crop((0, 1000, 1280, 4000))
    for part in (top, lower):
        low, high = part.getextrema()
        assert high - low > 100
        assert sum(part.histogram()[:128]) > 500   # dark pixels: text, axes, points


def test_converted_graphs_are_compared_with_float32_on_the_same_images(story_run):
    """The paired figures are float32's answers on exactly the images the FP16/INT8 graph saw: checked against
    the float32 graph evaluated again, here, on the images the converted graph's evaluation names."""
    from edge.check.onnx_classifier import OnnxClassifier
    from edge.data import ArrayPreprocess, InputSpec, balanced_indices, load_dataset

    _, out, report = story_run
    test = load_dataset("fmnist-mini", "test")
    pool = balanced_indices(test.labels, 200, 0, test.num_classes).sort().values
    picked = pool[balanced_indices(test.labels[pool], 120, 0, test.num_classes).sort().values]   # evaluate.subset
    for row in report["precision"]:
        folder = out / "variants" / row["variant"]
        converted = json.loads((folder / row["precision"] / "evaluate.done.json").read_text())
        assert converted["result"]["data"] == "fmnist-mini:test[120]"
        float32 = OnnxClassifier(folder / "model.batched.clean.onnx", threads=1)
        spec = InputSpec.from_data_config(float32.data_config())
        answers = float32(ArrayPreprocess(spec)(test.images[picked])).argmax(-1)
        ours = torch.tensor(converted["result"]["predictions"])
        assert row["same_images"][row["variant"]]["correct"] == int((answers == test.labels[picked]).sum())
        assert row["top1_agreement_with_fp32"] == pytest.approx(float((answers == ours).double().mean()), abs=1e-12)
        assert row["correct"] == int((ours == test.labels[picked]).sum())


def test_the_headline_is_on_its_images_every_other_graph_on_the_subset_marked_with_its_interval(story_run, capsys):
    """The original and the planned model on evaluate.samples (200 here), the method variants and FP16/INT8 on the
    subset (120) inside them, labelled so in report.json, report.md and on the terminal, with 95 % intervals; a
    method variant's delta is paired with the original's accuracy on the same 120 images."""
    from edge.pipeline.report.markdown import markdown

    recipe, out, report = story_run
    by_name = {v["name"]: v for v in report["variants"] + report["precision"]}
    assert report["evaluate"] == {"test_split": 2000, "headline": ["original", "planned"], "subset": 120}
    for name in ("original", "planned"):
        assert by_name[name]["samples"] == 200 and by_name[name]["images"] == "subset (200)"
    for name in ("lin", "dw", "rm", "w", "planned.fp16", "original.int8"):
        assert by_name[name]["samples"] == 120 and by_name[name]["images"] == "subset (120)", name
    low, high = by_name["lin"]["ci95"]
    assert low < by_name["lin"]["accuracy"] < high and high - low > 0.05   # 120 images: a wide interval
    original_here = by_name["lin"]["same_images"]["original"]
    assert original_here["correct"] <= 120
    assert by_name["lin"]["accuracy_delta_pt"] == pytest.approx(100 * (by_name["lin"]["accuracy"]
                                                                       - original_here["accuracy"]), abs=1e-3)
    text = markdown(report)
    assert "subset (120)" in text and "the headline (`original`, `planned`, float32)" in text
    assert f"{100 * low:.2f}, {100 * high:.2f}]" in text
    assert main(["pipeline", "--recipe", str(recipe), "--out", str(out)]) == 0   # cached: the terminal's lines
    terminal = capsys.readouterr().out
    assert "\N{DAGGER} accuracy on a subset (120) of the test split" in terminal


class _TestSplit:
    def __init__(self, labels):
        self.labels, self.num_classes = labels, int(labels.max()) + 1

    def __len__(self):
        return len(self.labels)


def _indices_context(labels, samples=None, subset=None, test_images=None):
    from types import SimpleNamespace

    variants = [SimpleNamespace(name="original", plan=None), SimpleNamespace(name="lin", plan="linear:1-3")]
    recipe = SimpleNamespace(evaluate=SimpleNamespace(samples=samples, subset=subset), variants=variants, plan=None,
                             precision=SimpleNamespace(test_images=test_images), seed=0)
    return SimpleNamespace(recipe=recipe, test_set=_TestSplit(labels))


def test_precision_test_images_without_a_balanced_subset_names_the_recipe_key():
    """A test split too uneven for a class-balanced subset of precision.test_images (a user's image folder):
    the error names the key and the fix, not the sampler's own --samples."""
    from edge.pipeline.steps.evaluate import test_indices

    labels = torch.tensor([0] + [1] * 50 + [2] * 50)   # one image of class 0: 30 balanced images need 10 of it
    ctx = _indices_context(labels, test_images=30)
    assert test_indices(ctx, "original") is None and test_indices(ctx, "lin") is None   # float32: every image
    with pytest.raises(EdgeError, match=r"precision.test_images 30: no class-balanced set of 30 among") as e:
        test_indices(ctx, "original.int8", converted=True)
    assert "set it to null" in str(e.value) and "class 0 has 1 samples" in str(e.value)
    ctx.recipe.precision.test_images = 3                  # one per class: there is one of class 0
    assert sorted(labels[test_indices(ctx, "original.int8", converted=True)].tolist()) == [0, 1, 2]
    ctx = _indices_context(labels, subset=30)
    with pytest.raises(EdgeError, match=r"evaluate.subset 30: no class-balanced set of 30 among"):
        test_indices(ctx, "lin")


def test_the_headline_takes_the_whole_split_and_every_other_graph_one_balanced_subset_within_it():
    """The original (and the planned model) on evaluate.samples, the method variants and the FP16/INT8 graphs on
    one fixed class-balanced evaluate.subset inside those images (so float32's predictions pair with any of them)."""
    from edge.pipeline.steps.evaluate import images_label, test_indices

    labels = torch.arange(300) % 3
    ctx = _indices_context(labels, subset=60)
    assert test_indices(ctx, "original") is None
    subset = test_indices(ctx, "lin")
    assert len(subset) == 60 and torch.bincount(labels[subset]).tolist() == [20, 20, 20]
    assert torch.equal(test_indices(ctx, "original.fp16", converted=True), subset)
    assert torch.equal(test_indices(ctx, "lin"), subset)          # fixed: the same images every time
    ctx = _indices_context(labels, samples=150, subset=60)        # a subset of the headline's own subset
    headline = test_indices(ctx, "original")
    assert len(headline) == 150 and set(test_indices(ctx, "lin").tolist()) <= set(headline.tolist())
    assert images_label(60, 300) == "subset (60)" and images_label(10000, 10000) == "full split (10,000)"


def test_the_ranking_does_not_order_speedups_within_their_spread_across_timing_processes():
    from edge.pipeline.report.conditions import ranking

    def row(name, speedup, spread):
        return {"name": name, "speedup": {"speedup": speedup, "verdict": "faster", "process_spread": spread}}

    rows = [row("a", 2.4, 0.12), row("b", 1.31, 0.17), row("c", 1.2, 0.02), row("d", 1.1, 0.02)]
    assert ranking(rows) == ("`a` 2.400x (faster) > `b` 1.310x (faster) = `c` 1.200x (faster) > `d` 1.100x (faster)")
    assert ranking([row("a", 1.2, 0.0), row("b", 1.2, 0.0)]).count("=") == 1   # equal speedups: not told apart
