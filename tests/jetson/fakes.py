"""Put the named fakes of tegrastats, nvpmodel, jetson_clocks, nvcc and trtexec (tests/jetson/bin/fake_*) on PATH
under the real names, with a call log, for tests here and for tests that run the device side
elsewhere (a remote PATH), and FAKE TensorRT headers for the plugin build (EDGE_JETSON_TENSORRT_INCLUDE)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

BIN = Path(__file__).parent / "bin"
DATA = Path(__file__).parent / "data"
REAL_NAMES = {"tegrastats": "fake_tegrastats", "nvpmodel": "fake_nvpmodel", "jetson_clocks": "fake_jetson_clocks",
              "nvcc": "fake_nvcc"}
#: FAKE TensorRT headers for FakeNvcc: NvInferVersion.h of TensorRT 10.3.0 (the defines jetson.plugin_build reads,
#: as TensorRT's include/NvInferVersion.h at v10.3.0 spells them) and an empty NvInferRuntime.h
FAKE_TENSORRT_HEADERS = {
    "NvInferVersion.h": "// FAKE TensorRT header for tests (tests/jetson/fakes.py), not NVIDIA's\n"
                        "#define NV_TENSORRT_MAJOR 10\n#define NV_TENSORRT_MINOR 3\n#define NV_TENSORRT_PATCH 0\n"
                        "#define NV_TENSORRT_BUILD 26\n",
    "NvInferRuntime.h": "// FAKE TensorRT header for tests (tests/jetson/fakes.py), not NVIDIA's\n"}


@dataclass(frozen=True)
class FakeJetson:
    """Where the fakes are and what they read and write."""

    bin_dir: Path
    tensorrt_include: Path
    call_log: Path
    nvpmodel_state: Path
    nvpmodel_conf: Path
    tegrastats_trace: Path
    clocks_state: Path  # fake_jetson_clocks' GPU devfreq state (JSON)

    def variables(self) -> dict[str, str]:
        """PATH with the fakes first, and the fakes' own variables."""
        return {"PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "FAKE_JETSON_CALL_LOG": str(self.call_log),
                "FAKE_NVPMODEL_STATE": str(self.nvpmodel_state),
                "FAKE_NVPMODEL_CONF": str(self.nvpmodel_conf),
                "FAKE_TEGRASTATS_TRACE": str(self.tegrastats_trace),
                "FAKE_JETSON_CLOCKS_STATE": str(self.clocks_state),
                "EDGE_JETSON_TENSORRT_INCLUDE": str(self.tensorrt_include)}

    def fail_clocks(self, step: str) -> None:
        """Make jetson_clocks' GPU writes fail in ``step`` ("lock" or "restore"): it prints NVIDIA's error line
        and exits 0, as the real script does."""
        state = json.loads(self.clocks_state.read_text()) if self.clocks_state.is_file() else {}
        self.clocks_state.write_text(json.dumps({**state, "fail": step}))

    def gpu_clocks(self) -> dict:
        """The fake GPU devfreq state: min, max, cur (Hz)."""
        state = json.loads(self.clocks_state.read_text()) if self.clocks_state.is_file() else {}
        return {"min": 306000000, "max": 1020000000, "cur": 306000000, **state}

    def calls(self) -> list[list[str]]:
        """Every call so far, in order, as [program, *arguments]."""
        return [entry["argv"] for entry in self.call_entries()]

    def call_entries(self) -> list[dict]:
        """Every call so far: ``{"argv": [...], "euid": N}`` (``euid`` None for a fake that logs no user)."""
        if not self.call_log.exists():
            return []
        entries = [json.loads(line) for line in self.call_log.read_text().splitlines()]
        return [entry if isinstance(entry, dict) else {"argv": entry, "euid": None} for entry in entries]


def install_fakes(root: Path, *, conf: Path = DATA / "nvpmodel_p3767_0003_super.conf",
                  trace: Path = DATA / "jp6_orin_nano_user_trace.log", python: str = sys.executable,
                  site_packages: str | None = None) -> FakeJetson:
    """Wrappers ``root/bin/{tegrastats,nvpmodel,jetson_clocks,nvcc,trtexec}`` that run the fakes with
    ``python`` (this interpreter by default), isolated and without site (a tenth of the start-up time of
    ``python3`` via PATH). The fakes' variables are written into the wrappers too, so a call through
    ``sudo`` (which resets the environment) reaches the same state and call log; the call log is
    writable by every user (the device's login user and root through sudo both append to it).
    ``site_packages``: where trtexec's fake finds numpy and onnx when ``python`` is not this one."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fakes = FakeJetson(bin_dir, root / "include", root / "calls.jsonl", root / "nvpmodel.state", conf, trace,
                       root / "clocks.json")
    fakes.tensorrt_include.mkdir(parents=True, exist_ok=True)
    for name, text in FAKE_TENSORRT_HEADERS.items():
        (fakes.tensorrt_include / name).write_text(text)
    fakes.call_log.touch()
    fakes.call_log.chmod(0o666)
    baked = " ".join(f"{name}={shlex.quote(value)}" for name, value in fakes.variables().items()
                     if name != "PATH")
    for real, fake in REAL_NAMES.items():
        wrapper = bin_dir / real
        command = f"{shlex.quote(python)} -I -S {shlex.quote(str(BIN / fake))}"
        wrapper.write_text(f'#!/bin/sh\nexport {baked}\nexec {command} "$@"\n')
        wrapper.chmod(0o755)
    # trtexec "builds" with tests/fake_tensorrt.py, which needs numpy and onnx: the interpreter's site stays on
    trtexec = bin_dir / "trtexec"
    if site_packages:
        baked += f" PYTHONPATH={shlex.quote(site_packages)}"
        command = f"{shlex.quote(python)} {shlex.quote(str(BIN / 'fake_trtexec'))}"
    else:
        command = f"{shlex.quote(python)} -I {shlex.quote(str(BIN / 'fake_trtexec'))}"
    trtexec.write_text(f'#!/bin/sh\nexport {baked}\nexec {command} "$@"\n')
    trtexec.chmod(0o755)
    return fakes


CHILD_FAKES = Path(__file__).parent / "child_fakes"


def child_fakes_path(existing: str | None = None) -> str:
    """A PYTHONPATH on which a child process (the runner's engine build: jetson.build_process) imports
    FakeTensorRT as ``tensorrt`` (tests/jetson/child_fakes), ``existing`` after it."""
    repo = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(filter(None, [str(CHILD_FAKES), repo, existing]))
