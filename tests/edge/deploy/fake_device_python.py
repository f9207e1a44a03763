"""FAKE device Python for the deploy tests: ``fake_device_python.py -m MODULE ARGS``, ``-c CODE`` or
``FILE ARGS`` (a zip, as ``edge deploy --check`` sends) runs as ``python3`` would in the remote folder
(the bundle's own ``jetson`` first on the path, or the zip's), with faults and fakes that the test's
sshd puts in the device's environment:

- ``FAKE_DEVICE_FAIL_AFTER=N``: ONNX Runtime's inference raises a JetsonError from call N+1 on
  (a device fault in mid-benchmark);
- ``FAKE_DEVICE_SIGTERM_AFTER=N``: the process sends itself SIGTERM at inference N+1 (a deploy
  stopped in mid-run);
- ``FAKE_DEVICE_PAUSE_AT=N``: at inference N+1 the runner creates ``FAKE_DEVICE_HOME/paused`` and waits
  until that file is removed (a test does something mid-benchmark, e.g. kills the SSH client);
- ``FAKE_DEVICE_TENSORRT=1``: tests/fake_tensorrt.py's FakeTensorRT 10.3 as ``tensorrt`` and its
  FakeCudaRuntime as the CUDA binding, on an Orin Nano (``FAKE_DEVICE_SM_COUNT=16``: an AGX Orin's
  16 SMs, another device identity);
- ``FAKE_DEVICE_CUDA_PYTHON=broken``: a cuda-python that imports and fails at its first call with
  cudaErrorInsufficientDriver (35), as cuda-python 13 does on JetPack 6's CUDA 12.6 driver; the CUDA
  bindings are then loaded as on a device (no FakeCudaRuntime);
- ``FAKE_DEVICE_NV_TEGRA_RELEASE=FILE``, ``FAKE_DEVICE_MEMINFO=FILE``: the device's /etc/nv_tegra_release
  and /proc/meminfo (jetson.device, jetson.check read these files instead).
"""

import enum
import os
import runpy
import signal
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def install_faults() -> None:
    from jetson.errors import JetsonError
    from jetson.ort_backend import OrtBackend

    fail_after = int(os.environ.get("FAKE_DEVICE_FAIL_AFTER", "0"))
    sigterm_after = int(os.environ.get("FAKE_DEVICE_SIGTERM_AFTER", "0"))
    pause_at = int(os.environ.get("FAKE_DEVICE_PAUSE_AT", "0"))
    if not (fail_after or sigterm_after or pause_at):
        return
    real, calls = OrtBackend.infer, [0]

    def infer(self):
        calls[0] += 1
        if fail_after and calls[0] > fail_after:
            raise JetsonError(f"fake device fault at inference {calls[0]}")
        if sigterm_after and calls[0] == sigterm_after + 1:
            os.kill(os.getpid(), signal.SIGTERM)
        if pause_at and calls[0] == pause_at + 1:
            marker = Path(os.environ["FAKE_DEVICE_HOME"]) / "paused"
            marker.touch()
            while marker.exists():
                time.sleep(0.02)
        real(self)

    OrtBackend.infer = infer


def install_files() -> None:
    from jetson import check, device

    if os.environ.get("FAKE_DEVICE_NV_TEGRA_RELEASE"):
        device.NV_TEGRA_RELEASE = os.environ["FAKE_DEVICE_NV_TEGRA_RELEASE"]
    if os.environ.get("FAKE_DEVICE_MEMINFO"):
        check.MEMINFO = os.environ["FAKE_DEVICE_MEMINFO"]


class _CudaError(enum.IntEnum):
    cudaErrorInsufficientDriver = 35


def install_broken_cuda_python() -> bool:
    """A FAKE cuda-python (``cuda.bindings.runtime``) whose every call answers cudaErrorInsufficientDriver."""
    if os.environ.get("FAKE_DEVICE_CUDA_PYTHON") != "broken":
        return False
    runtime = types.ModuleType("cuda.bindings.runtime")
    runtime.__getattr__ = lambda name: (lambda *args: (_CudaError.cudaErrorInsufficientDriver, None))
    package, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    package.__path__, bindings.__path__ = [], []
    package.bindings, bindings.runtime = bindings, runtime
    sys.modules.update({"cuda": package, "cuda.bindings": bindings, "cuda.bindings.runtime": runtime})
    return True


def install_tensorrt() -> None:
    if not os.environ.get("FAKE_DEVICE_TENSORRT"):
        return
    from jetson import cuda, device
    from tests.fake_cuda import ORIN_NANO, FakeCudaRuntime
    from tests.fake_tensorrt import make_fake_tensorrt

    sm_count = int(os.environ.get("FAKE_DEVICE_SM_COUNT", ORIN_NANO["multiProcessorCount"]))
    trt = make_fake_tensorrt("10.3", cuda=FakeCudaRuntime({**ORIN_NANO, "multiProcessorCount": sm_count}))
    sys.modules["tensorrt"] = trt
    if not install_broken_cuda_python():  # every binding answers through the fake runtime
        cuda.load_cuda_runtime = lambda binding=None, log=None: trt.cuda
        cuda.try_cuda_binding = lambda name: (trt.cuda, None)
    model = Path(os.environ["FAKE_DEVICE_HOME"]) / "device-tree-model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00")
    device.DEVICE_TREE_MODEL = str(model)


def main(argv: list[str]) -> None:
    runs_file = argv[1] not in ("-c", "-m")
    sys.path[0:1] = [argv[1] if runs_file else os.getcwd()]  # as python3: the zip, or the current folder first
    sys.path.append(str(REPO))     # tests.fake_* (after the bundle: its jetson is the one that runs)
    install_faults()
    install_files()
    install_broken_cuda_python()
    install_tensorrt()
    if runs_file:
        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")
    elif argv[1] == "-c":
        sys.argv = ["-c", *argv[3:]]
        exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
