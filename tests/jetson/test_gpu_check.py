"""jetson/gpu_check.sh where no GPU is: its arguments, its refusal without a GPU, and its per-binding program run
against the FAKE libcudart (tests/jetson/fake_libcudart.c, host memory) with a host stand-in of the plugin kernel's
C ABI (tokenDepthwiseConvLaunch, plugins/tokenDepthwiseConv/tokenDepthwiseConvKernel.h), so that the program a
lent GPU runs is known to run through: the runner's protocol, warm-up left out, event time against wall time."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "jetson" / "gpu_check.sh"
# the plugin kernel's C ABI over host memory (the fake libcudart's "device" memory is host memory): mean prefix,
# float32, the same maths as the CUDA kernel
HOST_KERNEL = r"""
#include <string.h>
int tokenDepthwiseConvLaunch(const void* input, void* output, const float* weight, const float* bias,
                             const float* prefixWeights, int batch, int prefixTokens, int gridH, int gridW,
                             int channels, int kernelSize, int prefixMode, int dataType, void* stream) {
    const float* in = (const float*)input; float* out = (float*)output;
    int tokens = prefixTokens + gridH * gridW, half = kernelSize / 2;
    if (prefixMode != 0 || dataType != 0 || prefixWeights || !stream) return 1;
    for (int b = 0; b < batch; ++b) {
        const float* x = in + (long)b * tokens * channels; float* y = out + (long)b * tokens * channels;
        for (int c = 0; c < channels; ++c) {
            double mean = 0;
            for (int n = prefixTokens; n < tokens; ++n) mean += x[n * channels + c];
            for (int p = 0; p < prefixTokens; ++p) y[p * channels + c] = (float)(mean / (gridH * gridW));
            for (int r = 0; r < gridH; ++r) for (int q = 0; q < gridW; ++q) {
                float sum = bias ? bias[c] : 0.0f;
                for (int i = 0; i < kernelSize; ++i) for (int j = 0; j < kernelSize; ++j) {
                    int rr = r + i - half, qq = q + j - half;
                    if (rr < 0 || qq < 0 || rr >= gridH || qq >= gridW) continue;
                    sum += weight[(i * kernelSize + j) * channels + c]
                           * x[(prefixTokens + rr * gridW + qq) * channels + c];
                }
                y[(prefixTokens + r * gridW + q) * channels + c] = sum;
            }
        }
    }
    return 0;
}
"""


def run_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, **(env or {})})


def test_without_a_gpu_it_says_so_and_exits_2(tmp_path):
    done = run_script("--bindings", "ctypes", env={"OUT": str(tmp_path / "out")})
    assert done.returncode == 2
    assert "gpu_check: no GPU here (nvidia-smi not found" in done.stderr and "nothing was run on a GPU" in done.stderr
    assert "binding ctypes:" in done.stdout  # what is there is listed all the same
    assert run_script("--dry-run").returncode == 2


@pytest.mark.parametrize("args, says", [(["--bindings", "opencl"], "unknown binding opencl"),
                                        (["--frobnicate"], "unknown argument --frobnicate"),
                                        (["--python"], "--python needs an interpreter")])
def test_bad_arguments_are_named(args, says):
    done = run_script(*args)
    assert done.returncode == 64 and says in done.stderr


def test_help_prints_the_header():
    done = run_script("--help")
    assert done.returncode == 0 and "--dry-run" in done.stdout and "jetson_gpu_check.json" in done.stdout


def binding_program() -> str:
    """The per-binding Python program of the script (its heredoc)."""
    text = SCRIPT.read_text()
    match = re.search(r'binding-\$binding\.log" 2>&1 <<\'EOF\'\n(.*?)\nEOF\n', text, re.S)
    assert match, "the per-binding program of jetson/gpu_check.sh"
    return match.group(1)


def test_the_per_binding_program_runs_through_on_the_fake_libcudart(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc)")
    cudart = tmp_path / "libcudart_fake.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(cudart),
                    str(REPO / "tests/jetson/fake_libcudart.c")], check=True, timeout=120)
    (tmp_path / "kernel.c").write_text(HOST_KERNEL)
    kernel = tmp_path / "libtoken_dw.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(kernel), str(tmp_path / "kernel.c")], check=True,
                   timeout=120)
    program = tmp_path / "binding.py"
    program.write_text(binding_program())
    result = tmp_path / "binding-ctypes.json"
    # the ctypes binding finds the fake libcudart (the real one, where installed, is not looked for)
    start = (f"import ctypes.util, runpy, sys\nctypes.util.find_library = lambda name: None\n"
             f"import jetson.cudart\njetson.cudart.LIBRARY_NAMES = ({str(cudart)!r},)\n"
             f"sys.argv = ['binding.py', 'ctypes', {str(kernel)!r}, {str(result)!r}]\n"
             f"runpy.run_path({str(program)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "FAKE_CUDART_GRAPH_LAUNCH_MS": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(result.read_text())
    assert found["status"] == "ok" and found["gpu"] == "Orin", found
    for name, run in found["runs"].items():
        assert run["gpu_events"] == run["warmup_calls"] + run["timed_calls"], name  # one event pair per call
        assert run["gpu_events_timed"] == run["timed_calls"] >= 200 and run["warmup_calls"] >= 5
        assert run["max_abs_error"] < 1e-3 and run["calls_with_event_above_wall"] == 0
    assert found["runs"]["cuda_graph"]["captured"] is True and found["runs"]["plain"]["captured"] is False
