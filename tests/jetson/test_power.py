"""Power mode by name and locked clocks, always put back; run against the named fakes of nvpmodel
and jetson_clocks (tests/jetson/bin), whose call log shows what was done."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jetson.errors import JetsonError
from jetson.power import (
    DeviceSettings,
    PowerMode,
    SettingsRecord,
    parse_nvpmodel_conf,
    parse_nvpmodel_query,
    query_power_mode,
    read_power_modes,
    resolve_power_mode,
)
from tests.jetson.fakes import DATA

REPO = Path(__file__).resolve().parents[2]
SUPER = DATA / "nvpmodel_p3767_0003_super.conf"


def test_nvpmodel_query_plain_and_verbose():
    assert parse_nvpmodel_query((DATA / "nvpmodel_q.txt").read_text()) == PowerMode(2, "MAXN_SUPER")
    assert parse_nvpmodel_query((DATA / "nvpmodel_q_verbose.txt").read_text()) == PowerMode(1, "25W")


def test_nvpmodel_query_without_a_mode_is_refused():
    with pytest.raises(JetsonError, match="`nvpmodel -q` does not say the current power mode") as e:
        parse_nvpmodel_query("NVPM ERROR: failed to read PARAM\n")
    assert "found: NVPM ERROR: failed to read PARAM" in str(e.value)


def test_each_module_maps_names_to_its_own_ids():
    assert read_power_modes(SUPER) == {"15W": 0, "25W": 1, "MAXN_SUPER": 2}
    assert read_power_modes(DATA / "nvpmodel_p3767_0003.conf") == {"15W": 0, "7W": 1}
    assert read_power_modes(DATA / "nvpmodel_p3767_0004_super.conf") == {"10W": 0, "25W": 1, "MAXN_SUPER": 2}
    assert resolve_power_mode("7W", read_power_modes(DATA / "nvpmodel_p3767_0003.conf")) == PowerMode(1, "7W")
    assert resolve_power_mode("25W", read_power_modes(SUPER)) == PowerMode(1, "25W")
    assert resolve_power_mode("maxn_super", read_power_modes(SUPER)) == PowerMode(2, "MAXN_SUPER")


def test_an_unknown_mode_name_lists_the_modes_of_this_module():
    with pytest.raises(JetsonError) as e:
        resolve_power_mode("7W", read_power_modes(SUPER), where="nvpmodel_p3767_0003_super.conf")
    assert str(e.value) == ("power mode '7W' is not defined on this module (nvpmodel_p3767_0003_super.conf)\n"
                            "  expected: one of 15W, 25W, MAXN_SUPER\n  found: 7W\n"
                            "  fix: pass --power-mode with one of those names")


def test_a_configuration_without_modes_or_with_a_name_twice_is_refused(tmp_path):
    with pytest.raises(JetsonError, match="x.conf defines no power mode"):
        parse_nvpmodel_conf("< PM_CONFIG DEFAULT=0 >\n", where="x.conf")
    with pytest.raises(JetsonError, match="defines power mode 15W twice \\(ids 0 and 3\\)"):
        parse_nvpmodel_conf("< POWER_MODEL ID=0 NAME=15W >\n< POWER_MODEL ID=3 NAME=15W >\n")
    with pytest.raises(JetsonError, match="cannot read the nvpmodel configuration"):
        read_power_modes(tmp_path / "absent.conf")


def test_power_mode_is_set_by_name_and_put_back(fake_jetson):
    assert query_power_mode() == PowerMode(1, "25W")  # the configuration's default
    with DeviceSettings(power_mode="MAXN_SUPER", conf=SUPER) as record:
        assert query_power_mode() == PowerMode(2, "MAXN_SUPER")
    assert record == SettingsRecord(PowerMode(1, "25W"), PowerMode(2, "MAXN_SUPER"), clocks_locked=False)
    assert query_power_mode() == PowerMode(1, "25W")
    assert fake_jetson.calls() == [
        ["nvpmodel", "-q"],
        ["nvpmodel", "-q"], ["nvpmodel", "-m", "2"], ["nvpmodel", "-q"],
        ["nvpmodel", "-q"],
        ["nvpmodel", "-m", "1"], ["nvpmodel", "-q"],
        ["nvpmodel", "-q"],
    ]


def test_the_mode_in_effect_already_is_not_switched(fake_jetson):
    with DeviceSettings(power_mode="25W", conf=SUPER):
        pass
    assert fake_jetson.calls() == [["nvpmodel", "-q"]]


SHOW = ["jetson_clocks", "--show"]


def clock_calls(calls):
    return [c for c in calls if c[0] == "jetson_clocks"]


def test_clocks_are_stored_locked_and_restored(fake_jetson):
    with DeviceSettings(lock_clocks=True):
        stored = Path(clock_calls(fake_jetson.calls())[0][2])
        assert stored.exists()
    assert clock_calls(fake_jetson.calls()) == [["jetson_clocks", "--store", str(stored)], ["jetson_clocks"],
                                                SHOW, ["jetson_clocks", "--restore", str(stored)], SHOW]
    assert not stored.parent.exists()


def test_an_exception_mid_benchmark_puts_mode_and_clocks_back(fake_jetson):
    with pytest.raises(RuntimeError, match="engine failed"):
        with DeviceSettings(power_mode="15W", lock_clocks=True, conf=SUPER):
            raise RuntimeError("engine failed")
    calls = fake_jetson.calls()
    stored = calls[1][2]
    assert calls == [
        ["nvpmodel", "-q"],
        ["jetson_clocks", "--store", stored],
        ["nvpmodel", "-m", "0"], ["nvpmodel", "-q"],
        ["jetson_clocks"], SHOW,  # locked, and read back (it exits 0 whatever failed)
        ["jetson_clocks", "--restore", stored], SHOW,   # undone in reverse: the clocks first (issue 29),
        ["nvpmodel", "-m", "1"], ["nvpmodel", "-q"],   # then the original mode
    ]
    assert query_power_mode() == PowerMode(1, "25W")


def test_a_failure_while_setting_up_undoes_what_was_done(fake_jetson, tmp_path):
    conf = tmp_path / "nvpmodel.conf"
    conf.write_text("< POWER_MODEL ID=9 NAME=BROKEN >\n")
    with pytest.raises(JetsonError, match="nvpmodel -m 9` failed with exit code 1") as e:
        with DeviceSettings(power_mode="BROKEN", lock_clocks=True, conf=conf):
            pytest.fail("the block must not run")
    assert "NVPM ERROR: Invalid mode id 9" in str(e.value)
    calls = fake_jetson.calls()
    assert calls[-4:] == [["jetson_clocks", "--restore", calls[1][2]], SHOW, ["nvpmodel", "-m", "1"],
                          ["nvpmodel", "-q"]]
    assert ["jetson_clocks"] not in calls


def test_signal_handlers_are_put_back(fake_jetson):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    with DeviceSettings(lock_clocks=True):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before


# The child sets SIGINT's disposition itself, as a Python started at a terminal has it: a test command started in
# the background by a shell without job control runs with SIGINT ignored (POSIX), its children inherit that, and
# a Python that starts with SIGINT ignored leaves it ignored (no KeyboardInterrupt)
BENCHMARK = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from jetson.power import DeviceSettings, Interrupted
try:
    with DeviceSettings(power_mode="15W", lock_clocks=True, conf=Path(sys.argv[1])):
        print("benchmarking", flush=True)
        time.sleep(60)
except Interrupted as e:
    print(e, flush=True)
    sys.exit(128 + e.signum)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_mid_benchmark_puts_mode_and_clocks_back(fake_jetson, signum, code):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", BENCHMARK, str(SUPER)], env=env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "benchmarking\n"
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == code, err
    calls = fake_jetson.calls()
    stored = calls[1][2]
    assert calls[-4:] == [["jetson_clocks", "--restore", stored], SHOW, ["nvpmodel", "-m", "1"], ["nvpmodel", "-q"]]
    assert query_power_mode() == PowerMode(1, "25W")


def test_a_runner_started_under_sudo_is_refused_naming_the_sudoers_line(bundle, monkeypatch, capsys):
    """Under sudo HOME moves (the engine cache, a `pip install --user` binding) and results/ would be root's:
    refused before anything runs, with the line that makes sudo unnecessary for the two tools."""
    from jetson.runner import RunOptions, run

    if os.geteuid() != 0:
        pytest.skip("needs root: a runner under sudo runs as root")
    monkeypatch.setenv("SUDO_USER", "nvidia")
    assert run(RunOptions(bundle=bundle, backend="ort", energy="off")) == 2
    summary = (bundle / "results" / "run.json").read_text()
    assert "the runner was started with sudo (by nvidia)" in summary
    assert "nvidia ALL=(root) NOPASSWD: " in summary and "/jetson_clocks" in summary
    assert not (bundle / "results" / "a.fp32.json").exists()


# jetson_clocks prints its failures and exits 0 (NVIDIA's script for L4T r36: `main $@; exit 0`; do_igpu prints
# "Error: Failed to max GPU frequency!", restore "Error: Failed to restore PATH"): the clocks are read back

def test_locked_and_restored_clocks_are_read_back_and_recorded(fake_jetson):
    with DeviceSettings(lock_clocks=True) as record:
        assert fake_jetson.gpu_clocks()["min"] == fake_jetson.gpu_clocks()["max"] == 1020000000
    assert record.clocks["locked"] == {"gpu": {"min_hz": 1020000000, "max_hz": 1020000000,
                                               "current_hz": 1020000000}, "errors": []}
    assert record.clocks["restored"]["gpu"]["min_hz"] == record.clocks["restored"]["stored_gpu_min_hz"] == 306000000
    assert fake_jetson.gpu_clocks()["min"] == 306000000


def test_clocks_that_did_not_lock_fail_the_settings_and_are_put_back(fake_jetson):
    fake_jetson.fail_clocks("lock")
    with pytest.raises(JetsonError, match="jetson_clocks exited 0 but did not lock the clocks") as e:
        with DeviceSettings(lock_clocks=True):
            pytest.fail("the benchmark must not run on unlocked clocks")
    assert "Error: Failed to max GPU frequency!" in str(e.value)
    assert "GPU MinFreq=306000000 MaxFreq=1020000000" in str(e.value)
    assert clock_calls(fake_jetson.calls())[-2:] == [["jetson_clocks", "--restore", fake_jetson.calls()[0][2]], SHOW]


def test_clocks_that_were_not_restored_are_said(fake_jetson, capsys):
    with pytest.raises(JetsonError, match="jetson_clocks --restore exited 0 but did not put the clocks back") as e:
        with DeviceSettings(lock_clocks=True) as record:
            fake_jetson.fail_clocks("restore")
    assert "Error: Failed to restore /sys/class/devfreq/17000000.gpu/min_freq" in str(e.value)
    assert record.clocks["restored"]["gpu"]["min_hz"] == 1020000000  # still locked, and recorded so
    assert "could not put the device back" in capsys.readouterr().err
