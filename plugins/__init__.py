"""TensorRT plugins of edge: CUDA kernels behind a C ABI, their references, and a loader for tests.

Not part of the installed ``edge`` package: plugins are built with nvcc or CMake (``plugins/CMakeLists.txt``)
on the machine that runs them. Importing this package needs neither a GPU nor CUDA.
"""
