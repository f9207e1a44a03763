"""FAKE device Python for the deploy tests: ``fake_device_python.py -m MODULE ARGS`` or ``-c CODE``
runs as ``python3`` would in the remote folder (the bundle's own ``jetson`` first on the path),
with faults and fakes that the test's sshd puts in the device's environment:

- ``FAKE_DEVICE_FAIL_AFTER=N``: ONNX Runtime's inference raises a JetsonError from call N+1 on
  (a device fault in mid-benchmark);
- ``FAKE_DEVICE_SIGTERM_AFTER=N``: the process sends itself SIGTERM at inference N+1 (a deploy
  stopped in mid-run);
- ``FAKE_DEVICE_TENSORRT=1``: tests/fake_tensorrt.py's FakeTensorRT 10.3 as ``tensorrt`` and its
  FakeCudaRuntime as the CUDA binding, on an Orin Nano (``FAKE_DEVICE_SM_COUNT=16``: an AGX Orin's
  16 SMs, another device identity).
"""

import os
import runpy
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def install_faults() -> None:
    from jetson.errors import JetsonError
    from jetson.ort_backend import OrtBackend

    fail_after = int(os.environ.get("FAKE_DEVICE_FAIL_AFTER", "0"))
    sigterm_after = int(os.environ.get("FAKE_DEVICE_SIGTERM_AFTER", "0"))
    if not (fail_after or sigterm_after):
        return
    real, calls = OrtBackend.infer, [0]

    def infer(self):
        calls[0] += 1
        if fail_after and calls[0] > fail_after:
            raise JetsonError(f"fake device fault at inference {calls[0]}")
        if sigterm_after and calls[0] == sigterm_after + 1:
            os.kill(os.getpid(), signal.SIGTERM)
        real(self)

    OrtBackend.infer = infer


def install_tensorrt() -> None:
    if not os.environ.get("FAKE_DEVICE_TENSORRT"):
        return
    from jetson import cuda, device
    from tests.fake_cuda import ORIN_NANO, FakeCudaRuntime
    from tests.fake_tensorrt import make_fake_tensorrt

    sm_count = int(os.environ.get("FAKE_DEVICE_SM_COUNT", ORIN_NANO["multiProcessorCount"]))
    trt = make_fake_tensorrt("10.3", cuda=FakeCudaRuntime({**ORIN_NANO, "multiProcessorCount": sm_count}))
    sys.modules["tensorrt"] = trt
    cuda.load_cuda_runtime = lambda binding=None, log=None: trt.cuda
    model = Path(os.environ["FAKE_DEVICE_HOME"]) / "device-tree-model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00")
    device.DEVICE_TREE_MODEL = str(model)


def main(argv: list[str]) -> None:
    sys.path[0:1] = [os.getcwd()]  # as `python3 -m`/`-c`: the current folder (the bundle) first
    sys.path.append(str(REPO))     # tests.fake_* (after the bundle: its jetson is the one that runs)
    install_faults()
    install_tensorrt()
    if argv[1] == "-c":
        sys.argv = ["-c", *argv[3:]]
        exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.exit(f"fake_device_python: unsupported arguments {argv[1:]}")


if __name__ == "__main__":
    main(sys.argv)
