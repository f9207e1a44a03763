"""The host trusts nothing a device sends back, and the device's words reach the user (issue 29, point 8);
the power settings of a non-root login user (point 3); a client killed mid-benchmark (the runner goes on)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from edge.cli import main
from edge.deploy import RunnerOptions, deploy
from edge.deploy.device_deploy import RUNNER_LOCK
from tests.edge.deploy.conftest import config, only, ssh_args, statuses
from tests.edge.deploy.sshd import DEVICE_USER, NO_SUDOERS_RULE, device_interpreter

HOSTILE_TAR = Path(__file__).parent / "hostile_tar.py"
CASES = {  # the case: what the refusal names
    "absolute-link": "results/a.fp32.json' as a link to",
    "relative-link": "results/a.fp32.json' as a link to",
    "dotdot-name": "'results/../../../escaped.json', a name outside results/",
    "absolute-name": "a name outside results/",
    "malformed-json": "results/run.json is not valid JSON",
    "result-name-dotdot": "results/run.json names '../../victim.json' as the result of 'a.fp32'",
    "wrong-type": "results/a.fp32.json: latency.median_ms is str 'fast'",
}


@pytest.fixture
def hostile_bin():
    """A folder with the hostile device's `tar` (tests/edge/deploy/hostile_tar.py), readable by the device user."""
    folder = Path(tempfile.mkdtemp(prefix="edge-hostile-"))
    folder.chmod(0o755)
    tar = folder / "tar"
    tar.write_text(f'#!/bin/sh\nexec "{device_interpreter().python}" -I -S "{HOSTILE_TAR}" "$@"\n')
    tar.chmod(0o755)
    yield folder
    tar.unlink()
    folder.rmdir()


def tree(folder: Path, run_folder: Path) -> dict:
    """Every path under ``folder`` but the run folder and the test sshd's own folders (its log grows), with its
    bytes (files) or None (folders)."""
    def kept(path: Path) -> bool:
        top = path.relative_to(folder).parts[0]
        return path != run_folder and run_folder not in path.parents and not top.startswith("sshd")

    return {p: (None if p.is_dir() else p.read_bytes()) for p in folder.rglob("*") if kept(p)}


def test_hostile_results_are_refused_with_exit_2_naming_the_file_and_nothing_outside_changes(sshd, bundle, tmp_path,
                                                                                           hostile_bin, capsys):
    """Seven devices, each sending its results back altered by a hostile `tar`: links out of the run folder, names
    with '..', an absolute name, malformed JSON, a figure of the wrong type, a result file named outside results/.
    Each is refused, named, without a traceback; the victim file (which a naive fetch would overwrite or read) and
    everything else outside the run folder stays as it was; nothing of the refused results is written."""
    victim = tmp_path / "victim.json"
    victim.write_text('{"precious": true}\n')
    server = sshd(*({"HOSTILE_CASE": case, "HOSTILE_TARGET": str(victim), "PATH": f"{hostile_bin}:/usr/bin:/bin"}
                    for case in CASES))
    out = tmp_path / "run"
    before = tree(tmp_path, out)
    hosts = [arg for device in server.devices for arg in ("--host", str(device.host))]
    code = main(["deploy", str(bundle), *hosts, *ssh_args(server), "--backend", "ort", "--out", str(out), "--json",
                 "--connect-timeout", "60"])  # seven devices at once on two busy cores: no unreachable by load
    printed = capsys.readouterr()
    assert code == 2, printed.err
    assert "Traceback" not in printed.err
    records = {d["label"]: d for d in json.loads(printed.out)["devices"]}
    for device, (case, named) in zip(server.devices, CASES.items()):
        record = records[device.host.label]
        assert record["error_kind"] == "refused results", (case, record["error"])
        assert named in record["error"] and "refused, nothing of it was written" in record["error"], case
        assert named in printed.err  # the whole error on the terminal too
        assert not (out / device.host.label / "results").exists(), case  # nothing of the refused results kept
        assert sorted(p.name for p in (out / device.host.label).iterdir()) == ["deploy.json", "deploy.log"]
    assert victim.read_text() == '{"precious": true}\n'
    assert tree(tmp_path, out) == before  # nothing outside the run folder changed
    assert not list(tmp_path.rglob("escaped.json")) and not list(Path("/tmp").glob("escaped.json"))
    assert not [p for p in out.rglob("*") if p.is_symlink()]


def test_without_the_sudoers_rule_the_run_is_refused_before_any_build_naming_the_line(sshd, bundle, tmp_path, capsys):
    """The login user (not root) lacks the rule: the runner refuses before TensorRT builds anything, and the host
    prints the device's message with the exact sudoers line; an unknown power mode is printed with the modes
    the device knows."""
    server = sshd({NO_SUDOERS_RULE: "1", "FAKE_DEVICE_TENSORRT": "1"}, {"FAKE_DEVICE_TENSORRT": "1"})
    bare, allowed = server.devices
    args = [*ssh_args(server), "--power-mode", "15W", "--lock-clocks", "--nvpmodel-conf", str(bare.fakes.nvpmodel_conf)]
    code = main(["deploy", str(bundle), "--host", str(bare.host), *args, "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 1
    line = (f"{DEVICE_USER} ALL=(root) NOPASSWD: {bare.fakes.bin_dir / 'nvpmodel'}, "
            f"{bare.fakes.bin_dir / 'jetson_clocks'}")
    assert line in err and "--power-mode and --lock-clocks need root rights" in err and "sudo -n" in err
    assert "the runner refused the bundle or an option (exit 2)" in err
    assert not (bare.cache / "engines").exists()  # nothing built
    assert [c for c in bare.fakes.calls() if c[:2] == ["nvpmodel", "-m"] or c[0] == "jetson_clocks"] == []
    summary = json.loads((tmp_path / "a" / bare.host.label / "results" / "run.json").read_text())
    assert summary["variants"] == {} and line in summary["error"]
    # an unknown power mode: the device's words (the value and the alternatives) on the host's terminal
    code = main(["deploy", str(bundle), "--host", str(allowed.host), *ssh_args(server), "--power-mode", "99W",
                 "--nvpmodel-conf", str(allowed.fakes.nvpmodel_conf), "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 1
    assert "power mode '99W' is not defined on this module" in err and "one of 15W, 25W, MAXN_SUPER" in err
    assert not (allowed.cache / "engines").exists()


def test_a_client_killed_mid_benchmark_leaves_the_runner_running_and_a_second_deploy_fetches_without_rerunning(
        sshd, bundle, tmp_path):
    """`edge deploy` (and its ssh client) killed while the device benchmarks: the runner writes to a file on the
    device, not into the closed channel, and finishes; run.json has `finished` and `exit_code`; a second
    deploy copies nothing, recomputes nothing (every variant cached) and fetches the results."""
    server = sshd({"FAKE_DEVICE_PAUSE_AT": "10"})
    device = server.devices[0]
    remote = device.home / "bundle"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    edge = [sys.executable, "-c", "import sys; from edge.cli import main; sys.exit(main())"]
    client = subprocess.Popen([*edge, "deploy", str(bundle), "--host", str(device.host), *ssh_args(server),
                               "--backend", "ort", "--remote-dir", str(remote), "--out", str(tmp_path / "first")],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = device.home / "paused"
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert client.poll() is None and time.monotonic() < deadline, "the runner never reached the benchmark"
            time.sleep(0.05)
        os.killpg(client.pid, signal.SIGKILL)  # edge deploy and its ssh client, mid-benchmark
        client.wait(timeout=10)
    finally:
        marker.unlink(missing_ok=True)  # the runner goes on
    summary_path = remote / "results" / "run.json"
    deadline = time.monotonic() + 120
    while not (summary_path.exists() and json.loads(summary_path.read_text()).get("finished")):
        assert time.monotonic() < deadline, "the runner did not finish after its client was killed"
        time.sleep(0.1)
    summary = json.loads(summary_path.read_text())
    assert summary["exit_code"] == 0 and summary["partial"] is False
    assert {k: v["status"] for k, v in summary["variants"].items()} == {"a.fp32": "done", "b.fp32": "done"}
    done_before = {v: (remote / "results" / f"{v}.json").read_bytes() for v in ("a.fp32", "b.fp32")}
    again = only(deploy(bundle, [device.host], config(server, remote_dir=str(remote),
                                                       runner=RunnerOptions(backend="ort")), out=tmp_path / "second"))
    assert again["status"] == "ok", again["error"]
    assert again["copy"]["sent"] == []
    results = tmp_path / "second" / device.host.label / "results"
    assert statuses(results) == {"a.fp32": "cached", "b.fp32": "cached"}
    assert {v: (results / f"{v}.json").read_bytes() for v in done_before} == done_before


def runners_holding_or_waiting(user: str, folder: Path) -> int:
    """The device user's `flock .edge-runner.lock ...` processes in ``folder``: the runner holding the lock and
    any waiting (by working folder: a runner an earlier test left behind in its own folder does not count)."""
    done = subprocess.run(["pgrep", "-u", user, "-f", f"^flock {RUNNER_LOCK} "], capture_output=True, text=True)
    return sum(1 for pid in done.stdout.split() if _cwd(pid) == folder.resolve())


def _cwd(pid: str) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:  # it ended meanwhile
        return None


def test_a_second_deploy_while_the_first_runner_still_runs_waits_for_it_and_recomputes_nothing(sshd, bundle,
                                                                                              tmp_path):
    """The first deploy's runner still benchmarks: a second deploy does not benchmark beside it (the two would share
    the GPU and the power rails); it waits (for the first deploy's folder lock while that deploy's client is there,
    for the runner's lock when it is gone), then finds every variant done."""
    server = sshd({"FAKE_DEVICE_PAUSE_AT": "10"})
    device = server.devices[0]
    remote = device.home / "bundle"
    options = config(server, remote_dir=str(remote), runner=RunnerOptions(backend="ort"))
    first = threading.Thread(target=deploy, args=(bundle, [device.host], options), kwargs={"out": tmp_path / "first"})
    first.start()
    marker = device.home / "paused"
    wait_for(marker.exists, "the first runner to reach its benchmark")
    second: dict = {}
    heard: list[str] = []
    waiting = threading.Thread(target=lambda: second.update(only(deploy(bundle, [device.host], options,
                                                                        out=tmp_path / "second",
                                                                        progress=heard.append))))
    waiting.start()
    wait_for(lambda: any("waiting: another edge deploy" in m for m in heard), "the second deploy to wait for the first")
    assert runners_holding_or_waiting(DEVICE_USER, remote) == 1  # the first's runner only: none beside it
    marker.unlink()  # the first runner goes on and finishes; then the second takes the lock
    first.join(timeout=120)
    waiting.join(timeout=120)
    assert second["status"] == "ok", second["error"]
    assert statuses(tmp_path / "first" / device.host.label / "results") == {"a.fp32": "done", "b.fp32": "done"}
    assert statuses(tmp_path / "second" / device.host.label / "results") == {"a.fp32": "cached", "b.fp32": "cached"}


def wait_for(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
