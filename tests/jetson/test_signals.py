"""Signals sent to a real runner process during a TensorRT build (issue 29, D3).

The build is FakeTensorRT's (tests/fake_tensorrt.py), which behaves as TensorRT's bindings do
(pyCore.cpp, 10.3): while ``build_serialized_network`` runs, Python runs only inside the logger's and the
progress monitor's callbacks, and whatever they raise is printed and dropped. A handler that raises is
therefore lost there; the runner's handler notes the signal and its progress monitor cancels the build.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.edge.trt.test_build import NANO_MODEL
from tests.jetson.test_runner import runner_env

RUN_ON_FAKES = Path(__file__).with_name("run_on_fakes.py")
#: the acceptance bound (issue 29): cancelled, device restored and exited within this many seconds of the signal
STOP_WITHIN_S = 2.0


def start_runner(bundle: Path, fake_jetson, tmp_path: Path, *extra: str, build_seconds: float = 60.0,
                 stdout=subprocess.DEVNULL, new_session: bool = False) -> subprocess.Popen:
    model = tmp_path / "device-tree-model"
    model.write_bytes(NANO_MODEL.encode() + b"\x00")
    env = runner_env(cache=str(tmp_path / "cache"), **fake_jetson.variables(), FAKE_BUILD_SECONDS=str(build_seconds),
                     FAKE_DEVICE_TREE_MODEL=str(model))
    argv = [sys.executable, str(RUN_ON_FAKES), "run", "--bundle", str(bundle), "--energy", "off", *extra]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=new_session)


def wait_for_line(process: subprocess.Popen, text: str) -> list[str]:
    """The runner's stderr lines up to the first that contains ``text``."""
    lines = []
    for line in process.stderr:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"the runner ended before saying {text!r}: {''.join(lines)}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_a_build_cancels_it_restores_the_device_and_exits_128_plus_n(bundle, fake_jetson, tmp_path,
                                                                                      signum):
    process = start_runner(bundle, fake_jetson, tmp_path, "--lock-clocks", "--nvpmodel-conf",
                           str(fake_jetson.nvpmodel_conf))
    try:
        wait_for_line(process, "TensorRT: Building engine")  # then 60 s of fake build, unless cancelled
        process.send_signal(signum)
        _, err = process.communicate(timeout=STOP_WITHIN_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signum, err
    assert "Exception caught in" not in err  # nothing raised into TensorRT's callbacks
    calls = fake_jetson.calls()
    assert calls[-2][:2] == ["jetson_clocks", "--restore"] and ["jetson_clocks"] in calls  # locked, then restored
    assert calls[-1] == ["jetson_clocks", "--show"]  # and read back
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["exit_code"] == 128 + signum and summary["partial"] is True and summary["finished"]
    assert summary["variants"]["a.fp32"]["status"] == "interrupted" and "b.fp32" not in summary["variants"]
    trt_log = (bundle / "results" / "logs" / "a.fp32.trt.log").read_text()
    assert "[fake] the build was cancelled (step_complete returned False)" in trt_log
    assert not list((tmp_path / "cache" / "engines").glob("*.engine"))  # nothing cached from a cancelled build


def test_ctrl_c_at_a_terminal_reaches_the_build_process_too_and_the_run_still_exits_130(bundle, fake_jetson,
                                                                                        tmp_path):
    """A terminal's Ctrl-C goes to the whole foreground process group: the runner and its build process
    (jetson.build_process) both get SIGINT; the build is cancelled once, the runner exits 130."""
    process = start_runner(bundle, fake_jetson, tmp_path, "--lock-clocks", new_session=True)
    try:
        wait_for_line(process, "TensorRT: Building engine")  # printed by the build process, relayed
        os.killpg(process.pid, signal.SIGINT)  # the runner leads its own group here, as a shell's job does
        _, err = process.communicate(timeout=STOP_WITHIN_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 128 + signal.SIGINT, err
    assert "Exception caught in" not in err and "Traceback" not in err
    assert fake_jetson.calls()[-2][:2] == ["jetson_clocks", "--restore"]
    summary = json.loads((bundle / "results" / "run.json").read_text())
    assert summary["variants"]["a.fp32"]["status"] == "interrupted"
    assert "[fake] the build was cancelled" in (bundle / "results" / "logs" / "a.fp32.trt.log").read_text()
