"""tests/launch.py: a command forked from the zygote is the process a fresh ``python -m`` would be."""

import json
import os
import subprocess
import sys

import pytest

from tests.launch import REPO, run_edge


@pytest.mark.parametrize("fresh", [False, True])
def test_the_launched_process_has_its_folder_environment_path_and_no_stdin_and_exits_after_atexit(tmp_path, fresh):
    env = {**os.environ, "EDGE_PROBE": "here", "PYTHONPATH": str(REPO)}
    done = run_edge(["a b"], module="tests.launch_probe", cwd=tmp_path, env=env, fresh=fresh)
    assert done.returncode == 7, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"cwd": str(tmp_path.resolve()), "probe": "here", "path0": str(tmp_path.resolve()), "stdin": "",
                    "leader": not fresh, "argv": ["a b"]}   # forked: a process group of its own, for timeouts
    assert done.stderr == "atexit ran\n"
    assert done.args == [sys.executable, "-m", "tests.launch_probe", "a b"]


def test_an_environment_variable_the_request_drops_is_gone(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EDGE_PROBE"}
    os.environ["EDGE_PROBE"] = "the worker's"
    try:
        done = run_edge([], module="tests.launch_probe", cwd=tmp_path, env=env)
    finally:
        del os.environ["EDGE_PROBE"]
    assert json.loads(done.stdout)["probe"] is None


def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_edge([], module="tests.launch_probe", cwd=tmp_path, env={**os.environ, "EDGE_PROBE_SLEEP": "60"},
                 timeout=2)
    assert run_edge([], module="tests.launch_probe", cwd=tmp_path).returncode == 7


@pytest.mark.parametrize("argv", [["models", "--json"], ["compress", "no-such-model", "--plan", "linear:1-2",
                                                          "--out", "out"]])
def test_edge_forked_prints_and_exits_as_edge_in_a_fresh_interpreter(tmp_path, argv):
    env = {**os.environ, "EDGE_NO_PROGRESS": "1"}
    forked, fresh = (run_edge(argv, cwd=tmp_path, env=env, fresh=f) for f in (False, True))
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert not (tmp_path / "out").exists()


def test_a_request_that_changes_what_python_reads_at_start_up_gets_a_fresh_interpreter(tmp_path):
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO)}
    done = run_edge([], module="tests.launch_probe", cwd=tmp_path, env=env)
    assert done.returncode == 7 and json.loads(done.stdout)["leader"] is False
