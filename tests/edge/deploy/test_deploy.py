"""``edge deploy`` over real SSH: OpenSSH's sshd on 127.0.0.1 (tests/edge/deploy/sshd.py), the device
runner really running there on ONNX Runtime, the named fakes of tegrastats, nvpmodel and
jetson_clocks on the remote PATH, and faults injected by the FAKE device Python."""

import json
import shutil
import socket
from pathlib import Path

import pytest

from edge.bundle import BundleConfig, make_bundle
from edge.cli import main
from edge.deploy import RunnerOptions, checked_source, deploy, parse_host, read_hosts
from edge.deploy.device_deploy import DEPLOY_LOCK, RUNNER_LOCK, DeviceDeploy
from edge.errors import EdgeError
from jetson.bundle import read_bundle
from jetson.energy import Window, rail_energy
from jetson.sampler import read_sampler_log
from tests.conftest import TINY
from tests.edge.deploy.conftest import PROTOCOL, config, only, ssh_args, statuses
from tests.edge.deploy.sshd import keygen
from tests.edge.trt.test_build import tiny_onnx


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """A small pipeline run of the reference architecture (scaled down): two variants, a report."""
    root = tmp_path_factory.mktemp("pipeline")
    (root / "recipe.yaml").write_text(f"""model: "{TINY}"
data: fmnist-mini
threads: 1
calibration: {{samples: 40}}
analysis: {{enabled: false}}
evaluate: {{samples: 100, batch_size: 100}}
profile: {{warmup: 1, iterations: 3}}
variants:
  - name: original
  - name: lin
    plan: linear:1-3
""")
    assert main(["pipeline", "--recipe", str(root / "recipe.yaml"), "--out", str(root / "run")]) == 0
    return root / "run"


def test_end_to_end_pipeline_bundle_deploy_report(sshd, pipeline_run, tmp_path, capsys):
    """Pipeline run -> bundle -> deploy over SSH (ORT backend, power mode and clocks set) -> the run's
    report gains the device section (the pipeline's writer renders it: edge deploy hands it the fetched
    results); the remote folder's name holds a space and shell characters."""
    server = sshd({})
    device = server.devices[0]
    run = Path(shutil.copytree(pipeline_run, tmp_path / "run"))
    bundle = tmp_path / "bundle"
    assert main(["bundle", str(run), "--out", str(bundle), "--precision", "fp32", "--gate-data", "fmnist-mini",
                 "--warmup", "2", "--iterations",
                 "20", "--duration", "0.35", "--energy-duration", "0.35", "--warmup-time", "0", "--idle", "0.3"]) == 0
    capsys.readouterr()
    remote = device.home / "remote" / "x y;touch PWNED"
    code = main(["deploy", str(bundle), "--host", str(device.host), *ssh_args(server), "--backend", "ort",
                 "--power-mode", "15W", "--lock-clocks", "--nvpmodel-conf", str(device.fakes.nvpmodel_conf),
                 "--remote-dir", str(remote), "--report", str(run), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["failed"] == [] and summary["report"] == str(run / "report.json")
    # the quoted remote folder holds the bundle; nothing was injected
    assert (remote / "manifest.json").read_bytes() == (bundle / "manifest.json").read_bytes()
    assert not list(tmp_path.rglob("PWNED")) and not list(device.home.rglob("PWNED"))
    # results and logs fetched into RUN_DIR/device/LABEL
    results = run / "device" / device.host.label / "results"
    assert statuses(results) == {"original.fp32": "done", "lin.fp32": "done"}
    assert "original.fp32: median" in (results / "logs" / "run.log").read_text()
    # the accuracy gate ran each engine on the bundle's images: ONNX Runtime's own fp32 passes it
    gates = [json.loads((results / f"{i}.json").read_text())["accuracy"] for i in ("original.fp32", "lin.fp32")]
    assert [(g["status"], g["data"], g["images"]) for g in gates] == [("pass", "fmnist-mini:test", 32)] * 2
    # the report's device section
    report = json.loads((run / "report.json").read_text())
    assert [v["name"] for v in report["variants"]] == ["original", "lin"]  # the pipeline's own section kept
    section = report["device"]
    assert section["failed"] == [] and len(section["devices"]) == 1
    entry = section["devices"][0]
    assert entry["status"] == "ok" and entry["backend"] == "ort" and entry["folder"] == f"device/{device.host.label}"
    assert entry["device"]["power_mode"] == {"name": "25W", "id": 1}  # the fake's mode before the run
    assert entry["settings"]["power_mode"] == {"id": 0, "name": "15W"} and entry["settings"]["clocks_locked"]
    rows = {v["id"]: v for v in entry["variants"]}
    assert set(rows) == {"original.fp32", "lin.fp32"}
    for variant_id, row in rows.items():
        result = json.loads((results / f"{variant_id}.json").read_text())
        assert row["latency"]["median_ms"] == result["latency"]["median_ms"] > 0
        assert row["latency"]["p99_ms"] == result["latency"]["p99_ms"]
        assert row["memory"]["peak_ram_used_mb"] == result["power"]["peak_ram_used_mb"] > 0
        # energy per image and per call: the trapezoidal integral of the replayed trace over the timed window
        power = result["power"]
        samples = read_sampler_log(results / power["tegrastats_log"])
        again = rail_energy(samples, "VDD_IN", Window(*power["timed_window_s"]), power["calls"],
                            Window(*power["idle_window_s"]), batch=power["batch"])
        assert row["energy"]["per_image_mj"] == pytest.approx(again.energy_per_image_mj, rel=1e-12)
        assert row["energy"]["above_idle_per_image_mj"] == pytest.approx(
            again.energy_above_idle_per_image_mj, rel=1e-12)
        assert row["energy"]["per_call_mj"] == pytest.approx(again.energy_per_call_mj, rel=1e-12)
        assert row["energy"]["reliable"] is False  # 0.35 s: a few samples, marked in the report with a *
        assert 4800 < row["energy"]["mean_power_mw"] < 6200  # the trace's VDD_IN lies between 4.8 and 6.2 W
    markdown = (run / "report.md").read_text()
    assert "## On the devices" in markdown and "| original | fp32 | onnxruntime | done |" in markdown.replace(
        f"| {device.host.label} ", "| ")
    assert "power mode 25W (set to 15W for the run), clocks locked" in markdown
    assert "On the devices" in (run / "report.html").read_text()
    calls = device.fakes.calls()
    assert ["nvpmodel", "-m", "0"] in calls and calls[-2:] == [["nvpmodel", "-m", "1"], ["nvpmodel", "-q"]]
    assert calls[-4][:2] == ["jetson_clocks", "--restore"]  # clocks restored first, then the mode (reverse order)
    assert calls[-3] == ["jetson_clocks", "--show"]  # and read back (jetson_clocks exits 0 whatever failed)
    # the login user is not root: the two tools ran as root through `sudo -n`, everything else as the user
    changes = [c for c in device.fakes.call_entries() if c["argv"][:2] == ["nvpmodel", "-m"]
               or c["argv"][0] == "jetson_clocks"]
    # store, -m 0, lock, show, restore, show, -m 1
    assert len(changes) == 7 and all(c["euid"] == 0 for c in changes)
    assert {c["euid"] for c in device.fakes.call_entries() if c not in changes} == {device.uid}
    # results/ on the device and every file in it stay the login user's
    assert {p.stat().st_uid for p in [remote / "results", *(remote / "results").rglob("*")]} == {device.uid}


def test_a_tar_gz_bundle_is_copied_whole_unpacked_on_the_device_and_checked(sshd, tmp_path):
    """``edge deploy BUNDLE.tar.gz``: nothing unpacked on the host; the device unpacks it into the remote
    folder (jetson/archive.py) and the files are checked against the manifest as for a folder."""
    server = sshd({})
    device = server.devices[0]
    make_bundle([tiny_onnx(tmp_path / "a.onnx")], tmp_path / "made" / "bundle",
                BundleConfig(check_data="fmnist-mini", precisions=("fp32",), protocol=PROTOCOL), tar=True)
    archive = tmp_path / "bundle.tar.gz"
    (tmp_path / "made" / "bundle.tar.gz").rename(archive)  # only the archive is left on the host
    shutil.rmtree(tmp_path / "made")
    remote = device.home / "remote" / "it's here"
    first = only(deploy(archive, [device.host], config(server, remote_dir=str(remote)), out=tmp_path / "out"))
    assert first["status"] == "ok", first["error"]
    assert first["copy"]["archive"] == str(archive) and first["copy"]["bytes_sent"] == archive.stat().st_size
    assert not (tmp_path / "bundle").exists()  # never unpacked here
    hidden = {p.name for p in remote.iterdir() if p.name.startswith(".")}
    assert hidden == {RUNNER_LOCK, DEPLOY_LOCK}  # the uploaded archive, the runner's output and the results' tar
    # removed; the two lock files stay (empty)
    assert statuses(tmp_path / "out" / device.host.label / "results") == {"a.fp32": "done"}
    # a file damaged on the device: the archive is sent and unpacked again, and checked; then nothing is sent
    (remote / "jetson" / "runner.py").write_text("damaged")
    bundle, _ = checked_source(archive)
    copy = DeviceDeploy(bundle, device.host, server.options(), RunnerOptions(backend="ort"), str(remote),
                        str(server.python), tmp_path / "again", lambda message: None, archive=archive)
    copy.upload()
    assert copy.copy["bytes_sent"] == archive.stat().st_size and copy.copy["removed"] == []
    assert read_bundle(remote).files == bundle.files and (remote / "manifest.json").is_file()
    copy.upload()
    assert copy.copy["sent"] == [] and copy.copy["bytes_sent"] == 0


# faults, each a test

@pytest.mark.parametrize("listening", [False, True], ids=["closed-port", "silent-host"])
def test_an_unreachable_host_fails_clearly_within_the_connect_timeout(sshd, bundle, tmp_path, listening):
    server = sshd({})
    with socket.socket() as silent:  # a host that takes the connection and never speaks
        silent.bind(("127.0.0.1", 0))
        if listening:
            silent.listen(1)
        host = parse_host(f"root@127.0.0.1:{silent.getsockname()[1]}")
        device = only(deploy(bundle, [host], config(server, ssh={"connect_timeout_s": 2}), out=tmp_path / "out"))
    assert device["status"] == "failed" and device["error_kind"] == "unreachable" and device["stage"] == "copy"
    assert f"{host} is unreachable" in device["error"] and "--connect-timeout" in device["error"]
    # the silent host: ssh's own ConnectTimeout fired ("timed out during banner exchange"), not TCP's
    # or the test's; no elapsed time is asserted (tests never assert timings)
    assert ("timed out" if listening else "Connection refused") in device["error"]
    assert json.loads((tmp_path / "out" / host.label / "deploy.json").read_text())["error_kind"] == "unreachable"


def test_a_key_the_device_does_not_accept_is_refused(sshd, bundle, tmp_path):
    server = sshd({})
    other = keygen(tmp_path / "not_authorized")
    device = only(deploy(bundle, [server.devices[0].host], config(server, ssh={"identity": other}),
                         out=tmp_path / "out"))
    assert device["error_kind"] == "key refused" and f"refused the SSH key {other}" in device["error"]
    assert "Permission denied (publickey)" in device["error"] and "ssh-copy-id" in device["error"]


def test_a_changed_host_key_is_refused_and_a_new_one_needs_accept_new(sshd, bundle, tmp_path):
    server = sshd({})
    target = server.devices[0]
    impostor = keygen(tmp_path / "impostor")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{target.port} {' '.join(Path(f'{impostor}.pub').read_text().split()[:2])}\n")
    device = only(deploy(bundle, [target.host], config(server, ssh={"known_hosts": known}), out=tmp_path / "a"))
    assert device["error_kind"] == "host key mismatch" and "refused" in device["error"]
    assert f"Host key for [127.0.0.1]:{target.port} has changed" in device["error"]
    assert "Offending ED25519 key" in device["error"]
    assert f"ssh-keygen -R '[127.0.0.1]:{target.port}'" in device["error"]
    assert not (target.home / "edge-bundles").exists()  # nothing ran on the device
    # a device never seen: refused without --accept-new-host-key, recorded with it
    known.write_text("")
    device = only(deploy(bundle, [target.host], config(server, ssh={"known_hosts": known}), out=tmp_path / "b"))
    assert device["error_kind"] == "unknown host key" and "--accept-new-host-key" in device["error"]
    device = only(deploy(bundle, [target.host], config(server, ssh={"known_hosts": known, "accept_new_host_key": True}),
                         out=tmp_path / "c"))
    assert device["status"] == "ok", device["error"]
    assert (Path(f"{server.root}/host_key.pub").read_text().split()[1]) in known.read_text()


def test_a_device_fault_in_mid_benchmark_keeps_partial_results_and_logs_and_puts_the_device_back(sshd, bundle,
                                                                                               tmp_path):
    server = sshd({"FAKE_DEVICE_FAIL_AFTER": "30"})  # a: 2 + 20 inferences; b fails after 2 + 6
    target = server.devices[0]
    runner = RunnerOptions(backend="ort", power_mode="15W", lock_clocks=True,
                           nvpmodel_conf=str(target.fakes.nvpmodel_conf))
    device = only(deploy(bundle, [target.host], config(server, runner=runner), out=tmp_path / "out"))
    assert device["status"] == "failed" and device["error_kind"] == "runner" and device["runner_exit_code"] == 1
    assert "some variants failed" in device["error"] and "results and logs fetched" in device["error"]
    results = tmp_path / "out" / target.host.label / "results"
    assert statuses(results) == {"a.fp32": "done", "b.fp32": "failed"}
    b = json.loads((results / "b.fp32.json").read_text())
    assert b["partial"] is True and b["error"] == "fake device fault at inference 31"
    assert b["latency"]["iterations"] == 6
    assert json.loads((results / "run.json").read_text())["partial"] is True
    assert "b.fp32: failed: fake device fault" in (results / "logs" / "run.log").read_text()
    assert (results / "logs" / "a.fp32.tegrastats.log").is_file()
    calls = target.fakes.calls()
    assert ["nvpmodel", "-m", "0"] in calls  # 15W for the run
    assert calls[-4][:2] == ["jetson_clocks", "--restore"]  # the clocks (then read back), then
    assert calls[-2:] == [["nvpmodel", "-m", "1"], ["nvpmodel", "-q"]]  # the original mode (25W) again


def test_an_interrupted_deploy_run_again_continues_without_redoing_what_is_done(sshd, bundle, tmp_path):
    """The same machine through two ports: the first stops (SIGTERM to the runner in variant b, as a
    dropped session does), the second continues in the same remote folder."""
    server = sshd({"FAKE_DEVICE_SIGTERM_AFTER": "30"}, {})
    stopping, healthy = server.devices
    remote = stopping.home / "remote"  # both ports log in as the same user
    first = only(deploy(bundle, [stopping.host], config(server, remote_dir=str(remote)), out=tmp_path / "out"))
    assert first["runner_exit_code"] == 143 and "interrupted by SIGTERM" in first["error"]
    fetched = tmp_path / "out" / stopping.host.label / "results"
    assert statuses(fetched) == {"a.fp32": "done", "b.fp32": "interrupted"}
    assert json.loads((fetched / "b.fp32.json").read_text())["partial"] is True
    done_a = (remote / "results" / "a.fp32.json").read_text()
    # the copy was cut short too: one file missing, one half written
    (remote / "graphs" / "b" / "fp32.onnx").unlink()
    half = remote / "jetson" / "runner.py"
    half.write_bytes(half.read_bytes()[:100])
    again = only(deploy(bundle, [healthy.host], config(server, remote_dir=str(remote)), out=tmp_path / "out"))
    assert again["status"] == "ok", again["error"]
    assert sorted(again["copy"]["sent"]) == ["graphs/b/fp32.onnx", "jetson/runner.py", "manifest.json"]
    assert again["copy"]["kept"] == len(json.loads((bundle / "manifest.json").read_text())["files"]) - 2
    results = tmp_path / "out" / healthy.host.label / "results"
    assert statuses(results) == {"a.fp32": "cached", "b.fp32": "done"}
    assert (remote / "results" / "a.fp32.json").read_text() == done_a  # not recomputed
    # a third run sends nothing and recomputes nothing
    third = only(deploy(bundle, [healthy.host], config(server, remote_dir=str(remote)), out=tmp_path / "out"))
    assert third["copy"]["sent"] == [] and statuses(results) == {"a.fp32": "cached", "b.fp32": "cached"}


def test_report_must_name_a_pipeline_run_and_is_checked_before_any_device(bundle, tmp_path, capsys):
    elsewhere = tmp_path / "not-a-run"
    elsewhere.mkdir()
    for out in ([], ["--out", str(tmp_path / "devices")]):
        code = main(["deploy", str(bundle), "--host", "user@127.0.0.1:1", "--connect-timeout", "1", "--report",
                     str(elsewhere), *out])
        assert code == 2 and "holds no report.json" in capsys.readouterr().err
    assert not (tmp_path / "devices").exists() and not (tmp_path / "bundle-devices").exists()


def test_each_deploy_into_a_run_adds_its_devices_to_the_reports_section(bundle, pipeline_run, tmp_path, capsys):
    """No device answers (port 1, then 2): each failure is recorded in RUN_DIR/device and the pipeline's
    report writer renders every device folder there, so the section builds up deploy after deploy."""
    run = Path(shutil.copytree(pipeline_run, tmp_path / "run"))
    for port in (1, 2):
        code = main(["deploy", str(bundle), "--host", f"user@127.0.0.1:{port}", "--connect-timeout", "1",
                     "--report", str(run), "--json"])
        assert code == 1
        assert json.loads(capsys.readouterr().out)["report"] == str(run / "report.json")
    section = json.loads((run / "report.json").read_text())["device"]
    assert section["failed"] == ["user@127.0.0.1_1", "user@127.0.0.1_2"]
    assert [d["folder"] for d in section["devices"]] == ["device/user@127.0.0.1_1", "device/user@127.0.0.1_2"]
    markdown = (run / "report.md").read_text()
    assert markdown.count("## On the devices") == 1 and "`user@127.0.0.1_2` (user@127.0.0.1:2): failed" in markdown


def test_a_tampered_bundle_is_refused_naming_the_file_before_any_device_sees_it(sshd, bundle, tmp_path, capsys):
    server = sshd({})
    graph = bundle / "graphs" / "a" / "fp32.onnx"
    graph.write_bytes(bytes(reversed(graph.read_bytes())))
    code = main(["deploy", str(bundle), "--host", str(server.devices[0].host), *ssh_args(server)])
    assert code == 2
    assert "the bundle was altered: graphs/a/fp32.onnx does not match its sha256" in capsys.readouterr().err
    assert not (server.devices[0].home / "edge-bundles").exists()
    with pytest.raises(EdgeError, match="bundle .* is neither a folder nor a .tar.gz"):
        deploy(tmp_path / "nope", [server.devices[0].host], config(server))


def test_an_unwritable_remote_folder_is_named(sshd, bundle, tmp_path):
    server = sshd({})
    (server.devices[0].home / "a-file").write_text("not a folder")
    remote = server.devices[0].home / "a-file" / "bundle"
    device = only(deploy(bundle, [server.devices[0].host], config(server, remote_dir=str(remote)),
                         out=tmp_path / "out"))
    assert device["error_kind"] == "remote dir" and f"cannot write the remote folder '{remote}'" in device["error"]
    assert "Not a directory" in device["error"] and "--remote-dir" in device["error"]


# fleets

def test_a_fleet_of_three_where_one_fails_reports_each_device(sshd, bundle, tmp_path, capsys):
    server = sshd({}, {}, {"FAKE_DEVICE_FAIL_AFTER": "5"})
    good, other, bad = server.devices
    hosts = tmp_path / "fleet.txt"
    hosts.write_text(f"# the lab\n{good.host}\n\n{other.host}   # bench 2\n{bad.host}\n")
    code = main(["deploy", str(bundle), "--hosts", str(hosts), *ssh_args(server), "--backend", "ort",
                 "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 1
    assert f"1 of 3 devices failed: {bad.host.label}" in out.out
    assert f"{bad.host}: failed ({bad.host}: some variants failed" in out.out
    for device in (good, other):
        assert (device.home / "edge-bundles" / "bundle" / "manifest.json").is_file()  # each device its own copy
        assert statuses(tmp_path / "out" / device.host.label / "results") == {"a.fp32": "done", "b.fp32": "done"}
    assert statuses(tmp_path / "out" / bad.host.label / "results") == {"a.fp32": "failed", "b.fp32": "failed"}


def test_an_engine_built_on_one_device_is_reused_on_devices_of_the_same_identity(sshd, bundle, tmp_path):
    """TensorRT against the named fakes on each device (two Orin Nanos, one AGX Orin)."""
    server = sshd({"FAKE_DEVICE_TENSORRT": "1"}, {"FAKE_DEVICE_TENSORRT": "1"},
                  {"FAKE_DEVICE_TENSORRT": "1", "FAKE_DEVICE_SM_COUNT": "16"})
    nano, twin, agx = server.devices
    result = deploy(bundle, [nano.host, twin.host, agx.host], config(server, runner=RunnerOptions()),
                    out=tmp_path / "out")
    assert result["failed"] == [], [d["error"] for d in result["devices"]]
    records = {d["label"]: d for d in result["devices"]}
    assert records[nano.host.label]["identity"] == records[twin.host.label]["identity"]
    assert records[agx.host.label]["identity"]["sm_count"] == 16

    def engines(device) -> dict:
        folder = tmp_path / "out" / device.host.label / "results"
        return {v: json.loads((folder / f"{v}.json").read_text())["engine"] for v in ("a.fp32", "b.fp32")}

    built, reused, own = engines(nano), engines(twin), engines(agx)
    assert not any(e["cached"] for e in built.values()) and all(e["cached"] for e in reused.values())
    assert {v: e["cache_key"] for v, e in reused.items()} == {v: e["cache_key"] for v, e in built.items()}
    assert sorted(records[twin.host.label]["engines_received"]) == sorted(
        Path(e["path"]).name for e in built.values())
    assert not any(e["cached"] for e in own.values()) and records[agx.host.label]["engines_received"] == []
    assert {e["cache_key"] for e in own.values()}.isdisjoint(e["cache_key"] for e in built.values())
    assert sorted(p.name for p in (twin.cache / "engines").iterdir()) == sorted(
        p.name for p in (nano.cache / "engines").iterdir())


def test_hosts_are_parsed_and_a_bad_line_is_named(tmp_path):
    assert str(parse_host("nvidia@192.168.1.20:2222")) == "nvidia@192.168.1.20:2222"
    assert parse_host("jetson", default_port=22).port == 22 and parse_host("u@[::1]:22").address == "::1"
    fleet = tmp_path / "fleet.txt"
    fleet.write_text("a@x\n# nothing\nb@-oProxyCommand=touch\n")
    with pytest.raises(EdgeError, match=r"fleet.txt, line 3: host 'b@-oProxyCommand=touch'"):
        read_hosts(fleet)
