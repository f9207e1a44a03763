"""The token-layout depthwise plugin: its numpy reference against edge's DepthwiseAttention, nvcc builds, GPU runs.

* CPU: ``plugins/tokenDepthwiseConv/reference.py`` equals the mixer of :class:`DepthwiseAttention`
  (the input of its output projection) for prefix modes mean, pool and drop, k = 3 and 5, P = 0, 1, 4.
* nvcc: the kernel compiles for sm_87 (Orin) and sm_90 (H100/H200); skipped without nvcc. With TensorRT's
  headers (``TENSORRT_INCLUDE_DIR``, or the system paths) the IPluginV3 wrapper's host-side checks
  (``token_depthwise_plugin_check.cpp``: fields, validation, formats, serialize round trip) build and pass.
* GPU (marker ``gpu``): the shared library built for the present GPU equals the PyTorch layout round trip
  (``torch_mixer.py``, run in float64) within 1e-5 (fp32) and 1e-3 (fp16), relative to the largest output.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from edge.compress.methods.dwconv.module import DepthwiseAttention
from plugins import loader
from plugins.tokenDepthwiseConv.reference import token_depthwise_conv
from plugins.tokenDepthwiseConv.torch_mixer import token_depthwise_conv_torch

# fp32 against a float64 truth: sums of at most 25 products and 200 pooled tokens round below 1e-6 of the
# largest output; fp16 outputs round at 2^-11 (4.9e-4) of their magnitude, accumulation is fp32.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3}


def random_mixer(prefix: str, prefix_tokens: int, k: int, grid: tuple[int, int], variant: str = "unensembled",
                 conv_heads: tuple[int, ...] = (0, 1, 2), seed: int = 0):
    """A DepthwiseAttention (3 heads of 8 channels) with every parameter and buffer random."""
    torch.manual_seed(seed)
    module = DepthwiseAttention(24, 3, 8, conv_heads, grid, prefix_tokens, k, variant, prefix)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point():
                tensor.normal_(0.0, 0.5)
    return module.eval()


def mixer_output(module, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(V of every token, the conv heads' columns of the output projection's input) of ``module(x)``."""
    seen = {}
    hook = module.proj.register_forward_pre_hook(lambda _, args: seen.setdefault("mixed", args[0]))
    with torch.no_grad():
        module(x)
        values = module.value(x)
    hook.remove()
    return values.numpy(), seen["mixed"][..., -module.conv_width:].numpy()


def reference_of(module, values: np.ndarray) -> np.ndarray:
    conv = module.conv
    pool = getattr(module, "prefix_weights", None)
    mode = "pool" if module.prefix == "pool" else "mean"
    return token_depthwise_conv(values, conv.weight.detach().numpy(), conv.bias.detach().numpy(),
                                grid=module.grid, prefix_tokens=module.num_prefix_tokens, prefix_mode=mode,
                                prefix_weights=None if pool is None else pool.numpy())


@pytest.mark.parametrize("prefix, prefix_tokens", [("mean", 0), ("mean", 1), ("mean", 4), ("pool", 1),
                                                   ("pool", 4), ("drop", 1)])
@pytest.mark.parametrize("k", [3, 5])
def test_reference_equals_depthwise_attention(prefix, prefix_tokens, k):
    grid = (5, 6)   # not square: rows and columns must not be swapped
    module = random_mixer(prefix, prefix_tokens, k, grid)
    p = module.num_prefix_tokens     # 0 for prefix=drop: the model has no prefix tokens left
    x = torch.randn(2, p + grid[0] * grid[1], 24)
    values, mixed = mixer_output(module, x)
    np.testing.assert_allclose(reference_of(module, values), mixed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant, conv_heads", [("ensembled", (0, 1, 2)), ("unensembled", (0, 2))])
def test_reference_equals_other_variants(variant, conv_heads):
    """Ensembled heads and a scattered selection (head 1 keeps attention) convolve the same way."""
    module = random_mixer("pool", 1, 3, (4, 4), variant, conv_heads)
    values, mixed = mixer_output(module, torch.randn(3, 17, 24))
    np.testing.assert_allclose(reference_of(module, values), mixed, rtol=1e-5, atol=1e-5)


def test_reference_refuses_an_even_kernel():
    with pytest.raises(ValueError, match="odd k"):
        token_depthwise_conv(np.zeros((1, 17, 4), np.float32), np.zeros((4, 2, 2)), grid=(4, 4), prefix_tokens=1)


# ---- nvcc --------------------------------------------------------------------------------------------------
NVCC = loader.find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda): no CUDA toolkit")
@pytest.mark.parametrize("sm", ["90"])   # sm_87 (the Orin): tests/jetson/test_plugin_build.py compiles it with the
def test_kernel_compiles(sm, tmp_path):    # runner's own command line (20 s of nvcc each: not twice)
    source = loader.KERNEL_SOURCES[0]
    result = subprocess.run([NVCC, f"-arch=sm_{sm}", "-O3", "-std=c++17", "-c", str(source),
                             "-o", str(tmp_path / "kernel.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kernel.o").stat().st_size > 0


def tensorrt_include_dir() -> Path | None:
    """TensorRT's headers: $TENSORRT_INCLUDE_DIR, else where JetPack and NVIDIA's Debian packages put them."""
    candidates = [os.environ.get("TENSORRT_INCLUDE_DIR", ""), "/usr/include/x86_64-linux-gnu",
                  "/usr/include/aarch64-linux-gnu", "/usr/include", "/usr/local/tensorrt/include"]
    return next((Path(c) for c in candidates if c and (Path(c) / "NvInferRuntime.h").is_file()), None)


TENSORRT_INCLUDE = tensorrt_include_dir()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda): no CUDA toolkit")
@pytest.mark.skipif(TENSORRT_INCLUDE is None, reason="TensorRT's headers not found (NvInferRuntime.h): set "
                    "TENSORRT_INCLUDE_DIR to a TensorRT include folder (e.g. NVIDIA/TensorRT's include/ at v10.3.0)")
def test_plugin_wrapper_host_checks(tmp_path):
    plugins = Path(loader.PLUGINS)
    sources = [Path(__file__).with_name("token_depthwise_plugin_check.cpp"),
               plugins / "tokenDepthwiseConv" / "tokenDepthwiseConvPlugin.cpp", plugins / "edgePlugins.cpp",
               *loader.KERNEL_SOURCES]
    binary = tmp_path / "plugin_check"
    build = subprocess.run([NVCC, "-std=c++17", "-arch=sm_87", "-isystem", str(TENSORRT_INCLUDE),
                            f"-I{plugins / 'tokenDepthwiseConv'}", *map(str, sources), "-o", str(binary)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("0 failed"), run.stdout + run.stderr


# ---- GPU ---------------------------------------------------------------------------------------------------
def gpu_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    if NVCC is None:
        return "nvcc not found: the plugin library cannot be built"
    return None


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    major, minor = torch.cuda.get_device_capability()
    path = loader.build_library(tmp_path_factory.mktemp("plugins") / loader.LIBRARY_NAME, (f"{major}{minor}",))
    return loader.load_library(path)


def random_case(dtype, batch, prefix_tokens, grid, channels, k, mode, seed=0):
    """Tokens in ``dtype`` on the GPU, fp32 weights, bias and (pool) prefix weights."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randn(batch, prefix_tokens + grid[0] * grid[1], channels, generator=g).to("cuda", dtype)
    weight = torch.randn(channels, 1, k, k, generator=g).cuda()
    bias = torch.randn(channels, generator=g).cuda()
    pool = torch.rand(prefix_tokens, tokens.shape[1], channels, generator=g).cuda() if mode == "pool" else None
    return tokens, weight, bias, pool


def relative_error(out: torch.Tensor, truth: torch.Tensor) -> float:
    return ((out.double() - truth).abs().max() / truth.abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch, prefix_tokens, grid, channels, k, mode", [
    (1, 1, (7, 7), 192, 3, "mean"),
    (2, 1, (14, 14), 768, 3, "pool"),
    (3, 0, (5, 6), 40, 5, "mean"),
    (2, 4, (6, 5), 24, 5, "pool"),
    (2, 4, (4, 4), 8, 3, "mean"),
    (1, 1, (9, 9), 12, 9, "pool"),     # k = 9: the generic (not unrolled) kernel
    (2, 1, (4, 5), 7, 3, "mean"),      # odd C: scalar channel packs
    (1, 1, (52, 52), 8, 3, "pool"),    # 2705 tokens: a grid far beyond ViT sizes, a long prefix reduction
    (2, 2, (52, 52), 8, 5, "mean"),
])
def test_kernel_equals_pytorch(library, dtype, batch, prefix_tokens, grid, channels, k, mode):
    tokens, weight, bias, pool = random_case(dtype, batch, prefix_tokens, grid, channels, k, mode)
    out = loader.token_depthwise_conv(library, tokens, weight, bias, grid=grid, prefix_tokens=prefix_tokens,
                                      prefix_mode=mode, prefix_weights=pool)
    truth = token_depthwise_conv_torch(tokens.double(), weight.double(), bias.double(), grid=grid,
                                       prefix_tokens=prefix_tokens, prefix_mode=mode,
                                       prefix_weights=None if pool is None else pool.double())
    torch.cuda.synchronize()
    assert out.dtype == dtype
    assert relative_error(out, truth) <= TOLERANCE[dtype]


@pytest.mark.gpu
def test_kernel_equals_the_numpy_reference(library):
    tokens, weight, bias, pool = random_case(torch.float32, 2, 1, (7, 7), 64, 3, "pool", seed=1)
    out = loader.token_depthwise_conv(library, tokens, weight, bias, grid=(7, 7), prefix_tokens=1,
                                      prefix_mode="pool", prefix_weights=pool).cpu().numpy()
    expected = token_depthwise_conv(tokens.cpu().numpy(), weight.cpu().numpy(), bias.cpu().numpy(), grid=(7, 7),
                                    prefix_tokens=1, prefix_mode="pool", prefix_weights=pool.cpu().numpy())
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_kernel_refuses_an_even_kernel(library):
    tokens, weight, _, _ = random_case(torch.float32, 1, 0, (4, 4), 8, 3, "mean")
    with pytest.raises(RuntimeError, match="cudaError_t 1 "):   # cudaErrorInvalidValue
        loader.token_depthwise_conv(library, tokens, weight[..., :2, :2], grid=(4, 4))
