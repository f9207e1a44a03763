"""TF32 (issue 29, point 9): TensorRT runs an fp32 engine's matrix products in TF32 by default (about 1e-3
relative from ONNX Runtime). Both builders record it; ``--no-tf32`` clears ``BuilderFlag.TF32`` (trtexec:
``--noTF32``), against FakeTensorRT 10.3 and 11.0 (TF32 is not a weak-typing flag: it stays in 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.bundle import BundleConfig, make_bundle
from edge.trt import BuildConfig
from edge.trt.trtexec_command import trtexec_command
from jetson.bundle import BuildSpec, read_bundle
from jetson.trtexec import build_argv
from tests.edge.trt.test_build import build, fake_trt, request_of, tiny_onnx  # noqa: F401 - fake_trt: a fixture


@pytest.mark.parametrize("feature_set", ["10.3", "11.0"])
def test_edge_build_records_tf32_and_no_tf32_clears_the_flag(tmp_path, fake_trt, feature_set):
    fake_trt(feature_set)
    out, manifest = build(tmp_path)
    assert manifest["tf32"] is True and manifest["knobs"]["honoured"]["tf32"] is True
    assert request_of(out)["cleared_flags"] == []   # TensorRT's default: TF32 on
    out, manifest = build(tmp_path, BuildConfig(tf32=False))
    assert manifest["tf32"] is False and manifest["knobs"]["honoured"]["tf32"] is False
    assert manifest["config"]["tf32"] is False and request_of(out)["cleared_flags"] == ["TF32"]


def test_edge_build_cli_takes_no_tf32(tmp_path, capsys):
    """Without trtexec here, `edge build --trtexec` prints the trtexec command of the build config."""
    from edge.cli import main

    graph, engine = str(tiny_onnx(tmp_path / "m.onnx")), str(tmp_path / "m.engine")
    assert main(["build", graph, "--out", engine, "--trtexec"]) == 0
    assert "--noTF32" not in capsys.readouterr().out
    assert main(["build", graph, "--out", engine, "--trtexec", "--no-tf32"]) == 0
    assert "--noTF32" in capsys.readouterr().out


def test_trtexec_gets_no_tf32_on_both_sides():
    spec = BuildSpec(precision="fp32", tf32=False)
    argv, _ = build_argv("trtexec", Path("g.onnx"), Path("e.engine"), spec, (10, 3, 0))
    assert "--noTF32" in argv
    assert "--noTF32" not in build_argv("trtexec", Path("g.onnx"), Path("e.engine"), BuildSpec(precision="fp32"),
                                        (10, 3, 0))[0]
    assert "--noTF32" in trtexec_command("g.onnx", "e.engine", BuildConfig(tf32=False), version=(10, 3, 0))
    assert "--noTF32" not in trtexec_command("g.onnx", "e.engine", BuildConfig(), version=(10, 3, 0))


def test_bundle_build_configs_carry_tf32(tmp_path):
    graph = tiny_onnx(tmp_path / "m.onnx")
    make_bundle([graph], tmp_path / "on", BundleConfig(check_data="fmnist-mini", precisions=("fp32",)))
    make_bundle([graph], tmp_path / "off", BundleConfig(check_data="fmnist-mini", precisions=("fp32",), tf32=False))
    assert [v.build.tf32 for v in read_bundle(tmp_path / "on").variants] == [True]
    assert [v.build.tf32 for v in read_bundle(tmp_path / "off").variants] == [False]
