"""``python3 -m jetson check``: is this device ready for ``python3 -m jetson run``? Before anything is
built or copied (``edge deploy --check`` sends this package to the device as a zip and runs it there).

One :class:`Check` per question, each ``ok``, ``warn`` (worth knowing, not blocking), ``fail``
(the run would fail or mislead: the check's ``fix`` says what to do) or ``skip`` (not asked for):
Python, L4T/JetPack, TensorRT (supported or not), the CUDA bindings (each must answer a trivial
call, not only import: a cuda-python of the wrong major version imports and fails at its first
call), ``sudo -n`` rights for the power tools when power settings are asked, tegrastats, the power
modes of this module's nvpmodel.conf (and the one asked), free memory, swap, free disk and the
contiguous-memory (CMA) pool. The report's format: :func:`report` (``edge-jetson-check`` version 1).
"""

from __future__ import annotations

import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jetson.errors import JetsonError

FORMAT, FORMAT_VERSION = "edge-jetson-check", 1
STATUSES = ("ok", "warn", "fail", "skip")
MEMINFO = "/proc/meminfo"
MIN_PYTHON = (3, 10)                     # JetPack 6's python3
SUPPORTED_TENSORRT = ((10, 3), (12, 0))  # from JetPack 6.1's 10.3 up to the 11.x the code is written for
MIN_AVAILABLE_MIB = 2048                 # the default builder workspace (2 GiB) must fit beside the runner
MIN_DISK_MIB = 2048                      # engines, the engine and timing caches, results and logs
DEFAULT_CMA_MIB = 256                    # the Orin Nano's default pool: large fused layers failed there
#: L4T major (and minor) -> JetPack, as NVIDIA's release tables give them
JETPACK = {(35, None): "5.1 (not supported: TensorRT 8.5)", (36, 3): "6.0 (TensorRT 8.6: not supported)",
           (36, 4): "6.1-6.2", (36, 5): "6.2.x", (38, None): "7.0-7.1", (39, None): "7.2"}


@dataclass(frozen=True)
class Check:
    """One question's answer: ``value`` in words, ``detail`` as data, ``fix`` when it is not ok."""

    name: str
    status: str
    value: str
    fix: str | None = None
    detail: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check status {self.status!r}, expected one of {STATUSES}")


@dataclass(frozen=True)
class CheckOptions:
    """What the run will be asked: the checks that matter follow from it."""

    backend: str = "tensorrt"
    cuda: str | None = None
    power_mode: str | None = None
    lock_clocks: bool = False
    nvpmodel_conf: Path | None = None
    energy: str = "auto"
    min_available_mib: int = MIN_AVAILABLE_MIB
    min_disk_mib: int = MIN_DISK_MIB
    folder: Path = Path(".")


def check_python() -> Check:
    version = sys.version_info[:3]
    text = ".".join(map(str, version))
    if version[:2] >= MIN_PYTHON:
        return Check("python", "ok", f"{text} ({sys.executable})", detail={"version": text})
    return Check("python", "fail", f"{text} ({sys.executable})", detail={"version": text},
                 fix=f"run with Python {'.'.join(map(str, MIN_PYTHON))} or newer (JetPack 6's python3); "
                     "edge deploy --remote-python picks it")


NUMPY_HINT = ("install JetPack's numpy (`sudo apt install python3-numpy`), or `pip install numpy` for the Python "
              "that runs the runner (edge deploy --remote-python)")


def require_numpy() -> str:
    """numpy's version; a JetsonError naming the Python and the fix when it does not import (the runner's only
    dependency outside the standard library: the device side imports it where it is used, so that this check and
    `python3 -m jetson check` can say it is missing)."""
    try:
        import numpy
    except ImportError as e:
        raise JetsonError(f"numpy does not import in {sys.executable}", found=str(e), fix=NUMPY_HINT) from e
    return str(numpy.__version__)


def check_numpy() -> Check:
    try:
        version = require_numpy()
    except JetsonError as e:
        return Check("numpy", "fail", f"not importable ({e.found})", fix=NUMPY_HINT)
    return Check("numpy", "ok", version, detail={"version": version})


def jetpack_of(l4t: str) -> str | None:
    """The JetPack release of an L4T release ("36.4.3" -> "6.1-6.2"), None when unknown."""
    parts = [int(p) for p in l4t.split(".")[:2] if p.isdigit()]
    if not parts:
        return None
    return JETPACK.get((parts[0], parts[1] if len(parts) > 1 else None)) or JETPACK.get((parts[0], None))


def check_l4t() -> Check:
    from jetson import device

    release = device.l4t_release()
    model = device.device_model()
    if release is None:
        return Check("l4t", "fail", f"no {device.NV_TEGRA_RELEASE}: not a Jetson with JetPack",
                     detail={"l4t": None, "jetpack": None, "device_model": model},
                     fix="run on a Jetson with JetPack 6.1 or newer (L4T 36.4+)")
    jetpack = jetpack_of(release)
    detail = {"l4t": release, "jetpack": jetpack, "device_model": model}
    value = f"L4T {release} (JetPack {jetpack or 'unknown'}){', ' + model if model else ''}"
    if jetpack is None or "not supported" in jetpack:
        return Check("l4t", "fail", value, detail=detail, fix="flash JetPack 6.1 or newer (L4T 36.4+, TensorRT 10.3)")
    return Check("l4t", "ok", value, detail=detail)


def check_tensorrt(options: CheckOptions) -> Check:
    if options.backend != "tensorrt":
        return Check("tensorrt", "skip", f"not used (--backend {options.backend})")
    from jetson.features import load_tensorrt, parse_version

    try:
        version = str(load_tensorrt().__version__)
    except JetsonError as e:
        return Check("tensorrt", "fail", e.what, detail={"version": None, "supported": False},
                     fix=f"{e.fix}; or measure on ONNX Runtime: --backend ort")
    low, high = SUPPORTED_TENSORRT
    supported = low <= parse_version(version)[:2] < high
    detail = {"version": version, "supported": supported}
    if supported:
        return Check("tensorrt", "ok", f"{version} (supported)", detail=detail)
    return Check("tensorrt", "fail", f"{version} (not supported: edge needs 10.3 up to 11.x)", detail=detail,
                 fix="install JetPack 6.1 or newer (TensorRT 10.3); a pip TensorRT on a Jetson is refused by its GPU")


def cuda_binding_answer(name: str) -> tuple[bool, str]:
    """Whether CUDA binding ``name`` loads and answers a trivial call (:func:`jetson.cuda.try_cuda_binding`,
    the runner's own probe), then ``cudaGetDeviceProperties(0)``, which needs the driver and the GPU; and in
    words what it said."""
    from jetson import cuda

    cudart, why_not = cuda.try_cuda_binding(name)
    if cudart is None:
        return False, why_not or "did not answer"
    try:
        props = cuda.check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    except JetsonError as e:
        return False, e.what + (f" ({e.found.strip()})" if e.found else "")
    except (RuntimeError, OSError, AttributeError) as e:  # cuda-python raises when it cannot load its libraries
        return False, f"its first call raised {type(e).__name__}: {e}"
    gpu = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return True, f"answers ({gpu})"


def check_cuda(options: CheckOptions) -> Check:
    if options.backend != "tensorrt":
        return Check("cuda", "skip", f"not used (--backend {options.backend})")
    from jetson.cuda import BINDINGS, CUDA_HINT

    names = (options.cuda,) if options.cuda else BINDINGS
    answers = {name: cuda_binding_answer(name) for name in names}
    value = "; ".join(f"{name}: {said}" for name, (_, said) in answers.items())
    first = next((name for name, (ok, _) in answers.items() if ok), None)
    detail = {"bindings": {name: {"answers": ok, "said": said} for name, (ok, said) in answers.items()},
              "used": first}
    if first is None:
        return Check("cuda", "fail", value, detail=detail, fix=CUDA_HINT)
    return Check("cuda", "ok", f"{first} is used; {value}", detail=detail)


def check_sudo(options: CheckOptions) -> Check:
    from jetson.power import is_root, missing_power_rights, sudoers_line, tools_needed

    tools = tools_needed(options.power_mode, options.lock_clocks)
    if not tools:
        return Check("sudo", "skip", "no power setting asked (--power-mode, --lock-clocks)")
    if is_root():
        return Check("sudo", "ok", "running as root", detail={"tools": tools})
    missing = missing_power_rights(tools)
    detail = {"tools": tools, "missing": missing, "sudoers_line": sudoers_line()}
    if missing:
        return Check("sudo", "fail", f"`sudo -n` may not run {', '.join(missing)}", detail=detail,
                     fix=f"add this line with `sudo visudo -f /etc/sudoers.d/edge-jetson`: {sudoers_line()}")
    return Check("sudo", "ok", f"`sudo -n` may run {', '.join(tools)}", detail=detail)


def check_tegrastats(options: CheckOptions) -> Check:
    if options.energy == "off":
        return Check("tegrastats", "skip", "energy not measured (--energy off)")
    path = shutil.which("tegrastats")
    if path is None:
        return Check("tegrastats", "fail", "tegrastats is not on PATH: no energy figures", detail={"path": None},
                     fix="install it with JetPack (nvidia-l4t-tools), or measure without energy: --energy off")
    return Check("tegrastats", "ok", path, detail={"path": path})


def check_power_modes(options: CheckOptions) -> Check:
    from jetson.power import nvpmodel_conf_in_use, read_power_modes, resolve_power_mode

    conf = options.nvpmodel_conf or nvpmodel_conf_in_use()
    try:
        modes = read_power_modes(conf)
    except JetsonError as e:
        status = "fail" if options.power_mode else "warn"
        return Check("power_modes", status, e.what, detail={"conf": str(conf), "modes": None}, fix=e.fix)
    detail = {"conf": str(conf), "modes": modes, "asked": options.power_mode}
    value = ", ".join(f"{name} (id {mode_id})" for name, mode_id in modes.items())
    if options.power_mode is None:
        return Check("power_modes", "ok", value, detail=detail)
    try:
        resolve_power_mode(options.power_mode, modes, where=str(conf))
    except JetsonError as e:
        return Check("power_modes", "fail", f"{options.power_mode} is not one of {', '.join(modes)}", detail=detail,
                     fix=e.fix)
    return Check("power_modes", "ok", f"{options.power_mode} among {value}", detail=detail)


def read_meminfo(path: str | None = None) -> dict[str, int]:
    """``/proc/meminfo`` in KiB by field (MemAvailable, SwapTotal, CmaTotal, ...); empty when unreadable."""
    try:
        text = Path(path or MEMINFO).read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        number = rest.split()[0] if rest.split() else ""
        if number.isdigit():
            fields[name.strip()] = int(number)
    return fields


def check_memory(options: CheckOptions, meminfo: dict[str, int]) -> Check:
    if "MemAvailable" not in meminfo:
        return Check("memory", "warn", f"no MemAvailable in {MEMINFO}", detail={"available_mib": None})
    available, total = meminfo["MemAvailable"] // 1024, meminfo.get("MemTotal", 0) // 1024
    detail = {"available_mib": available, "total_mib": total, "minimum_mib": options.min_available_mib}
    value = f"{available:,} MiB available of {total:,} MiB"
    if available < options.min_available_mib:
        return Check("memory", "fail", value, detail=detail,
                     fix=f"free memory to at least {options.min_available_mib:,} MiB (stop the desktop: `sudo "
                         "systemctl isolate multi-user.target`; other processes), add swap, or bundle with a smaller "
                         "--workspace")
    return Check("memory", "ok", value, detail=detail)


def check_swap(meminfo: dict[str, int]) -> Check:
    total, free = meminfo.get("SwapTotal"), meminfo.get("SwapFree")
    detail = {"total_mib": None if total is None else total // 1024, "free_mib": None if free is None else free // 1024}
    if not total:
        return Check("swap", "warn", "no swap", detail=detail,
                     fix="add swap (e.g. a swap file on the NVMe): TensorRT builds of big models were OOM-killed "
                         "on 8 GB boards without it")
    return Check("swap", "ok", f"{detail['free_mib']:,} MiB free of {detail['total_mib']:,} MiB", detail=detail)


def check_disk(options: CheckOptions) -> Check:
    usage = shutil.disk_usage(options.folder)
    free = usage.free // 2**20
    detail = {"folder": str(Path(options.folder).resolve()), "free_mib": free, "minimum_mib": options.min_disk_mib}
    value = f"{free:,} MiB free in {detail['folder']}"
    if free < options.min_disk_mib:
        return Check("disk", "fail", value, detail=detail,
                     fix=f"free at least {options.min_disk_mib:,} MiB there (old engines: ~/.cache/edge-jetson), or "
                         "deploy into another folder (--remote-dir)")
    return Check("disk", "ok", value, detail=detail)


def check_cma(meminfo: dict[str, int]) -> Check:
    if "CmaTotal" not in meminfo:
        return Check("cma", "warn", f"no CmaTotal in {MEMINFO}: the contiguous-memory pool is unknown",
                     detail={"total_mib": None, "free_mib": None})
    total, free = meminfo["CmaTotal"] // 1024, meminfo.get("CmaFree", 0) // 1024
    detail = {"total_mib": total, "free_mib": free}
    value = f"{free:,} MiB free of {total:,} MiB"
    if total <= DEFAULT_CMA_MIB:
        return Check("cma", "warn", value + " (the default pool)", detail=detail,
                     fix="TensorRT failed or chose other tactics for fused layers asking 272-988 MB of contiguous "
                         "memory from the Orin Nano's 256 MB pool: if a build fails there, split the graph or lower "
                         "the builder workspace (raising the pool to 1 GB failed at boot, onnxsim's measurements)")
    return Check("cma", "ok", value, detail=detail)


def run_checks(options: CheckOptions) -> list[Check]:
    """Every check, in order; none raises (each turns its failure into a ``fail`` with the fix)."""
    meminfo = read_meminfo()
    checks: list[Callable[[], Check]] = [
        check_python, check_numpy, check_l4t, lambda: check_tensorrt(options), lambda: check_cuda(options),
        lambda: check_sudo(options), lambda: check_tegrastats(options), lambda: check_power_modes(options),
        lambda: check_memory(options, meminfo), lambda: check_swap(meminfo), lambda: check_disk(options),
        lambda: check_cma(meminfo)]
    return [check() for check in checks]


def report(checks: list[Check]) -> dict:
    """The checks as JSON: ``ok`` is false when any failed."""
    from jetson.device import in_container

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "ok": not any(c.status == "fail" for c in checks),
            "hostname": platform.node(), "machine": platform.machine(), "container": in_container(),
            "checks": [asdict(c) for c in checks]}


def table(checks: list[dict]) -> str:
    """The checks as aligned lines: name, status, value; the fix under each one that is not ok."""
    width = max(len(c["name"]) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c['name']:<{width}}  {c['status']:<4}  {c['value']}")
        if c.get("fix") and c["status"] in ("fail", "warn"):
            lines.append(f"{'':<{width}}        fix: {c['fix']}")
    return "\n".join(lines)
