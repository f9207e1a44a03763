"""``edge deploy --check``: is each device ready, before anything is copied or built?

Per host: SSH reachable (the client's failure told apart as for a deploy), then the device's own checks
(jetson.check: Python, L4T/JetPack, TensorRT, the CUDA bindings, ``sudo -n`` rights when power
settings are asked, tegrastats, power modes, memory, swap, disk, CMA), run by the device's Python from
a zip of this host's ``jetson`` package sent on stdin to a temporary file there (removed after; the
bundle is not copied). The device's answer is checked before it is believed (a malformed one is a
failed check naming what came). Hosts are checked in parallel.
"""

from __future__ import annotations

import io
import json
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jetson
from edge.deploy.device_deploy import RunnerOptions
from edge.deploy.ssh import Connection, DeployError, Host, SshOptions, remote_words
from jetson.check import FORMAT, STATUSES

ZIP_MAIN = "import sys\nfrom jetson.__main__ import main\nsys.exit(main())\n"
MAX_PARALLEL = 16


def checker_zip() -> bytes:
    """This host's ``jetson`` package as a runnable zip (``python3 FILE check ...``)."""
    package = Path(jetson.__file__).parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("__main__.py", ZIP_MAIN)
        for path in sorted(package.glob("*.py")):
            archive.write(path, f"jetson/{path.name}")
    return buffer.getvalue()


def device_check_args(runner: RunnerOptions, energy: str = "auto") -> list[str]:
    """``jetson check``'s arguments for what the run will ask."""
    args = ["check", "--json", "--backend", runner.backend, "--energy", energy]
    if runner.power_mode:
        args += ["--power-mode", runner.power_mode]
    if runner.lock_clocks:
        args.append("--lock-clocks")
    if runner.nvpmodel_conf:
        args += ["--nvpmodel-conf", runner.nvpmodel_conf]
    return args


def check_command(remote_python: str, args: list[str]) -> str:
    """The remote shell command: the zip from stdin to a temporary file, run, removed; 127 without Python."""
    python = remote_words(remote_python)
    return (f"command -v {python} >/dev/null || exit 127; "
            f"f=$(mktemp \"${{TMPDIR:-/tmp}}/edge-check.XXXXXX\") || exit 1; "
            f"cat > \"$f\" && {python} \"$f\" {remote_words(*args)}; status=$?; rm -f -- \"$f\"; exit $status")


def _row(name: str, status: str, value: str, fix: str | None = None, **detail: object) -> dict:
    return {"name": name, "status": status, "value": value, "fix": fix, "detail": detail}


def reachable(connection: Connection) -> dict:
    """The ``ssh`` check: a trivial command answers."""
    try:
        connection.run("true")
    except DeployError as e:
        return _row("ssh", "fail", f"{e.kind}: {e.what}", e.fix, kind=e.kind, found=e.found)
    return _row("ssh", "ok", f"{connection.host} answers")


def device_answer(stdout: bytes) -> list[dict]:
    """The device's checks from its JSON answer, each checked for shape; a ValueError saying what is wrong."""
    try:
        answer = json.loads(stdout.decode(errors="replace"))
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from e
    if not isinstance(answer, dict) or answer.get("format") != FORMAT or not isinstance(answer.get("checks"), list):
        raise ValueError(f"not a {FORMAT} report")
    for check in answer["checks"]:
        if not (isinstance(check, dict) and isinstance(check.get("name"), str) and check.get("status") in STATUSES
                and isinstance(check.get("value"), str) and isinstance(check.get("fix"), (str, type(None)))
                and isinstance(check.get("detail"), dict)):
            raise ValueError(f"a check is malformed: {str(check)[:200]}")
    return answer["checks"]


def check_host(host: Host, ssh: SshOptions, remote_python: str, runner: RunnerOptions, energy: str) -> dict:
    """One host's checks: ``ssh`` first, then the device's own (none when SSH fails)."""
    connection = Connection(host, ssh)
    rows = [reachable(connection)]
    if rows[0]["status"] == "ok":
        rows += device_checks(connection, remote_python, runner, energy)
    return {"host": str(host), "label": host.label, "ok": not any(r["status"] == "fail" for r in rows),
            "checks": rows}


def device_checks(connection: Connection, remote_python: str, runner: RunnerOptions, energy: str) -> list[dict]:
    command = check_command(remote_python, device_check_args(runner, energy))
    try:
        done = connection.run(command, stdin=checker_zip(), check=False)
    except DeployError as e:
        return [_row("python", "fail", f"{e.kind}: {e.what}", e.fix)]
    if done.returncode == 127:
        return [_row("python", "fail", f"{remote_python} was not found on {connection.host}",
                     "pass --remote-python with the device's Python 3.10+ (JetPack: python3)")]
    try:
        return device_answer(done.stdout)
    except ValueError as e:
        said = done.stderr.decode(errors="replace").strip()[-500:]
        return [_row("device", "fail", f"the device's check answered no report: {e}",
                     f"run `{remote_python} -m jetson check` on the device to see why", stderr=said,
                     exit_code=done.returncode)]


def preflight(hosts: list[Host], ssh: SshOptions, remote_python: str, runner: RunnerOptions, *,
              energy: str = "auto") -> dict:
    """Every host's checks (in parallel); ``ok`` when no check failed anywhere."""
    def one(host: Host) -> dict:
        return check_host(host, ssh, remote_python, runner, energy)

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(hosts)))) as pool:
        results = list(pool.map(one, hosts))
    return {"format": "edge-deploy-check", "ok": all(r["ok"] for r in results), "hosts": results}
