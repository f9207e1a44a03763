"""``edge bundle``: from ONNX files and (through the CLI, which asks edge.pipeline for the graphs) from a
pipeline run folder, with a manifest whose checksums the device runner checks, written atomically; fp16
and int8 graphs made by edge.precision.quantize on real images."""

import json
import tarfile
from pathlib import Path

import onnx
import pytest

from edge.bundle import BundleConfig, SourceGraph, make_bundle
from edge.cli import main
from edge.errors import EdgeError
from edge.fileio import sha256_file
from jetson.bundle import MANIFEST, Protocol, read_bundle, verify_bundle
from tests.edge.trt.test_build import tiny_onnx

JETSON = Path(__file__).resolve().parents[2] / "jetson"


def test_bundle_of_onnx_files_lists_every_file_with_its_checksum(tmp_path):
    graphs = [tiny_onnx(tmp_path / "ref.clean.onnx"), tiny_onnx(tmp_path / "small.onnx")]
    out = tmp_path / "bundle"
    manifest = make_bundle(graphs, out, BundleConfig(check_data="fmnist-mini",
                                                     precisions=("fp32",), protocol=Protocol(iterations=50)),
                           tar=True)
    assert [(v["name"], v["precision"], v["graph"]) for v in manifest["variants"]] == [
        ("ref", "fp32", "graphs/ref/fp32.onnx"), ("small", "fp32", "graphs/small/fp32.onnx")]
    assert manifest["protocol"]["iterations"] == 50 and manifest["source"]["kind"] == "onnx"
    build = manifest["variants"][0]["build"]
    assert build == {"precision": "fp32", "strongly_typed": True, "workspace_mib": 2048, "optimization_level": 3,
                     "tiling_optimization_level": None, "tactic_dram_mib": 3072, "batch": None, "min_batch": None,
                     "opt_batch": None, "max_batch": None, "timing_cache": None, "plugins": [],
                     "calibration_cache": None, "tf32": True, "plugin_sources": None, "plugin_library": None}
    assert manifest["variants"][0]["inputs"] == [{"name": "input", "shape": [1, 16], "dtype": "float32"}]
    # every file but the manifest, with its sha256 and size; the runner's package is the repository's own
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert sorted(manifest["files"]) == on_disk
    for relative, entry in manifest["files"].items():
        assert entry == {"sha256": sha256_file(out / relative), "bytes": (out / relative).stat().st_size}
    package = {p for p in manifest["files"] if p.startswith("jetson/")}
    assert package == {f"jetson/{p.name}" for p in JETSON.glob("*.py")}
    assert (out / "graphs/ref/fp32.onnx").read_bytes() == graphs[0].read_bytes()
    assert json.loads((out / MANIFEST).read_text()) == {k: v for k, v in manifest.items() if k != "tar"}
    verify_bundle(read_bundle(out))
    with tarfile.open(tmp_path / "bundle.tar.gz") as archive:
        names = archive.getnames()
    assert "bundle/manifest.json" in names and "bundle/graphs/ref/fp32.onnx" in names
    assert not list(tmp_path.glob(".bundle*"))  # no temporary folder or file left


def pipeline_run(folder: Path, with_report: bool) -> Path:
    """A folder laid out as `edge pipeline --out` leaves it (edge.pipeline.layout), with two variants."""
    for name in ("baseline", "dwconv2"):
        (folder / "variants" / name).mkdir(parents=True)
        tiny_onnx(folder / "variants" / name / "model.clean.onnx")
        tiny_onnx(folder / "variants" / name / "model.batched.clean.onnx", batch="batch")
    if with_report:
        variants = [{"name": n, "graphs": {"model.onnx": {"clean_file": f"variants/{n}/model.clean.onnx"}}}
                    for n in ("dwconv2", "baseline")]
        (folder / "report.json").write_text(json.dumps({"variants": variants}))
    return folder


@pytest.mark.parametrize("with_report", [True, False])
def test_bundle_of_a_pipeline_run_takes_each_variants_cleaned_static_graph(tmp_path, with_report):
    run = pipeline_run(tmp_path / "run", with_report)
    out = tmp_path / "bundle"
    assert main(["bundle", str(run), "--out", str(out), "--precision", "fp32", "--gate-data", "fmnist-mini"]) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    order = ["dwconv2", "baseline"] if with_report else ["baseline", "dwconv2"]  # report.json's order, else sorted
    assert [v["name"] for v in manifest["variants"]] == order
    assert {v["source"] for v in manifest["variants"]} == {str(run / f"variants/{n}/model.clean.onnx") for n in order}
    assert manifest["source"] == {"kind": "pipeline", "paths": [str(run)]}
    assert manifest["variants"][0]["inputs"][0]["shape"] == [1, 16]  # the static-batch graph, not the batched one


def test_a_run_folder_and_an_onnx_file_make_one_bundle_named_as_given(tmp_path, capsys):
    run = pipeline_run(tmp_path / "run", with_report=True)
    extra = tiny_onnx(tmp_path / "extra.clean.onnx")
    out = tmp_path / "bundle"
    assert main(["bundle", str(run), str(extra), "--out", str(out), "--precision", "fp32", "--gate-data", "fmnist-mini",
                 "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in manifest["variants"]] == ["dwconv2", "baseline", "extra"]
    assert manifest["source"] == {"kind": "pipeline", "paths": [str(run), str(extra)]}
    verify_bundle(read_bundle(out))


def test_the_library_bundles_named_graphs_and_records_the_source_it_is_given(tmp_path):
    """edge.bundle takes graphs, not run folders: a SourceGraph names its variant; ``source`` goes to the
    manifest as given (default: the ONNX files)."""
    graph = tiny_onnx(tmp_path / "g.onnx")
    manifest = make_bundle([SourceGraph("renamed", graph)], tmp_path / "a", BundleConfig(check_data="fmnist-mini",
                                                                                         precisions=("fp32",)))
    assert [v["name"] for v in manifest["variants"]] == ["renamed"]
    assert manifest["source"] == {"kind": "onnx", "paths": [str(graph)]}
    source = {"kind": "pipeline", "paths": ["runs/x"]}
    manifest = make_bundle([graph], tmp_path / "b", BundleConfig(check_data="fmnist-mini",
                                                                 precisions=("fp32",)), source=source)
    assert [v["name"] for v in manifest["variants"]] == ["g"] and manifest["source"] == source
    with pytest.raises(EdgeError, match=f"{tmp_path} is not an ONNX file"):
        make_bundle([tmp_path], tmp_path / "c", BundleConfig(check_data="fmnist-mini", precisions=("fp32",)))
    assert not (tmp_path / "c").exists()


def test_an_input_neither_run_folder_nor_onnx_is_refused_by_the_cli(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not a graph")
    assert main(["bundle", str(text), "--out", str(tmp_path / "bundle")]) == 2
    assert "neither a pipeline run folder nor an ONNX file" in capsys.readouterr().err
    empty = tmp_path / "empty-run"
    empty.mkdir()
    assert main(["bundle", str(empty), "--out", str(tmp_path / "bundle")]) == 2
    assert "holds no cleaned graph" in capsys.readouterr().err
    assert not (tmp_path / "bundle").exists()


def test_an_error_leaves_no_bundle(tmp_path):
    good = tiny_onnx(tmp_path / "a.onnx")
    with pytest.raises(EdgeError, match="missing.onnx is not an ONNX file"):
        make_bundle([good, tmp_path / "missing.onnx"], tmp_path / "bundle", BundleConfig(check_data="fmnist-mini",
                                                                                         precisions=("fp32",)))
    with pytest.raises(EdgeError, match="two graphs would be variant 'a'"):
        make_bundle([good, good], tmp_path / "bundle", BundleConfig(check_data="fmnist-mini", precisions=("fp32",)))
    half = tmp_path / "half.onnx"
    model = onnx.load(str(good))
    model.metadata_props.add(key="edge.precision", value="float16")
    onnx.save(model, str(half))
    with pytest.raises(EdgeError, match="half.onnx is a float16 graph, which cannot make the fp32 variant"):
        make_bundle([good, half], tmp_path / "bundle", BundleConfig(check_data="fmnist-mini",
                                                                    precisions=("fp32", "int8")))
    assert not (tmp_path / "bundle").exists() and not list(tmp_path.glob(".bundle*"))
    make_bundle([good], tmp_path / "bundle", BundleConfig(check_data="fmnist-mini", precisions=("fp32",)))
    with pytest.raises(EdgeError, match="bundle exists"):
        make_bundle([good], tmp_path / "bundle", BundleConfig(check_data="fmnist-mini", precisions=("fp32",)))


@pytest.fixture(scope="module")
def reference_onnx(tmp_path_factory):
    """The reference model exported (float32, static batch 1), as a pipeline run's cleaned graph is."""
    from edge.export import ExportConfig, export
    from edge.models import create_model, data_config

    path = tmp_path_factory.mktemp("ref") / "ref.onnx"
    model = create_model("fmnist-deit-tiny")
    export(model, path, source="fmnist-deit-tiny", plan=None, data_config=data_config(model),
           config=ExportConfig(verify=False))
    return path


@pytest.mark.slow   # CI time: 133 s; test_the_cli_ships_a_graph_given_with_graph... and tests/test_own_model.py bundle int8
def test_fp16_and_int8_graphs_are_made_by_edge_quantize_and_the_calibration_recorded(reference_onnx, tmp_path):
    out = tmp_path / "bundle"
    code = main(["bundle", str(reference_onnx), "--out", str(out), "--precision", "fp16,int8", "--data",
                 "fmnist-mini", "--samples", "32", "--iterations", "30"])
    assert code == 0
    bundle = read_bundle(out)
    verify_bundle(bundle)
    by_id = {v.id: v for v in bundle.variants}
    assert set(by_id) == {"ref.fp16", "ref.int8"} and bundle.protocol.iterations == 30
    precisions = {i: {p.key: p.value for p in onnx.load(str(out / v.graph)).metadata_props}["edge.precision"]
                  for i, v in by_id.items()}
    assert precisions == {"ref.fp16": "float16", "ref.int8": "int8"}
    int8 = onnx.load(str(out / by_id["ref.int8"].graph))
    assert sum(n.op_type == "QuantizeLinear" for n in int8.graph.node) > 0
    assert by_id["ref.fp16"].calibration is None
    calibration = by_id["ref.int8"].calibration
    assert calibration["samples"] == 32 and calibration["data"] == "fmnist-mini"


def test_a_graph_already_made_at_a_precision_is_shipped_as_it_is_and_one_below_its_gate_refused(reference_onnx,
                                                                                                  tmp_path):
    from edge.precision.gate import GateConfig
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file

    made = tmp_path / "int8.onnx"
    quantize_file(reference_onnx, made, "int8", int8=Int8Config(data="fmnist-mini", samples=32),
                  gate=GateConfig(images=64))
    manifest = make_bundle([SourceGraph("ref", reference_onnx, ("fp32", "int8"), {"int8": made})],
                           tmp_path / "bundle", BundleConfig(check_data="fmnist-mini",
                                                             precisions=("fp32", "int8"), gate_images=0))
    variant = next(v for v in manifest["variants"] if v["precision"] == "int8")
    assert (tmp_path / "bundle" / variant["graph"]).read_bytes() == made.read_bytes()   # not made a second time
    assert variant["calibration"]["samples"] == 32 and variant["calibration"]["data"] == "fmnist-mini"

    # a graph the gate refused, written anyway (--accept-loss), is not shipped: the bundle names it and the fix
    model = onnx.load(str(made))
    for prop in model.metadata_props:
        if prop.key == "edge.accuracy_gate":
            gate = json.loads(prop.value)
            prop.value = json.dumps({**gate, "passed": False, "accepted_loss": True})
    onnx.save(model, str(tmp_path / "below.onnx"))
    with pytest.raises(EdgeError, match="did not pass edge quantize's accuracy gate") as refused:
        make_bundle([SourceGraph("ref", reference_onnx, ("int8",), {"int8": tmp_path / "below.onnx"})],
                    tmp_path / "bundle2", BundleConfig(check_data="fmnist-mini", precisions=("int8",), gate_images=0))
    assert "leave that precision out" in refused.value.fix
    assert not (tmp_path / "bundle2").exists()
    with pytest.raises(EdgeError, match="is a float32 graph, given as the int8 graph of ref"):
        make_bundle([SourceGraph("ref", reference_onnx, ("int8",), {"int8": reference_onnx})],
                    tmp_path / "bundle3", BundleConfig(check_data="fmnist-mini", precisions=("int8",), gate_images=0))


def test_the_cli_ships_a_graph_given_with_graph_and_refuses_one_it_cannot_place(reference_onnx, tmp_path, capsys):
    from edge.precision.gate import GateConfig
    from edge.precision.int8 import Int8Config
    from edge.precision.quantize import quantize_file

    made = tmp_path / "ref.int8.onnx"
    quantize_file(reference_onnx, made, "int8", int8=Int8Config(data="fmnist-mini", samples=32),
                  gate=GateConfig(images=64))
    out = tmp_path / "bundle"
    assert main(["bundle", str(reference_onnx), "--graph", f"int8={made}", "--precision", "fp32,int8",
                 "--gate-data", "fmnist-mini", "--gate-images", "0", "--out", str(out)]) == 0
    variant = next(v for v in read_bundle(out).variants if v.id == "ref.int8")
    assert (out / variant.graph).read_bytes() == made.read_bytes()   # shipped as made, not calibrated again
    capsys.readouterr()
    for given, message in ((f"other.int8={made}", "no input graph is called other"),
                           (f"int4={made}", "[NAME.]PRECISION=FILE with PRECISION fp16 or int8"),
                           (f"int8={tmp_path / 'none.onnx'}", "none.onnx does not exist")):
        assert main(["bundle", str(reference_onnx), "--graph", given, "--precision", "int8", "--out",
                     str(tmp_path / "refused")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()


def test_a_bundle_whose_tactic_memory_is_below_its_workspace_is_refused_naming_both_options():
    from edge.bundle import BundleConfig
    from edge.errors import EdgeError

    with pytest.raises(EdgeError, match="--tactic-dram 3072 MiB below --workspace 4096 MiB"):
        BundleConfig(workspace_mib=4096).check()
    BundleConfig(workspace_mib=4096, tactic_dram_mib=4096).check()
