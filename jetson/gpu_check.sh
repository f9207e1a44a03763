#!/usr/bin/env bash
# GPU check of the device runner's CUDA layer (issue 43), for a machine with a CUDA GPU and nvcc: the CUDA
# bindings are the same API on an x86 GPU as on a Jetson, so what runs here is what the runner runs there.
#
#   OUT=/some/folder bash jetson/gpu_check.sh [--bindings cuda-python,ctypes,pycuda] [--python PY] [--record]
#   bash jetson/gpu_check.sh --dry-run      # what is there (GPU, nvcc, each binding), nothing run on the GPU
#
# Steps (each one runs even when an earlier one failed; the status is the number of failed steps, 2 when there
# is no GPU at all):
#   1. record the machine (nvidia-smi, nvcc, Python, each binding's import) into $OUT/environment.txt
#   2. build the plugin's kernel (plugins/tokenDepthwiseConv/tokenDepthwiseConvKernel.cu, its C ABI
#      tokenDepthwiseConvLaunch) with nvcc for this GPU into $OUT/libtoken_dw.so
#   3. for each binding (cuda-python, libcudart through ctypes, pycuda where it is installed or
#      $PYCUDA_SDIST builds), in a process of its own: jetson.cuda loads and probes it; the kernel is timed by
#      the runner's own code (jetson.runner.Runner._timed: warm-up by count and time, then timed calls; the
#      backend's infer() of jetson.trt_backend: CUDA events around each launch on its stream, CUDA-graph
#      capture where the binding has graphs); checked: every warm-up call left out of the GPU-event figures,
#      each call's event time within its wall time, the outputs against numpy, and the process's exit status 0
#      (pycuda aborts at exit, status 134, when a context is left on its stack)
# Results: $OUT/jetson_gpu_check.json and $OUT/jetson-gpu-check.md (with --record also
# benchmarks/results/jetson_gpu_check.json and docs/results/jetson-gpu-check.md), logs in $OUT.
# shellcheck disable=SC2329  # the step functions below are called through step()
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-/tmp/jetson-gpu-check}"
PYTHON="${PYTHON:-python3}"
BINDINGS="cuda-python,ctypes,pycuda"
DRY_RUN=0
RECORD=0

usage() {
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --record) RECORD=1 ;;
        --bindings) [ $# -ge 2 ] || { echo "gpu_check: --bindings needs a list (e.g. ctypes,pycuda)" >&2; exit 64; }
                    BINDINGS="$2"; shift ;;
        --bindings=*) BINDINGS="${1#*=}" ;;
        --python) [ $# -ge 2 ] || { echo "gpu_check: --python needs an interpreter" >&2; exit 64; }
                  PYTHON="$2"; shift ;;
        --python=*) PYTHON="${1#*=}" ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
    shift
done
IFS=, read -r -a BINDING_LIST <<< "$BINDINGS"
for binding in "${BINDING_LIST[@]}"; do
    case "$binding" in
        cuda-python|ctypes|pycuda) ;;
        *) echo "gpu_check: unknown binding $binding: expected cuda-python, ctypes or pycuda" >&2; exit 64 ;;
    esac
done
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# the GPU, or why there is none (exit 2 then, whatever else is there)
gpu_name() {
    command -v nvidia-smi > /dev/null 2>&1 || { echo "nvidia-smi not found: no NVIDIA driver on this machine"; return 1; }
    local names
    names=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>&1) \
        || { echo "nvidia-smi found no GPU: ${names}"; return 1; }
    [ -n "$names" ] || { echo "nvidia-smi lists no GPU"; return 1; }
    echo "$names" | head -n 1
}

NVCC="$(command -v nvcc || true)"
[ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; }
GPU="$(gpu_name)"
HAVE_GPU=$?
if [ "$DRY_RUN" -eq 1 ] || [ "$HAVE_GPU" -ne 0 ]; then
    echo "GPU: $GPU"
    echo "nvcc: ${NVCC:-not found}"
    echo "python: $("$PYTHON" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
    for binding in "${BINDING_LIST[@]}"; do
        echo "binding $binding: $("$PYTHON" -c "from jetson.cuda import try_cuda_binding
cudart, why = try_cuda_binding('$binding')
print('answers' if cudart is not None else f'does not answer: {why}')" 2>&1 | tail -n 1)"
    done
    if [ "$HAVE_GPU" -ne 0 ]; then
        echo "gpu_check: no GPU here ($GPU): nothing was run on a GPU; run it on a machine with one" >&2
        exit 2
    fi
    echo "gpu_check: dry run: nothing was run on the GPU"
    exit 0
fi

failed=0
step() {
    "$@"
    local status=$?
    if [ "$status" -ne 0 ]; then failed=$((failed + 1)); echo "FAILED (status $status): $*"; fi
}

environment() {
    { date -u; nvidia-smi; echo "nvcc: ${NVCC:-none}"; [ -n "$NVCC" ] && "$NVCC" --version
      "$PYTHON" -c 'import sys; print("python", sys.version)'
      for module in cuda.bindings.runtime cuda.cudart pycuda.driver numpy; do
          "$PYTHON" -c "import importlib; m = importlib.import_module('$module'); print('$module', 'imports')" 2>&1 \
              | tail -n 1
      done; } > "$OUT/environment.txt" 2>&1
}

build() {
    [ -n "$NVCC" ] || { echo "nvcc not found" > "$OUT/build.log"; return 1; }
    local sm
    sm=$(echo "$GPU" | sed 's/.*, *//; s/\.//')
    timeout 180 "$NVCC" -O3 -std=c++17 -Xcompiler -fPIC -shared -gencode "arch=compute_$sm,code=sm_$sm" \
        plugins/tokenDepthwiseConv/tokenDepthwiseConvKernel.cu -o "$OUT/libtoken_dw.so" > "$OUT/build.log" 2>&1
}

pycuda_available() {
    "$PYTHON" -c "import pycuda.driver" > /dev/null 2>&1 && return 0
    [ -n "${PYCUDA_SDIST:-}" ] || return 1
    # pycuda from its source distribution (no index here): into a folder of its own, on PYTHONPATH for the check
    timeout 600 "$PYTHON" -m pip install --no-deps --no-build-isolation --target "$OUT/pycuda-site" "$PYCUDA_SDIST" \
        > "$OUT/pycuda-build.log" 2>&1 || return 1
    export PYTHONPATH="$OUT/pycuda-site:$PYTHONPATH"
    "$PYTHON" -c "import pycuda.driver" > /dev/null 2>&1
}

check_binding() {  # one binding, in a process of its own; its exit status is part of the check
    local binding="$1"
    if [ "$binding" = pycuda ] && ! pycuda_available; then
        echo "{\"binding\": \"pycuda\", \"status\": \"skipped\", \"reason\": \"pycuda does not import and no" \
             "\$PYCUDA_SDIST built (see $OUT/pycuda-build.log)\"}" > "$OUT/binding-$binding.json"
        return 0
    fi
    timeout 300 "$PYTHON" - "$binding" "$OUT/libtoken_dw.so" "$OUT/binding-$binding.json" \
        > "$OUT/binding-$binding.log" 2>&1 <<'EOF'
"""One binding: load and probe it as the runner does, time the plugin's kernel with the runner's protocol."""
import ctypes
import json
import sys
import types

import numpy as np

from jetson.bundle import Protocol
from jetson.cuda import binding_name, check, try_cuda_binding
from jetson.interrupt import Interruptions
from jetson.runner import Measurement, Runner
from jetson.trt_backend import TensorRTEngineBackend

binding, library_path, out = sys.argv[1:4]
B, P, GRID, C, K = 8, 1, (14, 14), 384, 3
TOKENS = P + GRID[0] * GRID[1]


class KernelBackend(TensorRTEngineBackend):
    """The runner's TensorRT backend with the plugin's kernel where the engine's enqueue is: its infer() (events
    around each call), _capture() (a CUDA graph) and close() run as they are."""

    def __init__(self, cudart, library, cuda_graph: bool) -> None:
        self.cudart, self.library, self.label = cudart, library, "tokenDepthwiseConv kernel"
        self.batch, self.gpu_ms, self.buffers, self.graph_exec, self.cuda_graph_note = B, [], {}, None, None
        self.start_event = self.end_event = self.stream = None
        self.stream = check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.start_event = check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.end_event = check(cudart.cudaEventCreate(), "cudaEventCreate")
        rng = np.random.default_rng(0)
        self.host = {"input": rng.standard_normal((B, TOKENS, C)).astype(np.float32),
                     "weight": rng.standard_normal((K * K, C)).astype(np.float32),
                     "bias": rng.standard_normal(C).astype(np.float32)}
        for name, array in (*self.host.items(), ("output", np.zeros((B, TOKENS, C), np.float32))):
            self.buffers[name] = check(cudart.cudaMalloc(array.nbytes), "cudaMalloc")
            check(cudart.cudaMemcpy(self.buffers[name], array.ctypes.data, array.nbytes,
                                    cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        if cuda_graph and getattr(cudart, "captures_graphs", True):
            self.graph_exec = self._capture()
        elif cuda_graph:
            self.cuda_graph_note = f"not captured: the {binding_name(cudart)} binding has no CUDA graphs"

    def _enqueue(self) -> None:
        b = self.buffers
        code = self.library.tokenDepthwiseConvLaunch(
            ctypes.c_void_p(int(b["input"])), ctypes.c_void_p(int(b["output"])), ctypes.c_void_p(int(b["weight"])),
            ctypes.c_void_p(int(b["bias"])), None, B, P, GRID[0], GRID[1], C, K, 0, 0,
            ctypes.c_void_p(int(self.stream)))
        if code != 0:
            raise RuntimeError(f"tokenDepthwiseConvLaunch returned cudaError {code}")

    def output(self) -> np.ndarray:
        host = np.zeros((B, TOKENS, C), np.float32)
        check(self.cudart.cudaMemcpy(host.ctypes.data, self.buffers["output"], host.nbytes,
                                     self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
        return host


def reference(host: dict) -> np.ndarray:
    x, w, bias = host["input"], host["weight"].reshape(K, K, C), host["bias"]
    patches = x[:, P:].reshape(B, GRID[0], GRID[1], C)
    padded = np.pad(patches, ((0, 0), (K // 2, K // 2), (K // 2, K // 2), (0, 0)))
    out = np.zeros_like(patches) + bias
    for i in range(K):
        for j in range(K):
            out += w[i, j] * padded[:, i:i + GRID[0], j:j + GRID[1]]
    prefix = np.repeat(patches.reshape(B, -1, C).mean(axis=1, keepdims=True), P, axis=1)
    return np.concatenate([prefix, out.reshape(B, -1, C)], axis=1)


result = {"binding": binding, "status": "failed"}
cudart, why = try_cuda_binding(binding)
if cudart is None:
    result.update(status="skipped", reason=why)
else:
    library = ctypes.CDLL(library_path)
    library.tokenDepthwiseConvLaunch.restype = ctypes.c_int
    protocol = Protocol(warmup=5, warmup_s=0.2, iterations=200, duration_s=1.0, energy_duration_s=None)
    runs = {}
    for cuda_graph in (False, True):
        backend = KernelBackend(cudart, library, cuda_graph)
        try:
            runner = types.SimpleNamespace(protocol=protocol, energy_on=lambda: False, interruptions=Interruptions())
            measured = Measurement()
            Runner._timed(runner, backend, measured)  # the runner's protocol, as it times an engine
            gpu = backend.gpu_ms[measured.warmup_calls:]   # what report(warmup_calls) keeps
            timed_wall = measured.latencies_ms             # the host clock around each timed call
            error = float(np.abs(backend.output() - reference(backend.host)).max())
            runs["cuda_graph" if cuda_graph else "plain"] = {
                "captured": backend.graph_exec is not None, "note": backend.cuda_graph_note,
                "warmup_calls": measured.warmup_calls, "timed_calls": len(measured.latencies_ms),
                "first_warmup_ms": backend.gpu_ms[0] if backend.gpu_ms else None,
                "gpu_events": len(backend.gpu_ms), "gpu_events_timed": len(gpu),
                "gpu_median_ms": float(np.median(gpu)), "wall_median_ms": float(np.median(timed_wall)),
                "calls_with_event_above_wall": int(sum(g > w + 1e-3 for g, w in zip(gpu, timed_wall))),
                "max_abs_error": error}
        finally:
            backend.close()
    checks = {name: run["gpu_events"] == run["warmup_calls"] + run["timed_calls"]
              and run["gpu_events_timed"] == run["timed_calls"] and run["calls_with_event_above_wall"] == 0
              and run["gpu_median_ms"] <= run["wall_median_ms"] and run["max_abs_error"] < 1e-3
              for name, run in runs.items()}
    graph_ok = runs["cuda_graph"]["captured"] or not getattr(cudart, "captures_graphs", True)
    name = check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties").name
    result.update(status="ok" if all(checks.values()) and graph_ok else "failed", runs=runs, checks=checks,
                  gpu=name.decode(errors="replace").rstrip("\x00") if isinstance(name, bytes) else str(name))
with open(out, "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps(result, indent=1))
sys.exit(0 if result["status"] in ("ok", "skipped") else 1)
EOF
    local status=$?
    "$PYTHON" - "$OUT/binding-$binding.json" "$status" <<'EOF'
import json, sys
path, status = sys.argv[1], int(sys.argv[2])
try:
    result = json.load(open(path))
except (OSError, ValueError):
    result = {"binding": path.rsplit("binding-", 1)[-1][:-5], "status": "failed", "reason": "no result written"}
result["exit_status"] = status  # 0 expected: 134 is an abort at exit (pycuda's context stack)
if status != 0 and result.get("status") == "ok":
    result["status"] = "failed"
json.dump(result, open(path, "w"), indent=1)
EOF
    [ "$status" -eq 0 ]
}

summary() {
    "$PYTHON" - "$OUT" "$GPU" "${BINDING_LIST[@]}" <<'EOF'
import json, sys
from pathlib import Path
out, gpu, bindings = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
results = [json.loads((out / f"binding-{b}.json").read_text()) if (out / f"binding-{b}.json").is_file()
           else {"binding": b, "status": "failed", "reason": "not run"} for b in bindings]
(out / "jetson_gpu_check.json").write_text(json.dumps({"gpu": gpu, "bindings": results}, indent=1) + "\n")
lines = [f"# The runner's CUDA layer on {gpu}", "", "| binding | status | exit | plain: GPU / wall median (ms) | "
         "CUDA graph: GPU / wall median (ms) | warm-up left out |", "|---|---|---|---|---|---|"]
for r in results:
    runs = r.get("runs", {})
    cell = lambda k: (f"{runs[k]['gpu_median_ms']:.4f} / {runs[k]['wall_median_ms']:.4f}"
                      + ("" if runs[k]["captured"] or k == "plain" else " (not captured)")) if k in runs else "-"
    left_out = all(v["gpu_events_timed"] == v["timed_calls"] for v in runs.values()) if runs else "-"
    lines.append(f"| {r['binding']} | {r['status']} {r.get('reason') or ''} | {r.get('exit_status', '-')} | "
                 f"{cell('plain')} | {cell('cuda_graph')} | {left_out} |")
(out / "jetson-gpu-check.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
}

step environment
step build
for binding in "${BINDING_LIST[@]}"; do
    step check_binding "$binding"
done
step summary
if [ "$RECORD" -eq 1 ]; then
    cp "$OUT/jetson_gpu_check.json" benchmarks/results/ && cp "$OUT/jetson-gpu-check.md" docs/results/
fi
exit "$failed"
