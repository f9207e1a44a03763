"""A latency table measured on a device over real SSH: OpenSSH's sshd on 127.0.0.1 (the deploy tests'
server, tests/edge/deploy/sshd.py), the grid bundled, copied and run there by the device runner on
ONNX Runtime (no TensorRT here), with the named fakes of nvpmodel and friends on the remote PATH; the
table comes back per device and is refused for another target."""

from __future__ import annotations

import json

import pytest
import torch

from edge.cli import main
from edge.deploy import DeployConfig, RunnerOptions
from edge.errors import EdgeError
from edge.latency import LatencyTable, Target, model_parts, predict_model
from edge.latency.device_table import DeviceTableConfig, deploy_table, table_from_results
from edge.latency.grid import GridConfig
from jetson.bundle import Protocol
from tests.conftest import TINY
from tests.edge.deploy.sshd import start_sshd, why_no_sshd

PROTOCOL = Protocol(warmup=1, warmup_s=None, iterations=3, duration_s=None, energy_duration_s=None, idle_s=0.0)


@pytest.fixture
def server(tmp_path):
    reason = why_no_sshd()
    if reason:
        pytest.skip(reason)
    started = start_sshd(tmp_path / "sshd", [{}])
    yield started
    started.stop()


@pytest.fixture(scope="module")
def tiny():
    from edge.models import create_model

    torch.manual_seed(0)
    return create_model(TINY)


def test_device_table_over_loopback_ssh(server, tiny, tmp_path):
    device = server.devices[0]
    config = DeployConfig(ssh=server.options(), runner=RunnerOptions(backend="ort"), remote_python=str(server.python))
    result = deploy_table(tiny, [device.host], config,
                          DeviceTableConfig(grid=GridConfig(grid="model", batch=2), threads=1, protocol=PROTOCOL),
                          out=tmp_path / "out", source=TINY)
    assert result["failed"] == {} and result["precision"] == "fp32"
    table = LatencyTable.load(result["tables"][device.host.label])
    # the target says where it was measured: the device runner's ONNX Runtime, the fake nvpmodel's mode
    assert table.target.backend == "onnxruntime" and table.target.batch == 2 and table.target.threads == 1
    assert table.target.power_mode == "25W" and table.target.device    # the fake nvpmodel's current mode
    assert table.device_record["power_mode"]["name"] == "25W"
    assert {p.key for p in model_parts(tiny)} < set(table.entries) and len(table.entries) == 5
    assert all(e.latency["iterations"] == 3 for e in table.entries.values())
    # the runner ran every part graph on the device, energy sampling off
    run = json.loads((tmp_path / "out" / "devices" / device.host.label / "results" / "run.json").read_text())
    assert run["config"]["energy"] is False and set(s["status"] for s in run["variants"].values()) == {"done"}
    assert predict_model(tiny, table, table.target).total_ms > 0
    with pytest.raises(EdgeError, match="measured on another target"):
        predict_model(tiny, table, Target("onnxruntime", table.target.device, "fp32", 1, 1, "15W"))


@pytest.mark.slow  # about 6 s on 2 shared cores; the library path above runs by default
def test_cli_deploy_latency_table(server, tmp_path, capsys):
    device = server.devices[0]
    out = tmp_path / "tables"
    code = main(["deploy", "--latency-table", TINY, "--host", str(device.host), "--identity", str(server.user_key),
                 "--known-hosts", str(server.known_hosts), "--remote-python", str(server.python), "--backend", "ort",
                 "--grid", "model", "--threads", "1", "--power-mode", "15W", "--nvpmodel-conf",
                 str(device.fakes.nvpmodel_conf), "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    table = LatencyTable.load(summary["tables"][device.host.label])
    assert table.target.backend == "onnxruntime" and table.target.power_mode == "15W"   # the mode set for the run
    # a bundle and --latency-table together are refused
    assert main(["deploy", str(out), "--latency-table", TINY, "--host", str(device.host)]) == 2


def test_missing_results_are_refused(tmp_path, tiny):
    (tmp_path / "run.json").write_text(json.dumps({"backend": "ort", "device": {}, "variants": {}}))
    grid = {"000-embed": (model_parts(tiny)[0], 1)}
    with pytest.raises(EdgeError, match="did not time 1 of 1 parts"):
        table_from_results(tmp_path, grid, "fp32", 1)


def test_tensorrt_path_against_the_fake_device(tmp_path, tiny):
    """The TensorRT path (fp16 part graphs, engines built and cached by the runner) against the FAKE
    TensorRT of tests/fake_tensorrt.py: structure only, its timings are not a measurement."""
    reason = why_no_sshd()
    if reason:
        pytest.skip(reason)
    server = start_sshd(tmp_path / "sshd", [{"FAKE_DEVICE_TENSORRT": "1"}])
    try:
        device = server.devices[0]
        config = DeployConfig(ssh=server.options(), runner=RunnerOptions(backend="tensorrt"),
                              remote_python=str(server.python))
        result = deploy_table(tiny, [device.host], config,
                              DeviceTableConfig(grid=GridConfig(grid="model"), protocol=PROTOCOL),
                              out=tmp_path / "out", source=TINY)
    finally:
        server.stop()
    assert result["failed"] == {} and result["precision"] == "fp16"
    table = LatencyTable.load(result["tables"][device.host.label])
    assert (table.target.backend, table.target.precision, table.target.threads) == ("tensorrt", "fp16", None)
    assert table.target.device.startswith("NVIDIA Jetson Orin Nano") and table.device_record["sm_count"] == 8


def test_the_planner_plans_on_a_table_timed_over_loopback_ssh(server, tiny, tmp_path):
    """Issue 20: the full grid timed by the device runner over real SSH is a table `edge plan --table` takes:
    a plan within the budget, predicted from the device's timings, saved restorable; nothing timed here."""
    from edge.compress import load_artifact
    from edge.planner import SearchConfig
    from edge.planner.job import PlanJobConfig, TargetConfig, plan_to_budget

    device = server.devices[0]
    config = DeployConfig(ssh=server.options(), runner=RunnerOptions(backend="ort"), remote_python=str(server.python))
    result = deploy_table(tiny, [device.host], config, DeviceTableConfig(grid=GridConfig(grid="full"), threads=1,
                                                                         protocol=PROTOCOL),
                          out=tmp_path / "out", source=TINY)
    path = result["tables"][device.host.label]
    table = LatencyTable.load(path)
    search = SearchConfig(budget=0.9, data="fmnist-mini", samples=40, holdout=40, shortlist=3, refresh=3)
    asked = TargetConfig(table=str(path), backend="onnxruntime", device=table.target.device)
    record = plan_to_budget(tiny, {"model": TINY}, tmp_path / "plan", PlanJobConfig(search, target=asked))
    chosen = record["result"]["chosen"]
    assert record["target"]["backend"] == "onnxruntime" and record["target"]["device"] == table.target.device
    assert chosen["predicted_ms"] <= record["budget_ms"] == pytest.approx(0.9 * record["result"]["original"]
                                                                          ["predicted_ms"])
    assert record["timed"] is None                       # the device's table: its target is not this machine
    model, manifest = load_artifact(tmp_path / "plan" / "model")
    assert manifest["plan"] == chosen["plan"]
    assert predict_model(model, table, table.target).total_ms == pytest.approx(chosen["predicted_ms"])
    with pytest.raises(EdgeError, match="another target"):  # the same table asked for as another backend
        plan_to_budget(tiny, {"model": TINY}, tmp_path / "again",
                       PlanJobConfig(search, target=TargetConfig(table=str(path), backend="tensorrt")))
    assert not (tmp_path / "again").exists()
