"""Build the plugins' shared library with nvcc and call its C ABI from Python (tests and benchmarks).

No CMake needed: :func:`build_library` runs one nvcc command over :data:`KERNEL_SOURCES` (the CUDA
kernels only; the TensorRT wrappers need TensorRT's headers and are built by ``plugins/CMakeLists.txt``).
:func:`load_library` opens the library with ctypes and declares its C functions;
:func:`token_depthwise_conv` runs ``tokenDepthwiseConvLaunch`` on torch CUDA tensors on torch's
current stream. torch is imported only by that function: building and loading need neither.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

PLUGINS = Path(__file__).resolve().parent
KERNEL_SOURCES = (PLUGINS / "tokenDepthwiseConv" / "tokenDepthwiseConvKernel.cu",)
LIBRARY_NAME = "libedge_plugins.so"
PREFIX_MODES = ("mean", "pool")          # TokenDepthwisePrefixMode: the index is the C value
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-shared")


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda; None when there is none."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def arch_flags(archs: tuple[str, ...]) -> list[str]:
    """``("87", "90")`` -> one ``-gencode`` per SM (real code, no PTX: each target is named)."""
    return [flag for sm in archs for flag in ("-gencode", f"arch=compute_{sm},code=sm_{sm}")]


def build_library(output: str | Path, archs: tuple[str, ...] = ("87", "90")) -> Path:
    """Compile every kernel into ``output`` (a shared library, cudart linked statically); returns its path.

    Raises RuntimeError with nvcc's messages when nvcc is missing or the build fails.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): install the CUDA toolkit")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    command = [nvcc, *NVCC_FLAGS, *arch_flags(archs), *map(str, KERNEL_SOURCES), "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(command)}):\n{result.stderr}")
    partial.replace(output)
    return output


def load_library(path: str | Path) -> ctypes.CDLL:
    """Open the shared library and declare ``tokenDepthwiseConvLaunch``'s C signature."""
    library = ctypes.CDLL(str(path))
    launch = library.tokenDepthwiseConvLaunch
    launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    launch.restype = ctypes.c_int
    return library


def _pointer(tensor) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _float32_on(tensor, device):
    import torch

    return None if tensor is None else tensor.detach().to(device=device, dtype=torch.float32).contiguous()


def bind_token_depthwise_conv(library: ctypes.CDLL, tokens, out, weight, bias=None, *, grid: tuple[int, int],
                              prefix_tokens: int = 0, prefix_mode: str = "mean", prefix_weights=None):
    """A no-argument function that enqueues the kernel from ``tokens`` into ``out`` on torch's current stream.

    Arguments are checked and converted once: weights to fp32 on the tokens' device, ``weight`` from
    PyTorch's ``[C, 1, k, k]`` (or ``[C, k, k]``) to the kernel's tap-major ``[k*k, C]``. Repeated calls
    then cost one ctypes call each (benchmarks, CUDA graph capture). The function returns nothing and
    raises RuntimeError on a non-zero cudaError_t.
    """
    import torch

    dtypes = {torch.float32: 0, torch.float16: 1}
    for name, tensor in (("tokens", tokens), ("out", out)):
        if not tensor.is_cuda or not tensor.is_contiguous() or tensor.dtype not in dtypes:
            raise ValueError(f"{name}: expected a contiguous float32/float16 CUDA tensor, got {tensor.dtype} "
                             f"on {tensor.device} (contiguous={tensor.is_contiguous()})")
    if out.shape != tokens.shape or out.dtype != tokens.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype}: expected {tuple(tokens.shape)} {tokens.dtype}")
    batch, _, channels = tokens.shape
    k = weight.shape[-1]
    tap_major = weight.reshape(channels, k * k).t()     # PyTorch's [C, 1, k, k] -> the kernel's [k*k, C]
    kept = [_float32_on(tap_major, tokens.device), _float32_on(bias, tokens.device),
            _float32_on(prefix_weights, tokens.device) if prefix_mode == "pool" and prefix_tokens else None]
    stream = torch.cuda.current_stream(tokens.device).cuda_stream
    arguments = (tokens.data_ptr(), out.data_ptr(), *map(_pointer, kept), batch, prefix_tokens, grid[0], grid[1],
                 channels, k, PREFIX_MODES.index(prefix_mode), dtypes[tokens.dtype], stream)
    launch = library.tokenDepthwiseConvLaunch

    def enqueue() -> None:
        code = launch(*arguments)
        if code != 0:
            raise RuntimeError(f"tokenDepthwiseConvLaunch returned cudaError_t {code} for tokens "
                               f"{tuple(tokens.shape)}, grid {grid}, k={k}, P={prefix_tokens}, "
                               f"prefix_mode={prefix_mode}")

    enqueue.keep_alive = (tokens, out, kept)   # the pointers stay valid as long as the function lives
    return enqueue


def token_depthwise_conv(library: ctypes.CDLL, tokens, weight, bias=None, *, grid: tuple[int, int],
                         prefix_tokens: int = 0, prefix_mode: str = "mean", prefix_weights=None):
    """The kernel's output for ``tokens`` (contiguous fp32/fp16 CUDA ``[B, P + H*W, C]``, layouts of reference.py)."""
    import torch

    out = torch.empty_like(tokens)
    bind_token_depthwise_conv(library, tokens, out, weight, bias, grid=grid, prefix_tokens=prefix_tokens,
                              prefix_mode=prefix_mode, prefix_weights=prefix_weights)()
    return out
