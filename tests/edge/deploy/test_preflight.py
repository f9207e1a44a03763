"""``edge deploy --check`` on the loopback devices (issue 29, point 4): every field in --json, and a failing case
per check, each with its fix; nothing is copied to a device."""

import json
import socket
import tempfile
from pathlib import Path

import pytest

from edge.cli import main
from edge.deploy.preflight import device_answer
from jetson.check import jetpack_of, read_meminfo
from tests.edge.deploy.conftest import ssh_args
from tests.edge.deploy.sshd import DEVICE_USER, NO_SUDOERS_RULE, NO_TEGRASTATS

CHECKS = ["ssh", "python", "numpy", "l4t", "tensorrt", "cuda", "sudo", "tegrastats", "power_modes", "memory", "swap",
          "disk", "cma"]
# an Orin Nano 8GB after boot (JetPack 6.2): the figures of /proc/meminfo that the checks read, in kB
ORIN_NANO_MEMINFO = """MemTotal:        7802832 kB
MemFree:         5012344 kB
MemAvailable:    {available} kB
SwapTotal:       3901424 kB
SwapFree:        3901424 kB
CmaTotal:         262144 kB
CmaFree:          250112 kB
"""
NV_TEGRA_RELEASE = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8\n"


@pytest.fixture
def jetson_files():
    """The device's /etc/nv_tegra_release and /proc/meminfo (ample memory, and too little), readable by the
    device user (pytest's own folder is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="edge-jetson-files-"))
    folder.chmod(0o755)
    (folder / "nv_tegra_release").write_text(NV_TEGRA_RELEASE)
    (folder / "meminfo").write_text(ORIN_NANO_MEMINFO.format(available=6012344))
    (folder / "meminfo-low").write_text(ORIN_NANO_MEMINFO.format(available=921600))  # 900 MiB
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def test_check_on_the_loopback_devices_every_field_and_a_failing_case_per_check(sshd, jetson_files, tmp_path,
                                                                               capsys):
    files = {"FAKE_DEVICE_NV_TEGRA_RELEASE": str(jetson_files / "nv_tegra_release"),
             "FAKE_DEVICE_MEMINFO": str(jetson_files / "meminfo")}
    cases = {
        "ready": {"FAKE_DEVICE_TENSORRT": "1"},
        "no TensorRT": {},
        "cuda-python fails at its first call": {"FAKE_DEVICE_TENSORRT": "1", "FAKE_DEVICE_CUDA_PYTHON": "broken"},
        "no sudo rule": {"FAKE_DEVICE_TENSORRT": "1", NO_SUDOERS_RULE: "1"},
        "no tegrastats": {"FAKE_DEVICE_TENSORRT": "1", NO_TEGRASTATS: "1"},
        "too little memory": {"FAKE_DEVICE_TENSORRT": "1", "FAKE_DEVICE_MEMINFO": str(jetson_files / "meminfo-low")},
    }
    server = sshd(*({**files, **extra} for extra in cases.values()))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        unreachable = f"{DEVICE_USER}@127.0.0.1:{closed.getsockname()[1]}"
    hosts = [arg for device in server.devices for arg in ("--host", str(device.host))] + ["--host", unreachable]
    conf = str(server.devices[0].fakes.nvpmodel_conf)
    code = main(["deploy", "--check", *hosts, *ssh_args(server), "--power-mode", "15W", "--lock-clocks",
                 "--nvpmodel-conf", conf, "--json", "--connect-timeout", "60"])  # seven at once on two busy cores
    assert code == 1
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is False
    by_case = dict(zip([*cases, "unreachable"], result["hosts"]))

    ready = by_case["ready"]
    assert ready["ok"] is True and [c["name"] for c in ready["checks"]] == CHECKS
    checks = {c["name"]: c for c in ready["checks"]}
    for check in checks.values():
        assert set(check) == {"name", "status", "value", "fix", "detail"}
    assert {name: c["status"] for name, c in checks.items()} == {
        "ssh": "ok", "python": "ok", "numpy": "ok", "l4t": "ok", "tensorrt": "ok", "cuda": "ok", "sudo": "ok",
        "tegrastats": "ok", "power_modes": "ok", "memory": "ok", "swap": "ok", "disk": "ok", "cma": "warn"}
    assert checks["l4t"]["detail"]["l4t"] == "36.4.3" and checks["l4t"]["detail"]["jetpack"] == "6.1-6.2"
    assert checks["tensorrt"]["detail"] == {"version": "10.3.0.30", "supported": True}
    assert checks["cuda"]["detail"]["used"] == "cuda-python"
    assert checks["sudo"]["detail"]["missing"] == [] and checks["sudo"]["detail"]["tools"] == ["nvpmodel",
                                                                                               "jetson_clocks"]
    assert checks["power_modes"]["detail"]["modes"] == {"15W": 0, "25W": 1, "MAXN_SUPER": 2}
    assert checks["memory"]["detail"]["available_mib"] == 6012344 // 1024
    assert checks["swap"]["detail"] == {"total_mib": 3901424 // 1024, "free_mib": 3901424 // 1024}
    assert checks["cma"]["detail"] == {"total_mib": 256, "free_mib": 244} and "256 MB pool" in checks["cma"]["fix"]
    assert checks["disk"]["detail"]["free_mib"] > 0

    def failing(case: str) -> dict:
        host = by_case[case]
        assert host["ok"] is False, case
        failed = [c for c in host["checks"] if c["status"] == "fail"]
        assert all(c["fix"] for c in failed), case  # every failing check says what to do
        return {c["name"]: c for c in failed}

    assert set(failing("no TensorRT")) == {"tensorrt", "cuda"}  # no TensorRT: no FakeCudaRuntime either here
    assert "TensorRT was not found" in failing("no TensorRT")["tensorrt"]["value"]
    assert "sudo apt install" in failing("no TensorRT")["tensorrt"]["fix"]
    cuda = failing("cuda-python fails at its first call")
    assert set(cuda) == {"cuda"}
    assert cuda["cuda"]["detail"]["bindings"]["cuda-python"] == {
        "answers": False, "said": "CUDA call cudaGetDeviceCount failed (cudaErrorInsufficientDriver (35))"}
    assert "pip install 'cuda-python>=12.6,<13'" in cuda["cuda"]["fix"]
    sudo = failing("no sudo rule")
    assert set(sudo) == {"sudo"}
    bin_dir = server.devices[3].fakes.bin_dir
    line = f"{DEVICE_USER} ALL=(root) NOPASSWD: {bin_dir / 'nvpmodel'}, {bin_dir / 'jetson_clocks'}"
    assert sudo["sudo"]["fix"].endswith(line) and "sudo visudo -f /etc/sudoers.d/edge-jetson" in sudo["sudo"]["fix"]
    tegrastats = failing("no tegrastats")
    assert set(tegrastats) == {"tegrastats"} and "--energy off" in tegrastats["tegrastats"]["fix"]
    memory = failing("too little memory")
    assert set(memory) == {"memory"} and memory["memory"]["detail"]["available_mib"] == 900
    assert "add swap" in memory["memory"]["fix"] and "--workspace" in memory["memory"]["fix"]
    gone = failing("unreachable")
    assert list(gone) == ["ssh"] and gone["ssh"]["value"].startswith("unreachable:")
    assert "check the address and port" in gone["ssh"]["fix"]
    # nothing was copied to any device: the check runs from a temporary zip, removed after
    for device in server.devices:
        assert not list(device.home.rglob("manifest.json")) and not list(device.home.rglob("*.py"))
    assert not [p for p in Path("/tmp").glob("edge-check.*") if p.owner() == DEVICE_USER]


def test_the_table_names_each_failing_check_with_its_fix(sshd, jetson_files, capsys):
    server = sshd({"FAKE_DEVICE_TENSORRT": "1", NO_TEGRASTATS: "1",
                   "FAKE_DEVICE_NV_TEGRA_RELEASE": str(jetson_files / "nv_tegra_release"),
                   "FAKE_DEVICE_MEMINFO": str(jetson_files / "meminfo")})
    code = main(["deploy", "--check", "--host", str(server.devices[0].host), *ssh_args(server)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"{server.devices[0].host}: NOT READY" in out
    assert "tegrastats   fail  tegrastats is not on PATH" in out
    assert "fix: install it with JetPack (nvidia-l4t-tools), or measure without energy: --energy off" in out
    assert "sudo         skip  no power setting asked" in out


def test_a_malformed_device_answer_is_refused_naming_what_came():
    with pytest.raises(ValueError, match="not JSON"):
        device_answer(b"Traceback (most recent call last):\n")
    with pytest.raises(ValueError, match="not a edge-jetson-check report"):
        device_answer(b'{"format": "other", "checks": []}')
    with pytest.raises(ValueError, match="a check is malformed"):
        device_answer(b'{"format": "edge-jetson-check", "checks": [{"name": "x", "status": "great"}]}')


def test_l4t_releases_map_to_jetpack_and_meminfo_is_read_in_kib(tmp_path):
    assert jetpack_of("36.4.3") == "6.1-6.2" and jetpack_of("39.2") == "7.2"
    assert "not supported" in jetpack_of("35.4.1") and jetpack_of("12") is None
    (tmp_path / "meminfo").write_text(ORIN_NANO_MEMINFO.format(available=100))
    assert read_meminfo(str(tmp_path / "meminfo"))["CmaTotal"] == 262144
    assert read_meminfo(str(tmp_path / "absent")) == {}
