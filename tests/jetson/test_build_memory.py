"""Builds that fit an 8 GB Orin Nano (issue 29, point 5): the memory limits chosen for it, the build's
peak memory measured in its own process, and a build that runs out of memory reported with the fix while
the run goes on. The builds are FakeTensorRT's, in the runner's child process
(tests/jetson/child_fakes; FAKE_TENSORRT_OUT_OF_MEMORY makes one run out of memory)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jetson.build_process import SWAP_LINES, is_out_of_memory_message, mem_available_mib
from jetson.bundle import DEFAULT_TACTIC_DRAM_MIB, DEFAULT_WORKSPACE_MIB, BuildSpec
from jetson.engine import configure_builder
from jetson.errors import JetsonError
from jetson.features import detect_features
from jetson.runner import RunOptions, run
from tests.fake_tensorrt import OUT_OF_MEMORY_VARIABLE, make_fake_tensorrt


@pytest.mark.parametrize("form, says", [
    ("killed", "the build of {graph} was killed by SIGKILL: the kernel's out-of-memory killer"),
    ("none", "TensorRT ran out of memory building {graph}"),
])
def test_a_build_the_fake_fails_for_memory_is_reported_with_the_fix_and_the_next_variant_builds(
        bundle, fake_device, tmp_path, monkeypatch, form, says):
    monkeypatch.setenv(OUT_OF_MEMORY_VARIABLE, f"graphs/a/:{form}")
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache")) == 1  # 1: a variant failed
    summary = json.loads((bundle / "results" / "run.json").read_text())
    failed, done = summary["variants"]["a.fp32"], summary["variants"]["b.fp32"]
    assert failed["status"] == "failed" and done["status"] == "done"
    error = failed["error"]
    assert says.format(graph=bundle / "graphs/a/fp32.onnx") in error
    # the fix: the exact options of `edge bundle` and the swap lines
    assert "`edge bundle ... --workspace 1024 --tactic-dram 2048` (now 2048 and 3072 MiB)" in error
    assert f"`{SWAP_LINES}`" in error and "`edge bundle ... --opt-level 1` (builder optimisation level, now 3)" in error
    assert "peak RSS" in error and "MemAvailable" in error
    assert json.loads((bundle / "results" / "a.fp32.json").read_text())["error"] == error
    b = json.loads((bundle / "results" / "b.fp32.json").read_text())
    assert b["partial"] is False and b["engine"]["build_memory"]["peak_rss_mib"] > 0
    run_log = (bundle / "results" / "logs" / "run.log").read_text()
    assert "a.fp32: failed: " in run_log and "b.fp32: median" in run_log
    if form == "none":  # TensorRT's own message, in the variant's TensorRT log
        assert "Error Code 2: OutOfMemory" in (bundle / "results" / "logs" / "a.fp32.trt.log").read_text()
    assert len(list((tmp_path / "cache" / "engines").glob("*.engine"))) == 1  # b's only


def test_the_manifest_and_the_result_carry_the_peak_memory_and_the_memory_limits(bundle, fake_device, tmp_path):
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a",))) == 0
    engine = json.loads((bundle / "results" / "a.fp32.json").read_text())["engine"]
    manifest = json.loads(Path(f"{engine['path']}.json").read_text())
    for facts in (engine, manifest):
        assert facts["knobs"]["honoured"]["workspace_mib"] == DEFAULT_WORKSPACE_MIB == 2048
        assert facts["knobs"]["honoured"]["tactic_dram_mib"] == DEFAULT_TACTIC_DRAM_MIB == 3072
        memory = facts["build_memory"]
        # the child's peak RSS: a Python interpreter with numpy and onnx, tens of MiB at least
        assert 20 < memory["peak_rss_mib"] < 4096
        available = memory["mem_available_mib"]
        assert set(available) == {"before", "lowest", "after"} and memory["sampled_every_s"] == 0.05
        if mem_available_mib() is not None:  # Linux: MemAvailable read before, during and after
            assert available["lowest"] <= available["before"]
            assert memory["system_use_mib"] == pytest.approx(available["before"] - available["lowest"], abs=0.11)
        assert "GPU" in memory["meaning"]
    assert manifest["config"]["tactic_dram_mib"] == 3072 and manifest["config"]["workspace_mib"] == 2048
    # an engine from the cache: its result carries the same facts, from the manifest
    assert run(RunOptions(bundle=bundle, energy="off", cache_dir=tmp_path / "cache", variants=("a",), force=True)) == 0
    cached = json.loads((bundle / "results" / "a.fp32.json").read_text())["engine"]
    assert cached["cached"] is True
    assert cached["build_memory"] == engine["build_memory"] and cached["knobs"] == engine["knobs"]


def test_a_tensorrt_without_the_tactic_memory_pool_says_so(monkeypatch):
    trt = make_fake_tensorrt("10.3")
    trt.MemoryPoolType = type("MemoryPoolType", (), {"WORKSPACE": trt.MemoryPoolType.WORKSPACE})  # as 8.5
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    config = trt.Builder(None).create_builder_config()
    knobs = configure_builder(config, BuildSpec(precision="fp32"), detect_features(trt))
    assert knobs["honoured"]["workspace_mib"] == 2048 and "tactic_dram_mib" not in knobs["honoured"]
    assert "no MemoryPoolType.TACTIC_DRAM (8.6+)" in knobs["not_available"]["tactic_dram_mib"]
    assert config.pools == {"WORKSPACE": 2048 << 20}


def test_tactic_memory_below_the_workspace_is_refused_naming_both():
    with pytest.raises(JetsonError, match="tactic memory 1024 MiB below the workspace 2048 MiB"):
        BuildSpec(precision="fp16", tactic_dram_mib=1024)
    assert BuildSpec(precision="fp16", tactic_dram_mib=None).to_json()["tactic_dram_mib"] is None


@pytest.mark.parametrize("message, out_of_memory", [
    ("[virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory (Requested size was 2147483648 "
     "bytes.)", True),
    ("Cuda Runtime (out of memory)", True),
    ("std::bad_alloc", True),
    ("[graphShapeAnalyzer.cpp] Error Code 4: Internal Error (no implementation)", False),
])
def test_tensorrts_out_of_memory_messages_are_told_apart(message, out_of_memory):
    assert is_out_of_memory_message(message) is out_of_memory


def test_the_options_the_fix_names_exist_in_edge_bundle():
    done = subprocess.run([sys.executable, "-m", "edge", "bundle", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--workspace" in done.stdout and "--tactic-dram" in done.stdout and "--opt-level" in done.stdout
