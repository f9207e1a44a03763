"""edge: make Vision Transformers fast on NVIDIA Jetson Orin Nano.

The library is organised by pipeline step (``edge.data``, ``edge.models``, ``edge.train``,
``edge.check.accuracy``, ...); the ``edge`` command line is a thin layer over it (``edge.cli``).
Importing :mod:`edge` is cheap and needs neither a GPU nor TensorRT.
"""

__version__ = "0.1.0"
