"""FAKE device Python for tests that signal or disconnect a real runner process: ``run_on_fakes.py ARGS`` runs
``python3 -m jetson ARGS`` (this repository's jetson) with FakeTensorRT 10.3 (tests/fake_tensorrt.py) as
``tensorrt`` and its FakeCudaRuntime as the CUDA binding, on an Orin Nano:

- ``FAKE_BUILD_SECONDS``: each engine build lasts that long (steps reported to the progress monitor, signals
  held back from Python between TensorRT's callbacks, as in the real bindings);
- ``FAKE_DEVICE_TREE_MODEL``: the file read as /proc/device-tree/model.
"""

import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    sys.path.insert(0, str(REPO))
    from jetson import cuda, device
    from tests.fake_tensorrt import make_fake_tensorrt

    trt = make_fake_tensorrt("10.3", build_seconds=float(os.environ.get("FAKE_BUILD_SECONDS", "0")))
    sys.modules["tensorrt"] = trt
    cuda.load_cuda_runtime = lambda binding=None, log=None: trt.cuda
    device.DEVICE_TREE_MODEL = os.environ["FAKE_DEVICE_TREE_MODEL"]
    sys.argv = ["jetson", *sys.argv[1:]]
    runpy.run_module("jetson", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
