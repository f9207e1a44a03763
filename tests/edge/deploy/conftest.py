"""The loopback devices (tests/edge/deploy/sshd.py), a small bundle and helpers shared by the deploy tests."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edge.bundle import BundleConfig, make_bundle
from edge.deploy import DeployConfig, RunnerOptions
from jetson.bundle import Protocol
from tests.edge.deploy.sshd import start_sshd, why_no_sshd
from tests.edge.trt.test_build import tiny_onnx

# short: 2 warm-up calls and 20 timed ones, no warm-up or timed durations (trtexec's 0.2 s and 3 s, 10 s with energy,
# are the defaults; tests of the protocol itself are in tests/jetson/test_protocol.py)
PROTOCOL = Protocol(warmup=2, warmup_s=None, iterations=20, duration_s=None, energy_duration_s=None, idle_s=0.3)


@pytest.fixture
def sshd(tmp_path):
    """``sshd(faults, ...)``: a started server with one device per argument (its extra environment)."""
    reason = why_no_sshd()
    if reason:
        pytest.skip(reason)
    servers = []

    def start(*faults: dict):
        servers.append(start_sshd(tmp_path / f"sshd{len(servers)}", list(faults) or [{}]))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def bundle(tmp_path) -> Path:
    """Two tiny variants (a, b: other weights), fp32, a short protocol."""
    b = onnx.load(str(tiny_onnx(tmp_path / "b.onnx")))
    b.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones(8, np.float32), "b1"))
    onnx.save(b, str(tmp_path / "b.onnx"))
    graphs = [tiny_onnx(tmp_path / "a.onnx"), tmp_path / "b.onnx"]
    make_bundle(graphs, tmp_path / "bundle", BundleConfig(check_data="fmnist-mini", precisions=("fp32",),
                                                          protocol=PROTOCOL))
    return tmp_path / "bundle"


def ssh_args(server) -> list[str]:
    return ["--identity", str(server.user_key), "--known-hosts", str(server.known_hosts), "--connect-timeout", "5",
            "--remote-python", str(server.python)]


def config(server, **changes) -> DeployConfig:
    runner = changes.pop("runner", RunnerOptions(backend="ort"))
    return DeployConfig(ssh=server.options(**changes.pop("ssh", {})), runner=runner,
                        remote_python=str(server.python), **changes)


def statuses(results: Path) -> dict:
    return {k: v["status"] for k, v in json.loads((results / "run.json").read_text())["variants"].items()}


def only(result: dict) -> dict:
    assert len(result["devices"]) == 1
    return result["devices"][0]
