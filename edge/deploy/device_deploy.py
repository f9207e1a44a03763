"""One device: copy the bundle (files already there with the same sha256 are kept), run the device
runner, fetch its results and logs back (also when it failed), and record what happened.

On the device the bundle lives in ``--remote-dir`` (relative paths are under the login user's
home), the runner writes ``REMOTE_DIR/results`` there, so a deploy run again continues where the
last one stopped: the copy sends only what is missing or different, the runner skips the variants
already done with this bundle and config. Locally a device's folder holds ``deploy.json`` (this
module's record), ``deploy.log`` (what the runner printed) and ``results/`` (jetson.runner's layout).
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import shutil
import signal
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from edge.deploy.ssh import (
    SHORT_COMMAND_S,
    SSH_FAILED,
    Connection,
    DeployError,
    Host,
    SshOptions,
    remote_words,
    ssh_failure,
)
from edge.deploy.untrusted import REFUSED, check_results, checked_members, plain_result_file
from edge.fileio import write_json_atomic
from jetson import archive as archive_module
from jetson.bundle import MANIFEST, OWNED, Bundle

RECORD, LOG, RESULTS = "deploy.json", "deploy.log", "results"
# in the remote folder: the runner writes its output to a file there (one per deploy), never into the SSH
# channel, so a client that goes away (a laptop closed, ssh killed) leaves it running to the end; it holds a
# lock there, so a second deploy waits for a runner still running instead of benchmarking beside it; and
# before it lets go of the lock its results are packed (one tar per deploy), so each deploy fetches its own
# run's results even when another deploy's runner starts the moment the lock is free
RUNNER_LOCK = ".edge-runner.lock"
WAITING = "edge deploy: waiting for the runner an earlier deploy started in this folder to finish"
# and a deploy holds DEPLOY_LOCK in the remote folder from its copy to its fetch (flock, through an SSH session of
# its own that ends when the deploy ends or its client goes away): a second deploy of the same folder waits for
# it, instead of copying over files the first one's runner is checking (both were refused)
DEPLOY_LOCK = ".edge-deploy.lock"
WAITING_DEPLOY = "waiting: another edge deploy is copying, running or fetching in {folder} on this device"
NO_REMOTE_DIR = 90  # the exit status of the listing command when the remote folder cannot be written
RUNNER_EXIT = {1: "some variants failed (the others ran)", 2: "the runner refused the bundle or an option",
               3: "the runner hit a bug"}


@dataclass(frozen=True)
class RunnerOptions:
    """What the device runner is asked (``python3 -m jetson run``'s options)."""

    backend: str = "tensorrt"
    builder: str = "python"       # TensorRT: python (TensorRT's Python API) or trtexec
    power_mode: str | None = None
    lock_clocks: bool = False
    nvpmodel_conf: str | None = None
    extra: tuple[str, ...] = ()   # more runner options, passed as they are (each quoted)

    def argv(self) -> list[str]:
        argv = ["run", "--backend", self.backend, "--out", RESULTS]
        if self.builder != "python":
            argv += ["--builder", self.builder]
        if self.power_mode:
            argv += ["--power-mode", self.power_mode]
        if self.lock_clocks:
            argv.append("--lock-clocks")
        if self.nvpmodel_conf:
            argv += ["--nvpmodel-conf", self.nvpmodel_conf]
        return [*argv, *self.extra]


@dataclass
class DeviceDeploy:
    """The deploy of one bundle to one device; :meth:`record` is what it did."""

    bundle: Bundle
    host: Host
    ssh: SshOptions
    runner: RunnerOptions
    remote_dir: str
    remote_python: str
    out: Path                                   # this device's local folder
    progress: Callable[[str], None] = print
    archive: Path | None = None                 # the bundle's .tar.gz: copied whole and unpacked on the device
    status: str = "pending"
    stage: str = "connect"
    error: str | None = None
    error_kind: str | None = None
    exit_code: int | None = None
    copy: dict = field(default_factory=dict)
    identity: dict | None = None                # TensorRT fleets: probed before the run
    cache_root: str | None = None
    engines_received: list[str] = field(default_factory=list)
    started: str = field(default_factory=lambda: _now())
    token: str = field(default_factory=lambda: secrets.token_hex(8))  # names this deploy's files on the device

    def __post_init__(self) -> None:
        self.connection = Connection(self.host, self.ssh)

    @contextlib.contextmanager
    def folder_lock(self) -> Iterator[None]:
        """Hold :data:`DEPLOY_LOCK` in the remote folder for the block, waiting (and saying so) while another
        deploy holds it. A device without ``flock`` is not locked (as the runner's lock)."""
        self.stage = "copy"  # the folder is taken for the copy (and what follows)
        folder = remote_words(self.remote_dir)
        lock = remote_words(DEPLOY_LOCK)
        hold = remote_words("sh", "-c", "echo locked; exec cat >/dev/null")
        command = (f"mkdir -p -- {folder} && test -w {folder} && cd -- {folder} || exit {NO_REMOTE_DIR}; "
                   f"if command -v flock >/dev/null; then flock -n {lock} true || echo waiting; "
                   f"exec flock {lock} {hold}; else echo locked; exec cat >/dev/null; fi")
        with tempfile.TemporaryFile() as errors:
            holder = self.connection.hold(command, errors)
            assert holder.stdin is not None and holder.stdout is not None
            try:
                for line in holder.stdout:
                    if line.strip() == b"waiting":
                        self.say(WAITING_DEPLOY.format(folder=self.remote_dir))
                    elif line.strip() == b"locked":
                        break
                else:  # the session ended before the lock was taken
                    holder.wait()
                    errors.seek(0)
                    stderr = errors.read().decode(errors="replace")
                    if holder.returncode == SSH_FAILED:
                        raise ssh_failure(self.host, stderr, self.ssh)
                    raise DeployError("remote dir", f"{self.host}: cannot write the remote folder {self.remote_dir!r}",
                                      found=stderr.strip()[-800:] or f"exit {holder.returncode}",
                                      fix="pass --remote-dir a folder the login user may write (a relative one is "
                                          "under their home)")
                yield
            finally:
                with contextlib.suppress(OSError):
                    holder.stdin.close()  # the remote cat ends, flock lets go
                try:
                    holder.wait(timeout=SHORT_COMMAND_S)
                except subprocess.TimeoutExpired:
                    holder.kill()
                    holder.wait()

    def say(self, message: str) -> None:
        self.progress(f"{self.host}: {message}")

    def fail(self, error: DeployError) -> None:
        self.status, self.error, self.error_kind = "failed", str(error), error.kind
        self.say(f"failed ({error.kind}): {error.what}")

    # the steps
    def upload(self) -> None:
        """Send the files the device lacks or holds with another sha256; remove stray files in the bundle's folders."""
        self.stage = "copy"
        have = self.remote_files()
        local = {**{p: f["sha256"] for p, f in self.bundle.files.items()},
                 MANIFEST: self.bundle.sha256}
        if self.archive is not None:
            self.upload_archive(self.archive, have, local)
            return
        send = [p for p, sha in local.items() if have.get(p) != sha and p != MANIFEST]
        stray = sorted(set(have) - set(local))
        if send or stray or have.get(MANIFEST) != self.bundle.sha256:
            send.append(MANIFEST)  # last in the stream: a copy cut short leaves the old manifest or none
        self.copy = {"sent": send, "kept": len(local) - len(send), "removed": stray,
                     "bytes_sent": sum((self.bundle.root / p).stat().st_size for p in send)}
        self.say(f"copying {len(send)} files ({self.copy['bytes_sent']:,} bytes) to {self.remote_dir}, "
                 f"{self.copy['kept']} already there")
        if not send:
            return
        command = f"cd -- {remote_words(self.remote_dir)}"
        if stray:
            command += f" && rm -f -- {remote_words(*stray)}"
        command += " && tar -xf -"

        def write(stream: IO[bytes]) -> None:
            with tarfile.open(fileobj=stream, mode="w|") as archive:
                for relative in send:
                    archive.add(self.bundle.root / relative, arcname=relative, filter=_owned_by_nobody)

        self._stream(command, write, "copying the bundle")

    def upload_archive(self, archive: Path, have: dict[str, str], local: dict[str, str]) -> None:
        """Copy the bundle's .tar.gz whole (unless the device holds every file already), unpack it there
        with jetson.archive (which checks every member again), and check the files against the manifest."""
        stray = sorted(set(have) - set(local))
        if not stray and all(have.get(p) == sha for p, sha in local.items()):
            self.copy = {"archive": str(archive), "sent": [], "kept": len(local), "removed": [], "bytes_sent": 0}
            self.say(f"every file of {archive.name} is in {self.remote_dir} already")
            return
        size = archive.stat().st_size
        self.copy = {"archive": str(archive), "sent": sorted(local), "kept": 0, "removed": stray, "bytes_sent": size}
        self.say(f"copying {archive.name} ({size:,} bytes) to {self.remote_dir} and unpacking it there")
        upload = f".{archive.name}.upload"
        folder = remote_words(self.remote_dir)

        def write(stream: IO[bytes]) -> None:
            with open(archive, "rb") as f:
                shutil.copyfileobj(f, stream, 1 << 20)

        self._stream(f"cd -- {folder} && cat > {remote_words(upload)}", write, "copying the archive")
        unpack = remote_words(self.remote_python, "-c", Path(archive_module.__file__).read_text(), upload, ".",
                              MANIFEST)
        command = (f"cd -- {folder} && " + (f"rm -f -- {remote_words(*stray)} && " if stray else "")
                   + f"{unpack}; status=$?; rm -f -- {remote_words(upload)}; exit $status")
        done = self.connection.run(command, check=False)
        if done.returncode != 0:
            stderr = done.stderr.decode(errors="replace").strip()
            refused = done.returncode == archive_module.EXIT_REFUSED
            raise DeployError("copy", f"{self.host}: " + ("the device refused the archive" if refused else
                                                          f"unpacking the archive failed (exit {done.returncode})")
                              + f" in {self.remote_dir}", found=stderr[-800:] or None,
                              fix="make the archive again with `edge bundle --tar`" if refused
                              else f"check {self.remote_python} on the device (--remote-python)")
        after = self.remote_files()
        wrong = sorted(p for p, sha in local.items() if after.get(p) != sha)
        if wrong:
            raise DeployError("copy", f"{self.host}: after unpacking {archive.name}, {wrong[0]} in {self.remote_dir} "
                              "does not match its sha256 in the manifest" + (f" (and {len(wrong) - 1} more)"
                                                                               if len(wrong) > 1 else ""),
                              fix="deploy again (an interrupted copy), or check the device's disk")

    def _stream(self, command: str, write: Callable[[IO[bytes]], None], doing: str) -> None:
        """Run ``command`` on the device with ``write``'s bytes as its stdin; a failure raises DeployError."""
        with tempfile.TemporaryFile() as errors:
            process = self.connection.pipe_in(command, errors)
            assert process.stdin is not None
            try:
                with process.stdin:
                    write(process.stdin)
            except BrokenPipeError:
                pass  # the remote side ended early: its status and message say why
            process.wait()
            errors.seek(0)
            stderr = errors.read().decode(errors="replace")
        if process.returncode == SSH_FAILED:
            raise ssh_failure(self.host, stderr, self.ssh)
        if process.returncode:
            raise DeployError("copy", f"{self.host}: {doing} to {self.remote_dir} failed "
                              f"(exit {process.returncode})", found=stderr.strip()[-800:])

    def remote_files(self) -> dict[str, str]:
        """sha256 of the bundle's files already in the remote folder (created if missing)."""
        folder = remote_words(self.remote_dir)
        command = (f"mkdir -p -- {folder} && test -w {folder} && cd -- {folder} || exit {NO_REMOTE_DIR}; "
                   f"find {remote_words(*OWNED, MANIFEST)} -type f -exec sha256sum -- {{}} + 2>/dev/null; true")
        done = self.connection.run(command, check=False)
        if done.returncode == NO_REMOTE_DIR:
            raise DeployError("remote dir", f"{self.host}: cannot write the remote folder {self.remote_dir!r}",
                              found=done.stderr.decode(errors="replace").strip() or "not writable",
                              fix="pass --remote-dir a folder the login user may write (a relative one is under "
                                  "their home)")
        files = {}
        for line in done.stdout.decode(errors="replace").splitlines():
            sha, _, path = line.partition("  ")
            if "/__pycache__/" not in f"/{path}" and not path.endswith(".pyc"):
                files[path.removeprefix("./")] = sha
        return files

    def probe(self) -> None:
        """The device's identity (jetson.device) and engine cache, read with the bundle's own code."""
        script = ("import json, sys; sys.path.insert(0, '.')\n"
                  "from jetson.cuda import load_cuda_runtime\nfrom jetson.device import device_record\n"
                  "from jetson.engine import default_cache_root\nfrom jetson.features import load_tensorrt\n"
                  "record = device_record(load_cuda_runtime(None), str(load_tensorrt().__version__))\n"
                  "print(json.dumps({'identity': record['identity'], 'cache_root': str(default_cache_root())}))")
        done = self.connection.run(f"cd -- {remote_words(self.remote_dir)} && "
                                   f"{remote_words(self.remote_python, '-c', script)}", check=False)
        try:
            found = json.loads(done.stdout.decode().strip().splitlines()[-1])
            self.identity, self.cache_root = found["identity"], found["cache_root"]
        except (ValueError, IndexError, KeyError, TypeError):
            self.say("could not read the device identity (no engine is shared with it): "
                     + done.stderr.decode(errors="replace").strip()[-300:])

    @property
    def runner_output(self) -> str:
        """This deploy's file of the runner's output in the remote folder (removed once shown)."""
        return f".edge-runner.{self.token}.log"

    @property
    def results_snapshot(self) -> str:
        """This deploy's tar of ``results/`` as its runner left them, in the remote folder (removed once fetched)."""
        return f".edge-results.{self.token}.tar"

    def runner_command(self) -> str:
        """``python3 -m jetson run`` in the remote folder, its output to :attr:`runner_output` (shown after it
        ends), then ``results/`` packed into :attr:`results_snapshot`, both under :data:`RUNNER_LOCK` when the
        device has ``flock``; a missing Python is exit 127."""
        python = remote_words(self.remote_python)
        run = remote_words(self.remote_python, "-m", "jetson", *self.runner.argv())
        lock, output = remote_words(RUNNER_LOCK), remote_words(self.runner_output)
        snapshot, part = remote_words(self.results_snapshot), remote_words(f"{self.results_snapshot}.part")
        locked = remote_words("sh", "-c", f"{run} >{output} 2>&1 </dev/null; status=$?; "
                                          f"tar -cf {part} {RESULTS} 2>/dev/null && mv -f -- {part} {snapshot}; "
                                          "exit $status")
        return (f"cd -- {remote_words(self.remote_dir)} || exit 1; command -v {python} >/dev/null || exit 127; "
                f"if command -v flock >/dev/null; then "
                f"flock -n {lock} true || echo {remote_words(WAITING)} >&2; flock {lock} {locked}; "
                f"else {locked}; fi; status=$?; cat {output} >&2; rm -f -- {output}; exit $status")

    def run_runner(self) -> None:
        """``python3 -m jetson run`` in the remote folder; its output to ``deploy.log``."""
        self.stage = "run"
        self.say(f"running {self.remote_python} -m jetson run --backend {self.runner.backend}")
        done = self.connection.run(self.runner_command(), timeout=None, check=False)
        self.exit_code = done.returncode
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / LOG).write_bytes(done.stdout + done.stderr)
        if done.returncode == 0:
            return
        if done.returncode == 127:
            raise DeployError("runner", f"{self.host}: {self.remote_python} was not found",
                              fix="pass --remote-python with the device's Python 3.10+ (JetPack: python3)")
        reason = (RUNNER_EXIT.get(done.returncode)
                  or (f"the runner was interrupted by {_signal_name(done.returncode - 128)}"
                      if done.returncode > 128 else "the runner failed"))
        last = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise DeployError("runner", f"{self.host}: {reason} (exit {done.returncode}); results and logs fetched "
                          f"to {self.out / RESULTS}", found="\n".join(last) or None)

    def fetch(self) -> bool:
        """Bring ``REMOTE_DIR/results`` back into ``out/results`` (replaced whole); False when there is none.
        Nothing the device sends is trusted (edge.deploy.untrusted): a link, a name outside ``results/``
        or malformed JSON is refused (DeployError of kind ``refused results``) and nothing is written."""
        snapshot = remote_words(self.results_snapshot)  # this deploy's run, else results/ as they are now
        done = self.connection.run(f"cd -- {remote_words(self.remote_dir)} || exit 1; if test -f {snapshot}; then "
                                   f"cat {snapshot} && rm -f -- {snapshot}; else test -d {RESULTS} && "
                                   f"tar -cf - {RESULTS}; fi", check=False)
        if done.returncode != 0 or not done.stdout:
            return False
        self.out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fetch.", dir=self.out))
        try:
            try:
                with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:") as archive:
                    members = checked_members(archive, RESULTS, self.host)
                    archive.extractall(staging, members=members, filter="data")
            except (tarfile.TarError, OSError) as e:
                raise DeployError(REFUSED, f"{self.host}: the results it sent cannot be unpacked: refused, nothing "
                                  "of them was written", found=f"{type(e).__name__}: {e}"[:300]) from e
            check_results(staging / RESULTS, self.host)
            if (self.out / RESULTS).exists():
                shutil.rmtree(self.out / RESULTS)
            (staging / RESULTS).replace(self.out / RESULTS)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def device_said(self) -> str | None:
        """What the runner said of its failure, from the fetched run summary: its error (a refusal: an unknown
        power mode with the known ones, a missing tool, no sudo rule), else each failed variant's."""
        summary = _read_json(self.out / RESULTS / "run.json") or {}
        if isinstance(summary.get("error"), str):
            return summary["error"]
        variants = (summary.get("variants") or {}).items()
        failed = [f"{variant_id}: {entry['error']}" for variant_id, entry in variants if isinstance(entry, dict)
                  and entry.get("status") == "failed" and isinstance(entry.get("error"), str)]
        return "\n".join(failed) or None

    def fetch_after_failure(self) -> None:
        """What the failed runner left: its results marked partial and its logs (nothing if the device is gone);
        results that are refused are a failure of their own (raised)."""
        try:
            if self.fetch():
                self.say(f"partial results and logs fetched to {self.out / RESULTS}")
        except DeployError as e:
            if e.kind == REFUSED:
                raise
            self.say(f"could not fetch results after the failure: {e.what}")

    def deploy(self, *, upload: bool = True, before_run: Callable[[DeviceDeploy], None] | None = None) -> None:
        """Copy (unless done already), run, fetch; a failure is recorded (never raised) and the results
        are fetched whenever the runner ran."""
        try:
            with self.folder_lock():  # another deploy of this folder waits until this one has fetched
                if upload:
                    before = self.copy
                    self.upload()
                    if before and not self.copy.get("sent") and not self.copy.get("removed"):
                        self.copy = before  # checked again under the lock: as it was sent before
                if before_run is not None:
                    before_run(self)
                try:
                    self.run_runner()
                except DeployError as e:
                    self.fetch_after_failure()
                    said = self.device_said()
                    if said:
                        raise DeployError(e.kind, e.what, found=said, fix=e.fix) from e
                    raise
                self.stage = "fetch"
                self.fetch()
            self.status = "ok"
            self.say(f"done: {self.out / RESULTS}")
        except DeployError as e:
            self.fail(e)
        finally:
            self.write_record()

    def results(self) -> dict:
        """run.json and each variant's result as fetched (empty when none came back)."""
        folder = self.out / RESULTS
        run = _read_json(folder / "run.json")
        variants = {}
        for variant_id, entry in (run or {}).get("variants", {}).items():
            path = plain_result_file(folder, entry.get("result"))
            variants[variant_id] = {**entry, "data": _read_json(path) if path else None}
        return {"run": run, "variants": variants}

    def record(self) -> dict:
        return {"host": str(self.host), "label": self.host.label, "remote_dir": self.remote_dir,
                "remote_python": self.remote_python, "runner": self.runner.argv(), "status": self.status,
                "stage": self.stage, "error": self.error, "error_kind": self.error_kind,
                "runner_exit_code": self.exit_code, "copy": self.copy, "identity": self.identity,
                "engines_received": self.engines_received, "bundle_sha256": self.bundle.sha256,
                "results": RESULTS if (self.out / RESULTS / "run.json").is_file() else None,
                "started": self.started, "finished": _now()}

    def write_record(self) -> None:
        write_json_atomic(self.record(), self.out / RECORD)


def _owned_by_nobody(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files land owned by the login user, readable, whatever their owner here."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o644
    return info


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
