/* FAKE libcudart for tests of jetson/cudart.py: NOT CUDA. The CUDA runtime entry points the ctypes
 * binding calls, with CUDA's C signatures, over host memory: "device" memory is malloc'd, streams and
 * events are counters, an event's time is the number of fake_launch calls before it was recorded.
 * Error codes and names are CUDA's own (cudaErrorInvalidValue = 1, cudaErrorInvalidResourceHandle =
 * 400). Compiled by tests/jetson/test_cudart.py with the system cc. Mirrors the declarations of
 * cuda_runtime_api.h (CUDA 12.6; 13.0 folds cudaGetDeviceProperties_v2 back into cudaGetDeviceProperties):
 * tests/jetson/test_fakes_surface.py checks every entry point here against the header where a CUDA
 * toolkit is installed. */
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
enum { OK = 0, INVALID_VALUE = 1, BAD_HANDLE = 400 };

static double fake_clock_ms = 0.0;
static double events[16];
static int next_event = 1, next_stream = 1, live_allocations = 0, capturing = 0;

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case OK: return "cudaSuccess";
    case INVALID_VALUE: return "cudaErrorInvalidValue";
    case BAD_HANDLE: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaRuntimeGetVersion(int *version) { *version = 12060; return OK; }
cudaError_t cudaDriverGetVersion(int *version) { *version = 12080; return OK; }
cudaError_t cudaGetDeviceCount(int *count) { *count = 1; return OK; }

cudaError_t cudaGetDeviceProperties_v2(void *props, int device) {
    if (device != 0) return INVALID_VALUE;
    memset(props, 0x7f, 1008); /* the fields after the name and totalGlobalMem are not read */
    strcpy((char *)props, "Orin");
    /* totalGlobalMem: after name[256], uuid[16], luid[8] and luidDeviceNodeMask (4), aligned to 8: offset 288
     * (driver_types.h, CUDA 12.x and 13.0); what cuDeviceTotalMem says of an Orin Nano 8GB's GPU */
    *(size_t *)((char *)props + 288) = (size_t)7620 << 20;
    return OK;
}

cudaError_t cudaDeviceGetAttribute(int *value, int attribute, int device) {
    if (device != 0) return INVALID_VALUE;
    switch (attribute) {
    case 75: *value = 8; return OK;  /* compute capability major */
    case 76: *value = 7; return OK;  /* minor */
    case 16: *value = 8; return OK;  /* multiprocessors: an Orin Nano 8GB */
    default: return INVALID_VALUE;
    }
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = (size_t)7620 << 20;
    *free_bytes = *total_bytes / 2;
    return OK;
}

cudaError_t cudaMalloc(void **pointer, size_t size) {
    if (size == 0) return INVALID_VALUE;
    *pointer = malloc(size);
    live_allocations++;
    return OK;
}

cudaError_t cudaFree(void *pointer) {
    if (pointer == NULL) return INVALID_VALUE;
    free(pointer);
    live_allocations--;
    return OK;
}

int fake_live_allocations(void) { return live_allocations; }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
    if (kind < 0 || kind > 3) return INVALID_VALUE;
    memcpy(dst, src, count);
    return OK;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream) {
    return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaStreamCreate(void **stream) { *stream = (void *)(size_t)(0x100 * next_stream++); return OK; }
cudaError_t cudaStreamDestroy(void *stream) { return stream ? OK : BAD_HANDLE; }
cudaError_t cudaStreamSynchronize(void *stream) { return stream ? OK : BAD_HANDLE; }

void fake_launch(double milliseconds) { fake_clock_ms += milliseconds; }

cudaError_t cudaEventCreate(void **event) {
    if (next_event >= 16) return INVALID_VALUE;
    *event = (void *)(size_t)next_event++;
    return OK;
}

cudaError_t cudaEventDestroy(void *event) { return event ? OK : BAD_HANDLE; }

cudaError_t cudaEventRecord(void *event, void *stream) {
    size_t index = (size_t)event;
    if (index == 0 || index >= 16 || stream == NULL) return BAD_HANDLE;
    events[index] = fake_clock_ms;
    return OK;
}

cudaError_t cudaEventElapsedTime(float *milliseconds, void *start, void *end) {
    size_t a = (size_t)start, b = (size_t)end;
    if (a == 0 || a >= 16 || b == 0 || b >= 16) return BAD_HANDLE;
    *milliseconds = (float)(events[b] - events[a]);
    return OK;
}

cudaError_t cudaStreamBeginCapture(void *stream, int mode) { capturing = 1; return stream ? OK : BAD_HANDLE; }

cudaError_t cudaStreamEndCapture(void *stream, void **graph) {
    if (!capturing) return INVALID_VALUE;
    capturing = 0;
    *graph = (void *)0x6000;
    return OK;
}

cudaError_t cudaGraphInstantiate(void **graph_exec, void *graph, unsigned long long flags) {
    if (graph != (void *)0x6000 || flags != 0) return INVALID_VALUE;
    *graph_exec = (void *)0x7000;
    return OK;
}

cudaError_t cudaGraphLaunch(void *graph_exec, void *stream) {
    /* a replay "takes" 1 ms on the fake clock, or FAKE_CUDART_GRAPH_LAUNCH_MS (a test that compares event time
     * with the host's wall time sets it below what a call costs on the host) */
    const char *ms = getenv("FAKE_CUDART_GRAPH_LAUNCH_MS");
    if (graph_exec != (void *)0x7000 || stream == NULL) return BAD_HANDLE;
    fake_launch(ms ? atof(ms) : 1.0);
    return OK;
}

cudaError_t cudaGraphDestroy(void *graph) { return graph == (void *)0x6000 ? OK : BAD_HANDLE; }
cudaError_t cudaGraphExecDestroy(void *graph_exec) { return graph_exec == (void *)0x7000 ? OK : BAD_HANDLE; }
