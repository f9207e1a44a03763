#!/usr/bin/env bash
# GPU check of the plugins, for a machine with a CUDA GPU, nvcc and torch (no CMake, no internet needed).
#
#   OUT=/some/folder bash plugins/gpu_check.sh
#
# Steps (each one runs even when an earlier one failed; the script's status is the number of failed steps):
#   1. record the machine (nvidia-smi, nvcc, torch, pytest, cmake) into $OUT/environment.txt
#   2. build plugins/build/libedge_plugins.so with nvcc for this GPU's SM, and compile the kernel for sm_87
#   3. tests/plugins/test_token_depthwise.py with pytest, GPU tests included (or, without pytest, a few
#      GPU cases through plugins/loader.py with the same tolerances)
#   4. benchmarks/token_depthwise.py with the library of step 2
# Logs and results land in $OUT: environment.txt, build.log, tests.log (+ junit.xml), benchmark.log,
# token_depthwise.json, token-depthwise.md. Total well under 4 minutes on an H100/H200.
# shellcheck disable=SC2329  # the step functions below are called through step()
set -x
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-/tmp/plugins-gpu-check}"
mkdir -p "$OUT" plugins/build
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python}"
failed=0
step() {
    "$@"
    local status=$?
    if [ "$status" -ne 0 ]; then failed=$((failed + 1)); echo "FAILED (status $status): $*"; fi
}

environment() {
    { date -u; nvidia-smi; command -v nvcc && nvcc --version; command -v cmake && cmake --version | head -1
      "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)
print('gpu', torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
      "$PYTHON" -m pytest --version; } > "$OUT/environment.txt" 2>&1
}

build() {
    local sm
    sm=$("$PYTHON" -c "import torch; print('%d%d' % torch.cuda.get_device_capability())") || sm=90
    timeout 120 nvcc -O3 -std=c++17 -Xcompiler -fPIC -shared -gencode "arch=compute_$sm,code=sm_$sm" \
        plugins/tokenDepthwiseConv/tokenDepthwiseConvKernel.cu -o plugins/build/libedge_plugins.so \
        -Xptxas -v > "$OUT/build.log" 2>&1 || return 1
    timeout 60 nvcc -O3 -std=c++17 -arch=sm_87 -c plugins/tokenDepthwiseConv/tokenDepthwiseConvKernel.cu \
        -o plugins/build/tokenDepthwiseConvKernel.sm_87.o >> "$OUT/build.log" 2>&1
}

tests_without_pytest() {
    timeout 120 "$PYTHON" - <<'EOF'
import torch
from plugins import loader
from plugins.tokenDepthwiseConv.torch_mixer import token_depthwise_conv_torch
library = loader.load_library("plugins/build/libedge_plugins.so")
worst = 0.0
for dtype, tolerance in ((torch.float32, 1e-5), (torch.float16, 1e-3)):
    for b, p, grid, c, k, mode in ((1, 1, (7, 7), 192, 3, "mean"), (2, 1, (14, 14), 768, 3, "pool"),
                                   (2, 4, (6, 5), 24, 5, "pool"), (1, 1, (9, 9), 12, 9, "pool"),
                                   (2, 1, (4, 5), 7, 3, "mean"), (1, 1, (52, 52), 8, 3, "pool")):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(b, p + grid[0] * grid[1], c, generator=g).to("cuda", dtype)
        w, bias = torch.randn(c, 1, k, k, generator=g).cuda(), torch.randn(c, generator=g).cuda()
        pool = torch.rand(p, x.shape[1], c, generator=g).cuda() if mode == "pool" else None
        out = loader.token_depthwise_conv(library, x, w, bias, grid=grid, prefix_tokens=p, prefix_mode=mode,
                                          prefix_weights=pool)
        truth = token_depthwise_conv_torch(x.double(), w.double(), bias.double(), grid=grid, prefix_tokens=p,
                                           prefix_mode=mode, prefix_weights=None if pool is None else pool.double())
        error = ((out.double() - truth).abs().max() / truth.abs().max()).item()
        print(dtype, b, p, grid, c, k, mode, f"relative error {error:.2e}", "ok" if error <= tolerance else "FAIL")
        assert error <= tolerance
EOF
}

run_tests() {
    if "$PYTHON" -m pytest --version > /dev/null 2>&1; then
        timeout 150 "$PYTHON" -m pytest -v -p no:cacheprovider -o addopts="-ra" -m "gpu or not gpu" \
            --junitxml="$OUT/junit.xml" tests/plugins/test_token_depthwise.py > "$OUT/tests.log" 2>&1
    else
        echo "pytest is not installed: running GPU cases through plugins/loader.py" > "$OUT/tests.log"
        tests_without_pytest >> "$OUT/tests.log" 2>&1
    fi
}

benchmark() {
    timeout 150 "$PYTHON" benchmarks/token_depthwise.py --library plugins/build/libedge_plugins.so \
        > "$OUT/benchmark.log" 2>&1
    local status=$?
    cp benchmarks/results/token_depthwise.json docs/results/token-depthwise.md "$OUT/"
    return "$status"
}

step environment
step build
step run_tests
step benchmark
tail -n 30 "$OUT/tests.log" "$OUT/benchmark.log"
cat "$OUT/token-depthwise.md"
exit "$failed"
