"""Put the named fakes of tegrastats, nvpmodel, jetson_clocks and trtexec (tests/jetson/bin/fake_*) on PATH
under the real names, with a call log, for tests here and for tests that run the device side
elsewhere (a remote PATH)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

BIN = Path(__file__).parent / "bin"
DATA = Path(__file__).parent / "data"
REAL_NAMES = {"tegrastats": "fake_tegrastats", "nvpmodel": "fake_nvpmodel", "jetson_clocks": "fake_jetson_clocks"}


@dataclass(frozen=True)
class FakeJetson:
    """Where the fakes are and what they read and write."""

    bin_dir: Path
    call_log: Path
    nvpmodel_state: Path
    nvpmodel_conf: Path
    tegrastats_trace: Path

    def variables(self) -> dict[str, str]:
        """PATH with the fakes first, and the fakes' own variables."""
        return {"PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "FAKE_JETSON_CALL_LOG": str(self.call_log),
                "FAKE_NVPMODEL_STATE": str(self.nvpmodel_state),
                "FAKE_NVPMODEL_CONF": str(self.nvpmodel_conf),
                "FAKE_TEGRASTATS_TRACE": str(self.tegrastats_trace)}

    def calls(self) -> list[list[str]]:
        """Every call so far, in order, as [program, *arguments]."""
        if not self.call_log.exists():
            return []
        return [json.loads(line) for line in self.call_log.read_text().splitlines()]


def install_fakes(root: Path, *, conf: Path = DATA / "nvpmodel_p3767_0003_super.conf",
                  trace: Path = DATA / "jp6_orin_nano_user_trace.log") -> FakeJetson:
    """Wrappers ``root/bin/{tegrastats,nvpmodel,jetson_clocks,trtexec}`` that run the fakes with this
    interpreter, isolated and without site (a tenth of the start-up time of ``python3`` via PATH)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for real, fake in REAL_NAMES.items():
        wrapper = bin_dir / real
        command = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(BIN / fake))}"
        wrapper.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        wrapper.chmod(0o755)
    # trtexec "builds" with tests/fake_tensorrt.py, which needs numpy and onnx: the interpreter's site stays on
    trtexec = bin_dir / "trtexec"
    command = f"{shlex.quote(sys.executable)} -I {shlex.quote(str(BIN / 'fake_trtexec'))}"
    trtexec.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    trtexec.chmod(0o755)
    return FakeJetson(bin_dir, root / "calls.jsonl", root / "nvpmodel.state", conf, trace)
