"""Power mode by name and locked clocks, always put back: ``with DeviceSettings(power_mode="15W",
lock_clocks=True):`` around a benchmark.

A mode's id differs between modules (MAXN_SUPER is 2 on an Orin Nano 8 GB "super" configuration,
15W is 0 there, 7W exists only before "super"), so names are mapped to ids from the module's own
``/etc/nvpmodel.conf`` and never hard-coded. Entering stores the clocks (``jetson_clocks --store``
to a fresh file: an existing one would make it ask before overwriting), sets the mode
(``nvpmodel -m``) and locks the clocks (``jetson_clocks``); leaving undoes them in reverse: the
stored clocks first, then the original mode, on success, on an exception, on Ctrl-C and on
SIGTERM or SIGHUP (a dropped SSH session), which inside the block raise Interrupted.

Both tools change root-only settings: ``jetson_clocks`` exits 1 for anyone but root, and
``nvpmodel -m`` writes root-only sysfs files. The runner never runs as root (under ``sudo`` HOME
moves, the engine cache and a ``pip install --user`` binding with it, and ``results/`` would be left
owned by root); as any other user it calls the two tools, by absolute path, through ``sudo -n``
(never a password prompt), and :func:`check_power_rights` refuses a run, before anything is built,
when the login user lacks the sudoers rule, printing the line to add (:func:`sudoers_line`).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from jetson.errors import JetsonError

NVPMODEL_CONF = Path("/etc/nvpmodel.conf")
TOOL_TIMEOUT_S = 120
#: where JetPack 6 installs the two root-only tools (packages nvidia-l4t-nvpmodel and nvidia-l4t-tools);
#: a tool found on PATH first is the one used (and named in the sudoers line)
JETPACK_TOOLS = {"nvpmodel": "/usr/sbin/nvpmodel", "jetson_clocks": "/usr/bin/jetson_clocks"}
SUDOERS_FILE = "/etc/sudoers.d/edge-jetson"

_MODE_HEADER = re.compile(r"<\s*POWER_MODEL\s+ID\s*=\s*(\d+)\s+NAME\s*=\s*([^\s>]+)\s*>")
_QUERY_NAME = re.compile(r"NV Power Mode:\s*(\S+)")
_CONFIG_FILE = re.compile(r"Config file:\s*(\S+)")  # `nvpmodel -q --verbose`: "NVPM VERB: Config file: PATH"
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: `jetson_clocks --show`'s GPU line (do_igpu: the GPU's devfreq min_freq, max_freq, cur_freq in Hz)
_SHOW_GPU = re.compile(r"^GPU MinFreq=(\d+) MaxFreq=(\d+) CurrentFreq=(\d+)", re.M)
#: the GPU's line in a `jetson_clocks --store` file (store: `PATH:VALUE`, PATH the devfreq node's min_freq)
_STORED_GPU_MIN = re.compile(r"^/sys/class/devfreq/[^/:]+/min_freq:(\d+)\s*$", re.M)


@dataclass(frozen=True)
class PowerMode:
    """An nvpmodel power mode: its id on this module and its name."""

    id: int
    name: str


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived inside DeviceSettings; raised there so that the settings are put
    back. A runner catches it, marks its results partial and exits with ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def parse_nvpmodel_query(text: str, *, where: str = "`nvpmodel -q`") -> PowerMode:
    """The current mode in ``nvpmodel -q`` output: ``NV Power Mode: NAME`` then the id on the next
    line (also with ``--verbose``, where NVPM lines come around them)."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        name = _QUERY_NAME.search(line)
        if name:
            following = next((x.strip() for x in lines[n + 1:] if x.strip()), "")
            if following.isdigit():
                return PowerMode(int(following), name.group(1))
            break
    raise JetsonError(f"{where} does not say the current power mode",
                      expected="a line `NV Power Mode: NAME` followed by the mode's id",
                      found=text.strip()[:300] or "no output")


def parse_nvpmodel_conf(text: str, *, where: str = str(NVPMODEL_CONF)) -> dict[str, int]:
    """Name to id of every ``< POWER_MODEL ID=n NAME=name >`` in an nvpmodel configuration."""
    modes: dict[str, int] = {}
    for mode_id, name in _MODE_HEADER.findall(text):
        if name in modes:
            raise JetsonError(f"{where} defines power mode {name} twice (ids {modes[name]} and {mode_id})")
        modes[name] = int(mode_id)
    if not modes:
        raise JetsonError(f"{where} defines no power mode", expected="lines `< POWER_MODEL ID=n NAME=name >`",
                          fix="point at this module's nvpmodel configuration")
    return modes


def read_power_modes(conf: Path = NVPMODEL_CONF) -> dict[str, int]:
    """Name to id of the power modes this module's nvpmodel configuration defines."""
    try:
        text = Path(conf).read_text()
    except OSError as e:
        raise JetsonError(f"cannot read the nvpmodel configuration {conf}: {e.strerror}",
                          fix="run on a Jetson with JetPack (it installs /etc/nvpmodel.conf)") from e
    return parse_nvpmodel_conf(text, where=str(conf))


def nvpmodel_conf_in_use() -> Path:
    """The configuration nvpmodel itself reads: `nvpmodel -q --verbose` names it ("NVPM VERB: Config file: PATH";
    any user may ask), else :data:`NVPMODEL_CONF`, where JetPack links the module's own."""
    try:
        said = run_tool(["nvpmodel", "-q", "--verbose"])
    except JetsonError:
        return NVPMODEL_CONF
    match = _CONFIG_FILE.search(said)
    return Path(match.group(1)) if match else NVPMODEL_CONF


def power_modes_for(asked: str, conf: Path | None = None) -> tuple[dict[str, int], Path]:
    """The modes of ``conf`` (default: the configuration nvpmodel reads) for ``--power-mode asked``; a JetsonError
    naming ``asked`` when they cannot be read."""
    conf = conf or nvpmodel_conf_in_use()
    try:
        return read_power_modes(conf), conf
    except JetsonError as e:
        raise JetsonError(f"--power-mode {asked}: {e.what}", expected="the module's nvpmodel configuration, which "
                          "maps mode names to ids", found=e.found,
                          fix=f"{e.fix}; or pass --nvpmodel-conf with the module's configuration") from e


def resolve_power_mode(name: str, modes: Mapping[str, int], *, where: str = str(NVPMODEL_CONF)) -> PowerMode:
    """The mode called ``name`` (case aside) among ``modes``; an unknown name lists the known ones."""
    if name in modes:
        return PowerMode(modes[name], name)
    folded = [known for known in modes if known.lower() == name.lower()]
    if len(folded) == 1:
        return PowerMode(modes[folded[0]], folded[0])
    raise JetsonError(f"power mode {name!r} is not defined on this module ({where})",
                      expected=f"one of {', '.join(modes)}", found=name,
                      fix="pass --power-mode with one of those names")


def run_tool(argv: list[str]) -> str:
    """Run a JetPack tool without a terminal (a question it asks reads end-of-file) and return its
    output; a missing tool or a failure is a JetsonError with what the tool said."""
    command = " ".join(argv)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S)
    except FileNotFoundError:
        raise JetsonError(f"{argv[0]} was not found on PATH",
                          expected=f"{argv[0]}, which JetPack installs",
                          fix="run on a Jetson, or leave --power-mode and --lock-clocks off") from None
    except subprocess.TimeoutExpired:
        raise JetsonError(f"`{command}` did not finish within {TOOL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        said = (done.stderr.strip() + "\n" + done.stdout.strip()).strip()[-500:]
        raise JetsonError(f"`{command}` failed with exit code {done.returncode}", found=said or "no output",
                          fix=(f"check that the login user has this sudoers line ({SUDOERS_FILE}): {sudoers_line()}"
                               if argv[0] == "sudo" else f"see what {Path(argv[0]).name} said (found)"))
    return done.stdout


def tool_path(name: str) -> str:
    """The absolute path of a JetPack tool: the one on PATH, else where JetPack installs it."""
    return shutil.which(name) or JETPACK_TOOLS[name]


def is_root() -> bool:
    return os.geteuid() == 0


def as_root(argv: list[str]) -> list[str]:
    """``argv`` with its tool by absolute path, through ``sudo -n`` unless this process is root already."""
    command = [tool_path(argv[0]), *argv[1:]]
    return command if is_root() else ["sudo", "-n", *command]


def sudoers_line(user: str | None = None) -> str:
    """The sudoers rule that lets ``user`` (the login user) run exactly the two power tools, nothing else."""
    return (f"{user or getpass.getuser()} ALL=(root) NOPASSWD: {tool_path('nvpmodel')}, "
            f"{tool_path('jetson_clocks')}")


def tools_needed(power_mode: str | None, lock_clocks: bool) -> list[str]:
    """The root-only tools a run with these settings calls."""
    return [tool for tool, wanted in (("nvpmodel", power_mode is not None), ("jetson_clocks", lock_clocks))
            if wanted]


def missing_power_rights(tools: list[str]) -> list[str]:
    """The tools among ``tools`` that this user may not run as root without a password (``sudo -n -l``
    answers without running them); empty for root."""
    if is_root() or not tools:
        return []
    if shutil.which("sudo") is None:
        return [tool_path(tool) for tool in tools]
    missing = []
    for tool in tools:
        done = subprocess.run(["sudo", "-n", "-l", tool_path(tool)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        if done.returncode != 0:
            missing.append(tool_path(tool))
    return missing


def check_power_rights(power_mode: str | None, lock_clocks: bool) -> None:
    """Refuse, before anything runs, settings this user cannot make: the error names the sudoers line."""
    missing = missing_power_rights(tools_needed(power_mode, lock_clocks))
    if not missing:
        return
    asked = " and ".join(flag for flag, on in (("--power-mode", power_mode is not None),
                                                ("--lock-clocks", lock_clocks)) if on)
    no_sudo = shutil.which("sudo") is None
    raise JetsonError(f"{asked} need root rights for {', '.join(missing)}, and {getpass.getuser()} may not run "
                      + ("them: sudo is not installed" if no_sudo else "them through `sudo -n` (no password)"),
                      expected="root rights for exactly these tools, through a sudoers rule (the runner itself "
                               "never runs as root)",
                      fix=(("install sudo, then " if no_sudo else "") + f"add this line with `sudo visudo -f "
                           f"{SUDOERS_FILE}`: {sudoers_line()}   (or leave out {asked})"))


def check_not_under_sudo() -> None:
    """Refuse a runner started with ``sudo``: HOME moves (the engine cache is rebuilt, a ``pip install
    --user`` binding vanishes) and results/ would be left owned by root."""
    user = os.environ.get("SUDO_USER")
    if is_root() and user and user != "root":
        raise JetsonError(f"the runner was started with sudo (by {user})",
                          expected="the runner run as the login user; only nvpmodel and jetson_clocks need root, "
                                   "and the runner calls them through `sudo -n`",
                          fix=f"run it without sudo, after adding this line with `sudo visudo -f {SUDOERS_FILE}`: "
                              f"{sudoers_line(user)}")


def query_power_mode() -> PowerMode:
    """The current power mode (``nvpmodel -q``)."""
    return parse_nvpmodel_query(run_tool(["nvpmodel", "-q"]))


def set_power_mode(mode: PowerMode) -> None:
    """Switch to ``mode`` (``nvpmodel -m ID``) and check that it took: a mode that needs a reboot
    asks for one, reads no answer and stays where it was."""
    said = run_tool(as_root(["nvpmodel", "-m", str(mode.id)]))
    now = query_power_mode()
    if now.id != mode.id:
        raise JetsonError(f"power mode {mode.name} (id {mode.id}) did not take effect; still {now.name} "
                          f"(id {now.id})", found=said.strip()[-300:] or None,
                          fix=f"switch once by hand (`sudo nvpmodel -m {mode.id}`, reboot if it asks), then rerun")


def gpu_clocks(show: str) -> dict | None:
    """The GPU's clocks in `jetson_clocks --show`'s words (Hz), None when it prints no GPU line."""
    match = _SHOW_GPU.search(show)
    if match is None:
        return None
    return dict(zip(("min_hz", "max_hz", "current_hz"), map(int, match.groups())))


def error_lines(said: str) -> list[str]:
    """jetson_clocks' own error lines: it prints them ("Error: Failed to max GPU frequency!", "Error: Failed to
    restore PATH") and still exits 0 (NVIDIA's script for L4T r36 ends with `main $@; exit 0`)."""
    return [line.strip() for line in said.splitlines() if line.strip().lower().startswith("error")]


def read_clocks() -> tuple[str, dict | None]:
    """`jetson_clocks --show` (root only, as every jetson_clocks call) and the GPU's clocks in it."""
    show = run_tool(as_root(["jetson_clocks", "--show"]))
    return show, gpu_clocks(show)


@dataclass(frozen=True)
class SettingsRecord:
    """What DeviceSettings did, for the results: the mode before, the mode during, clocks locked, and what
    `jetson_clocks --show` said of the GPU's clocks after locking them (``clocks["locked"]``) and after putting
    them back (``clocks["restored"]``, filled in when the block ends)."""

    original_mode: PowerMode | None
    power_mode: PowerMode | None
    clocks_locked: bool
    clocks: dict | None = None


class DeviceSettings:
    """Set a power mode by name and/or lock the clocks for the ``with`` block, then put both back.

    ``conf`` is the module's nvpmodel configuration, read for the name-to-id map. Signal handlers
    are installed only in the main thread (Python allows no other).
    """

    def __init__(self, power_mode: str | None = None, lock_clocks: bool = False, *,
                 conf: Path | None = None) -> None:
        self.power_mode = power_mode
        self.lock_clocks = lock_clocks
        self.conf = conf
        self._original: PowerMode | None = None
        self._target: PowerMode | None = None
        self._mode_changed = False
        self._store_dir: Path | None = None
        self._saved_handlers: dict[int, object] = {}
        self.clocks: dict | None = {} if lock_clocks else None  # what was read back (SettingsRecord.clocks)

    def __enter__(self) -> SettingsRecord:
        check_power_rights(self.power_mode, self.lock_clocks)
        if self.power_mode is not None:
            modes, conf = power_modes_for(self.power_mode, self.conf)
            self._target = resolve_power_mode(self.power_mode, modes, where=str(conf))
            self._original = query_power_mode()
        self._raise_on_signals()
        try:
            if self.lock_clocks:
                self._store_dir = Path(tempfile.mkdtemp(prefix="jetson-clocks-"))
                run_tool(as_root(["jetson_clocks", "--store", str(self._store_file)]))
            if self._target is not None and self._original is not None and self._target.id != self._original.id:
                self._mode_changed = True
                set_power_mode(self._target)
            if self.lock_clocks:
                self._lock_clocks()
        except BaseException:
            self._put_back(raising=False)
            raise
        return SettingsRecord(self._original, self._target, self.lock_clocks, self.clocks)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._put_back(raising=exc_type is None)

    def _lock_clocks(self) -> None:
        """`jetson_clocks`, then read back that the GPU's minimum clock is its maximum: the script only prints its
        failures and exits 0, so its status proves nothing."""
        said = run_tool(as_root(["jetson_clocks"]))
        show, gpu = read_clocks()
        errors = error_lines(said)
        assert self.clocks is not None
        self.clocks["locked"] = {"gpu": gpu, "errors": errors}
        if errors or gpu is None or gpu["min_hz"] != gpu["max_hz"]:
            raise JetsonError("--lock-clocks: jetson_clocks exited 0 but did not lock the clocks",
                              expected="`jetson_clocks --show` with the GPU's MinFreq equal to its MaxFreq",
                              found="; ".join(errors + [_gpu_line(show)]),
                              fix="run `sudo jetson_clocks` and `sudo jetson_clocks --show` by hand and read their "
                                  "errors (another tool holding the clocks, a container without /sys), or run "
                                  "without --lock-clocks")

    def _restore_clocks(self) -> JetsonError | None:
        """`jetson_clocks --restore FILE`, then read back that the GPU's minimum clock is the stored one; the
        failure (its messages, what --show says) when it is not."""
        try:
            stored_text = self._store_file.read_text()
        except OSError:
            stored_text = ""
        match = _STORED_GPU_MIN.search(stored_text)
        stored = int(match.group(1)) if match else None
        said = run_tool(as_root(["jetson_clocks", "--restore", str(self._store_file)]))
        show, gpu = read_clocks()
        errors = error_lines(said)
        if self.clocks is not None:
            self.clocks["restored"] = {"gpu": gpu, "stored_gpu_min_hz": stored, "errors": errors}
        if errors or (stored is not None and (gpu is None or gpu["min_hz"] != stored)):
            return JetsonError("jetson_clocks --restore exited 0 but did not put the clocks back",
                               expected=f"the GPU's MinFreq back at {stored} Hz" if stored is not None else
                               "no error from jetson_clocks --restore",
                               found="; ".join(errors + [_gpu_line(show)]),
                               fix="the clocks stay as jetson_clocks left them until `sudo nvpmodel -m ID` sets the "
                                   "mode's clocks again, or a reboot; its message (found) names the node")
        return None

    @property
    def _store_file(self) -> Path:
        assert self._store_dir is not None
        return self._store_dir / "l4t_dfs.conf"

    def _put_back(self, *, raising: bool) -> None:
        """Undo in the reverse order of setting up: the stored clocks, then the original mode, with Ctrl-C
        and the handled signals ignored meanwhile; a failure is raised only if nothing else is."""
        self._ignore_signals()
        failures: list[JetsonError] = []
        try:
            if self._store_dir is not None:
                try:
                    if self._store_file.exists():
                        failure = self._restore_clocks()
                        if failure is not None:
                            failures.append(failure)
                except JetsonError as e:
                    failures.append(e)
                shutil.rmtree(self._store_dir, ignore_errors=True)
                self._store_dir = None
            if self._mode_changed and self._original is not None:
                try:
                    set_power_mode(self._original)
                    self._mode_changed = False
                except JetsonError as e:
                    failures.append(e)
        finally:
            self._restore_handlers()
        for failure in failures:
            print(f"could not put the device back: {failure}", file=sys.stderr)
        if failures and raising:
            raise failures[0]

    def _raise_on_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in _HANDLED_SIGNALS:
            self._saved_handlers[signum] = signal.signal(signum, _raise_interrupted)

    def _ignore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (*_HANDLED_SIGNALS, signal.SIGINT):
            previous = signal.signal(signum, signal.SIG_IGN)
            self._saved_handlers.setdefault(signum, previous)

    def _restore_handlers(self) -> None:
        for signum, handler in self._saved_handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._saved_handlers.clear()


def _gpu_line(show: str) -> str:
    match = _SHOW_GPU.search(show)
    return match.group(0) if match else "no GPU line in `jetson_clocks --show`"


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)
