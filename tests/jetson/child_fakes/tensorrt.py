"""FAKE ``tensorrt`` for the child processes of a test: the device runner builds each engine in a fresh
interpreter (jetson.build_process), which sees neither a test's monkeypatched ``sys.modules`` nor a
wrapper's. With this folder and the repository on its PYTHONPATH (tests.jetson.fakes.child_fakes_path),
``import tensorrt`` there gives tests/fake_tensorrt.py's FakeTensorRT:

- ``FAKE_TENSORRT_FEATURES``: its feature set (``10.3``, the default, or ``11.0``);
- ``FAKE_BUILD_SECONDS``: each build lasts that long (see make_fake_tensorrt);
- ``FAKE_TENSORRT_OUT_OF_MEMORY``: builds that run out of memory (tests.fake_tensorrt.OUT_OF_MEMORY_VARIABLE).
"""

import os
import sys

from tests.fake_tensorrt import make_fake_tensorrt

sys.modules[__name__] = make_fake_tensorrt(os.environ.get("FAKE_TENSORRT_FEATURES", "10.3"),
                                           build_seconds=float(os.environ.get("FAKE_BUILD_SECONDS", "0")))
