"""What a run folder offers the steps after the pipeline (edge.pipeline.run_folder): the graph of each
variant to bundle, and where the device results go; errors that name the folder and the fix."""

import json

import pytest

from edge.errors import EdgeError
from edge.pipeline import VariantGraph, deployed_graphs, device_results_folder
from tests.edge.test_bundle import pipeline_run


def test_a_finished_run_lists_its_graphs_in_the_reports_order(tmp_path):
    run = pipeline_run(tmp_path / "run", with_report=True)
    assert deployed_graphs(run) == [VariantGraph("dwconv2", run / "variants/dwconv2/model.clean.onnx"),
                                    VariantGraph("baseline", run / "variants/baseline/model.clean.onnx")]


def test_an_unfinished_run_lists_the_cleaned_graphs_by_name(tmp_path):
    run = pipeline_run(tmp_path / "run", with_report=False)
    assert [(g.name, g.path.name) for g in deployed_graphs(str(run))] == [
        ("baseline", "model.clean.onnx"), ("dwconv2", "model.clean.onnx")]  # the static-batch graph, not the batched


def test_a_run_without_graphs_or_with_a_missing_one_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(EdgeError, match="empty holds no cleaned graph") as e:
        deployed_graphs(tmp_path / "empty")
    assert "edge pipeline --out" in str(e.value)
    run = pipeline_run(tmp_path / "run", with_report=True)
    (run / "variants/baseline/model.clean.onnx").unlink()
    with pytest.raises(EdgeError, match="baseline/model.clean.onnx, which does not exist"):
        deployed_graphs(run)
    (run / "report.json").write_text(json.dumps({"variants": [{"name": "x"}]}))
    with pytest.raises(EdgeError, match="does not list the variants' graphs") as e:
        deployed_graphs(run)
    assert "KeyError" in str(e.value)


def test_device_results_go_into_the_runs_device_folder_only_beside_a_report(tmp_path):
    run = pipeline_run(tmp_path / "run", with_report=True)
    assert device_results_folder(run) == run / "device"
    with pytest.raises(EdgeError, match="holds no report.json") as e:
        device_results_folder(tmp_path / "elsewhere")
    assert "leave out --report" in str(e.value)
