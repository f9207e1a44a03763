"""Faults of ``edge deploy`` tried as a new user would (issue 43), over real SSH (tests/edge/deploy/sshd.py): an
unknown power mode named on the terminal with the device's modes, two deploys of one bundle to one device started
together (one runs, the other waits for it), and ssh never reading the caller's stdin."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from edge.bundle import BundleConfig, make_bundle
from edge.cli import main
from edge.deploy import deploy
from edge.deploy.ssh import Connection
from tests.edge.deploy.conftest import PROTOCOL, config, only, ssh_args, statuses
from tests.edge.trt.test_build import tiny_onnx

REPO = Path(__file__).resolve().parents[3]


def test_an_unknown_power_mode_is_named_on_the_terminal_with_the_devices_modes(sshd, bundle, tmp_path, capsys):
    server = sshd({})
    device = server.devices[0]
    code = main(["deploy", str(bundle), "--host", str(device.host), *ssh_args(server), "--backend", "ort",
                 "--power-mode", "NOSUCH",
                 "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    terminal = out.out + out.err
    assert code == 1
    assert "NOSUCH" in terminal
    assert "15W, 25W, MAXN_SUPER" in terminal  # the modes of the device's nvpmodel configuration


def test_two_edge_deploy_commands_of_one_bundle_to_one_device_started_together_both_run(sshd, tmp_path):
    """Two `edge deploy` of one .tar.gz bundle started together (two terminals): both copied the archive into one
    upload file and unpacked it while the other wrote it, and both were refused. Now the second waits."""
    server = sshd({})
    device = server.devices[0]
    make_bundle([tiny_onnx(tmp_path / "a.onnx")], tmp_path / "made" / "bundle",
                BundleConfig(check_data="fmnist-mini", precisions=("fp32",), protocol=PROTOCOL), tar=True)
    archive = tmp_path / "made" / "bundle.tar.gz"
    argv = [sys.executable, "-m", "edge", "deploy", str(archive), "--host", str(device.host), *ssh_args(server),
            "--backend", "ort"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for attempt in range(3):  # the race was not lost every time: three tries
        runs = [subprocess.Popen([*argv, "--out", str(tmp_path / f"{attempt}.{name}")], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
                for name in ("first", "second")]
        said = [run.communicate(timeout=300)[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], said


def test_a_second_deploy_of_one_folder_waits_for_the_first_to_fetch(sshd, bundle, tmp_path):
    """The first deploy is held in its copy until the second says it waits; both then finish: one ran, the other
    waited for it (never both refused)."""
    server = sshd({})
    device = server.devices[0]
    second_waits = threading.Event()
    results: dict[str, dict] = {}
    heard: dict[str, list[str]] = {"first": [], "second": []}

    def second_progress(message: str) -> None:
        heard["second"].append(message)
        if "waiting: another edge deploy" in message:
            second_waits.set()

    def first_progress(message: str) -> None:
        heard["first"].append(message)
        if "copying" in message and "second" not in results:
            results["second"] = {}
            threading.Thread(target=lambda: results.update(second=only(deploy(
                bundle, [device.host], config(server), out=tmp_path / "second", progress=second_progress)))).start()
            second_waits.wait(timeout=60)  # the first holds the folder meanwhile

    results["first"] = only(deploy(bundle, [device.host], config(server), out=tmp_path / "first",
                                   progress=first_progress))
    for _ in range(600):
        if results.get("second"):
            break
        time.sleep(0.5)
    assert second_waits.is_set(), heard["second"]
    assert results["first"]["status"] == results["second"]["status"] == "ok", \
        (results["first"]["error"], results["second"]["error"])
    assert statuses(tmp_path / "first" / device.host.label / "results") == {"a.fp32": "done", "b.fp32": "done"}
    assert statuses(tmp_path / "second" / device.host.label / "results") == {"a.fp32": "cached", "b.fp32": "cached"}
    assert results["second"]["copy"]["sent"] == []  # the first had copied everything


def test_remote_commands_never_read_the_callers_stdin(sshd):
    """ssh reads its stdin and sends it to the remote command: `edge deploy ... &` then stops on SIGTTIN, a script's
    input is swallowed and fleet threads share the terminal. The commands that send nothing run with stdin from
    /dev/null and `-n`: here the caller's stdin is a pipe that holds a line and stays open (a terminal that never
    ends), and the remote `cat` must see nothing of it (else it reads the line, then waits for more until the
    timeout) and leave the line for the caller."""
    server = sshd({})
    device = server.devices[0]
    connection = Connection(device.host, server.options())
    assert "-n" in connection.options.argv(device.host, no_stdin=True)
    read_end, write_end = os.pipe()
    os.write(write_end, b"the script's next line\n")
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        done = connection.run("cat", timeout=30)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    try:
        assert done.returncode == 0 and done.stdout == b""
        os.set_blocking(read_end, False)
        assert os.read(read_end, 100) == b"the script's next line\n"  # still there for the caller
    finally:
        os.close(read_end)
        os.close(write_end)
