/*
 * Token-layout depthwise convolution (see tokenDepthwiseConvKernel.h for the maths and layouts).
 *
 * One launch does both parts, split by block index:
 *   - patch blocks: one thread per (image, patch, pack of N channels); the k x k taps are read straight
 *     from the token layout (neighbour (y+i, x+j) is token P + (y+i)*W + (x+j)). Adjacent threads hold
 *     adjacent channel packs, so every tap is one coalesced row read of the tokens and one of the
 *     tap-major weights; the k*k reuse of a token between neighbouring patches is served by L1/L2.
 *   - prefix blocks: a reduction over tokens per (image, prefix row, kLanes channel packs); the block's
 *     256 threads are kLanes lanes (channel packs) x kSlices slices (every kSlices-th token), summed in
 *     shared memory.
 * The memory-bound Orin case needs no tiling: the whole tensor of a ViT block is read about once.
 */
#include "tokenDepthwiseConvKernel.h"

#include <cuda_fp16.h>
#include <cstdint>

namespace {

constexpr int kThreads = 256;               // threads per block, both parts
constexpr int kLanes = 8;                   // prefix part: channel packs per block (8 x 16 bytes: a full row segment)
constexpr int kSlices = kThreads / kLanes;  // prefix part: token slices per block (32: short loops at batch 1)
constexpr int kMaxPack = 8;                 // widest channel pack (8 halves = 16 bytes)

// N consecutive channels of one token, loaded and stored as one aligned vector access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T fromFloat(float x);
template <>
__device__ __forceinline__ float fromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half fromFloat<__half>(float x) { return __float2half_rn(x); }

// Sizes of one call; `tokens` = P + H*W, the row count of one image in the token layout.
struct Shape {
    int batch, prefix, gridH, gridW, channels, k, mode, tokens;
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> loadPack(const T* p) { return *reinterpret_cast<const Pack<T, N>*>(p); }

// N consecutive fp32 weights (16-byte loads where N allows; the launcher checks the alignment).
template <int N>
__device__ __forceinline__ void loadWeights(const float* p, float (&w)[N]) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int j = 0; j < N; j += 4) {
            const float4 v = *reinterpret_cast<const float4*>(p + j);
            w[j] = v.x; w[j + 1] = v.y; w[j + 2] = v.z; w[j + 3] = v.w;
        }
    } else if constexpr (N == 2) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        w[0] = v.x; w[1] = v.y;
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) w[j] = p[j];
    }
}

template <typename T, int N>
__device__ __forceinline__ void storePack(T* p, const float (&acc)[N]) {
    Pack<T, N> r;
#pragma unroll
    for (int j = 0; j < N; ++j) r.v[j] = fromFloat<T>(acc[j]);
    *reinterpret_cast<Pack<T, N>*>(p) = r;
}

// Patch part. `pack` enumerates (image b, grid row y, grid column x, channel pack) with the pack fastest.
// K > 0 fixes the kernel size at compile time (unrolled taps); K == 0 reads it from the shape.
template <typename T, int N, int K>
__device__ void patchOutputs(const T* in, T* out, const float* weight, const float* bias, const Shape& s,
                             long long pack) {
    const int k = K > 0 ? K : s.k;
    const int half = k / 2;
    const int packs = s.channels / N;
    const int c0 = static_cast<int>(pack % packs) * N;
    const long long patch = pack / packs;                  // b * H * W + y * W + x
    const int x = static_cast<int>(patch % s.gridW);
    const int y = static_cast<int>((patch / s.gridW) % s.gridH);
    const long long b = patch / (static_cast<long long>(s.gridW) * s.gridH);
    const size_t C = static_cast<size_t>(s.channels);
    const size_t imageRow = static_cast<size_t>(b) * s.tokens;   // token row of image b's first token
    const T* grid = in + (imageRow + s.prefix) * C + c0;         // patch (0, 0), channel c0

    float acc[N];
    if (bias) {
        loadWeights<N>(bias + c0, acc);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < k; ++i) {
        const int yy = y + i - half;
        if (yy < 0 || yy >= s.gridH) continue;             // zero padding: the tap adds nothing
#pragma unroll
        for (int t = 0; t < k; ++t) {
            const int xx = x + t - half;
            if (xx < 0 || xx >= s.gridW) continue;
            const Pack<T, N> v = loadPack<T, N>(grid + static_cast<size_t>(yy * s.gridW + xx) * C);
            float w[N];
            loadWeights<N>(weight + static_cast<size_t>(i * k + t) * C + c0, w);   // tap (i, t), channels c0..
#pragma unroll
            for (int j = 0; j < N; ++j) acc[j] += w[j] * toFloat(v.v[j]);
        }
    }
    storePack<T, N>(out + (imageRow + s.prefix + static_cast<size_t>(y) * s.gridW + x) * C + c0, acc);
}

// Prefix part. `block` enumerates (image b, prefix row r, group of kLanes channel packs). Prefix mean has one
// row per image (its value is written to all P prefix tokens); prefix pool has P rows.
template <typename T, int N>
__device__ void prefixOutputs(const T* in, T* out, const float* prefixWeights, const Shape& s, int block) {
    __shared__ float partial[kSlices][kLanes * kMaxPack];
    const int lane = threadIdx.x % kLanes;
    const int slice = threadIdx.x / kLanes;
    const int packs = s.channels / N;
    const int groups = (packs + kLanes - 1) / kLanes;
    const bool mean = s.mode == TOKEN_DW_PREFIX_MEAN;
    const int rows = mean ? 1 : s.prefix;
    const int group = block % groups;
    const int r = (block / groups) % rows;
    const size_t b = static_cast<size_t>(block / (groups * rows));
    const int pack = group * kLanes + lane;
    const bool active = pack < packs;
    const int c0 = pack * N;
    const size_t C = static_cast<size_t>(s.channels);
    const T* image = in + b * s.tokens * C;

    float acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = 0.0f;
    if (active) {
        // mean: the patch tokens P..tokens-1; pool: every token, weighted by prefixWeights[r, n, c].
        for (int n = (mean ? s.prefix : 0) + slice; n < s.tokens; n += kSlices) {
            const Pack<T, N> v = loadPack<T, N>(image + n * C + c0);
            float w[N];
            if (mean) {
#pragma unroll
                for (int j = 0; j < N; ++j) w[j] = 1.0f;
            } else {
                loadWeights<N>(prefixWeights + (static_cast<size_t>(r) * s.tokens + n) * C + c0, w);
            }
#pragma unroll
            for (int j = 0; j < N; ++j) acc[j] += w[j] * toFloat(v.v[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < N; ++j) partial[slice][lane * N + j] = acc[j];
    __syncthreads();
    if (slice != 0 || !active) return;
    for (int other = 1; other < kSlices; ++other) {
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] += partial[other][lane * N + j];
    }
    if (mean) {
        const float inverse = 1.0f / static_cast<float>(s.gridH * s.gridW);
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] *= inverse;
        for (int p = 0; p < s.prefix; ++p) storePack<T, N>(out + (b * s.tokens + p) * C + c0, acc);
    } else {
        storePack<T, N>(out + (b * s.tokens + r) * C + c0, acc);
    }
}

// Blocks [0, patchBlocks) compute patch tokens, the rest prefix tokens (the split is block-uniform,
// so the prefix part's __syncthreads is reached by all threads of its block).
template <typename T, int N, int K>
__global__ void __launch_bounds__(kThreads)
    tokenDepthwiseConvKernel(const T* in, T* out, const float* weight, const float* bias, const float* prefixWeights,
                             Shape s, long long patchPacks, int patchBlocks) {
    if (static_cast<int>(blockIdx.x) < patchBlocks) {
        const long long pack = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
        if (pack < patchPacks) patchOutputs<T, N, K>(in, out, weight, bias, s, pack);
    } else {
        prefixOutputs<T, N>(in, out, prefixWeights, s, static_cast<int>(blockIdx.x) - patchBlocks);
    }
}

template <typename T, int N, int K>
cudaError_t launchKernel(const void* input, void* output, const float* weight, const float* bias,
                         const float* prefixWeights, const Shape& s, cudaStream_t stream) {
    const long long patchPacks = static_cast<long long>(s.batch) * s.gridH * s.gridW * (s.channels / N);
    const long long patchBlocks = (patchPacks + kThreads - 1) / kThreads;
    long long prefixBlocks = 0;
    if (s.prefix > 0) {
        const long long groups = (s.channels / N + kLanes - 1) / kLanes;
        prefixBlocks = static_cast<long long>(s.batch) * (s.mode == TOKEN_DW_PREFIX_MEAN ? 1 : s.prefix) * groups;
    }
    if (patchBlocks + prefixBlocks > INT32_MAX) return cudaErrorInvalidValue;
    tokenDepthwiseConvKernel<T, N, K><<<static_cast<unsigned>(patchBlocks + prefixBlocks), kThreads, 0, stream>>>(
        static_cast<const T*>(input), static_cast<T*>(output), weight, bias, prefixWeights, s, patchPacks,
        static_cast<int>(patchBlocks));
    return cudaGetLastError();
}

// The common kernel sizes get unrolled instantiations; any other odd k runs the generic one.
template <typename T, int N>
cudaError_t launchForKernelSize(const void* input, void* output, const float* weight, const float* bias,
                                const float* prefixWeights, const Shape& s, cudaStream_t stream) {
    switch (s.k) {
        case 3: return launchKernel<T, N, 3>(input, output, weight, bias, prefixWeights, s, stream);
        case 5: return launchKernel<T, N, 5>(input, output, weight, bias, prefixWeights, s, stream);
        case 7: return launchKernel<T, N, 7>(input, output, weight, bias, prefixWeights, s, stream);
        default: return launchKernel<T, N, 0>(input, output, weight, bias, prefixWeights, s, stream);
    }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The widest pack (at most 16 bytes of T) that divides C and keeps every row of the tokens aligned to the
// pack, and every row of the fp32 weights aligned to the vector loads loadWeights<N> makes.
template <typename T>
int packWidth(const void* input, const void* output, const float* weight, const float* bias,
              const float* prefixWeights, int channels) {
    for (int n = 16 / static_cast<int>(sizeof(T)); n > 1; n /= 2) {
        const size_t floatBytes = (n % 4 == 0 ? 4 : n) * sizeof(float);
        const bool weightsAligned = aligned(weight, floatBytes) && (!bias || aligned(bias, floatBytes)) &&
                                    (!prefixWeights || aligned(prefixWeights, floatBytes));
        if (channels % n == 0 && aligned(input, n * sizeof(T)) && aligned(output, n * sizeof(T)) && weightsAligned)
            return n;
    }
    return 1;
}

template <typename T>
cudaError_t launchTyped(const void* input, void* output, const float* weight, const float* bias,
                        const float* prefixWeights, const Shape& s, cudaStream_t stream) {
    switch (packWidth<T>(input, output, weight, bias, prefixWeights, s.channels)) {
        case 8: return launchForKernelSize<T, 8>(input, output, weight, bias, prefixWeights, s, stream);
        case 4: return launchForKernelSize<T, 4>(input, output, weight, bias, prefixWeights, s, stream);
        case 2: return launchForKernelSize<T, 2>(input, output, weight, bias, prefixWeights, s, stream);
        default: return launchForKernelSize<T, 1>(input, output, weight, bias, prefixWeights, s, stream);
    }
}

bool validArguments(const void* input, const void* output, const float* weight, const float* prefixWeights,
                    const Shape& s, int dataType) {
    if (!input || !output || !weight || input == output) return false;
    if (s.batch <= 0 || s.gridH <= 0 || s.gridW <= 0 || s.channels <= 0 || s.prefix < 0) return false;
    if (s.k < 1 || s.k % 2 == 0 || s.k > s.gridH || s.k > s.gridW) return false;
    if (s.mode != TOKEN_DW_PREFIX_MEAN && s.mode != TOKEN_DW_PREFIX_POOL) return false;
    const bool needsPrefixWeights = s.prefix > 0 && s.mode == TOKEN_DW_PREFIX_POOL;
    if (needsPrefixWeights != (prefixWeights != nullptr)) return false;
    return dataType == TOKEN_DW_FLOAT32 || dataType == TOKEN_DW_FLOAT16;
}

}  // namespace

extern "C" TOKEN_DW_API int tokenDepthwiseConvLaunch(const void* input, void* output, const float* weight,
                                                     const float* bias, const float* prefixWeights, int batch,
                                                     int prefixTokens, int gridH, int gridW, int channels,
                                                     int kernelSize, int prefixMode, int dataType,
                                                     cudaStream_t stream) {
    const Shape s{batch, prefixTokens, gridH, gridW, channels, kernelSize, prefixMode, prefixTokens + gridH * gridW};
    if (!validArguments(input, output, weight, prefixWeights, s, dataType)) return cudaErrorInvalidValue;
    const cudaError_t status = dataType == TOKEN_DW_FLOAT16
        ? launchTyped<__half>(input, output, weight, bias, prefixWeights, s, stream)
        : launchTyped<float>(input, output, weight, bias, prefixWeights, s, stream);
    return static_cast<int>(status);
}
