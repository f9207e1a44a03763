/*
 * Token-layout depthwise convolution: edge's dwconv mixer (DepthwiseAttention's value -> conv part)
 * computed on the [B, P + H*W, C] token tensor directly, prefix tokens included.
 *
 * Layouts (row-major, C contiguous):
 *   input, output   [B, P + H*W, C]   token n < P is a prefix token ([CLS], registers); token P + y*W + x
 *                                     is the patch at grid row y, column x.
 *   weight          [k, k, C] fp32    tap-major, channel fastest: weight[(i*k + j)*C + c] is PyTorch's depthwise
 *                                     Conv2d weight[c, 0, i, j] (transpose [C, k*k] -> [k*k, C] once, when the
 *                                     plugin is created); adjacent threads then read adjacent weights.
 *   bias            [C] fp32          added to every patch output; NULL means zero. Never added to prefix tokens.
 *   prefixWeights   [P, P + H*W, C]   fp32, TOKEN_DW_PREFIX_POOL only (DepthwiseAttention.prefix_weights); else NULL.
 *
 * Patch outputs: out[b, P + y*W + x, c] = bias[c] + sum_{i,j < k} weight[i, j, c]
 *                                                   * in[b, P + (y+i-k/2)*W + (x+j-k/2), c]
 * with zero padding (taps outside the grid contribute nothing): PyTorch's Conv2d(padding=k//2, groups=C).
 *
 * Prefix outputs (P > 0), by prefix mode:
 *   TOKEN_DW_PREFIX_MEAN  out[b, p, c] = mean over the H*W patch tokens of in[b, ., c], the same for every p
 *                         (edge's prefix=mean: value(mean of patch x) = mean of patch V, V being affine).
 *   TOKEN_DW_PREFIX_POOL  out[b, p, c] = sum over all P + H*W tokens n of prefixWeights[p, n, c] * in[b, n, c]
 *                         (edge's prefix=pool).
 * edge's prefix=drop is P = 0 (the model has no prefix tokens). prefix=attend is not computable from V
 * alone (it needs each prefix query's q and every token's k) and is left to the graph.
 *
 * fp16 I/O accumulates in fp32. input and output must not overlap. Weights are always fp32.
 */
#ifndef TOKEN_DEPTHWISE_CONV_KERNEL_H
#define TOKEN_DEPTHWISE_CONV_KERNEL_H

#include <cuda_runtime_api.h>

/* Exported from the plugin library even when it is built with hidden visibility (plugins/CMakeLists.txt). */
#define TOKEN_DW_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Prefix modes: how prefix tokens' outputs are made (values of the plugin's "prefix_mode" attribute). */
enum TokenDepthwisePrefixMode { TOKEN_DW_PREFIX_MEAN = 0, TOKEN_DW_PREFIX_POOL = 1 };

/* I/O element types; the numbers are TensorRT's nvinfer1::DataType values (kFLOAT = 0, kHALF = 1). */
enum TokenDepthwiseDataType { TOKEN_DW_FLOAT32 = 0, TOKEN_DW_FLOAT16 = 1 };

/*
 * Enqueue the mixer on `stream`. Returns a cudaError_t code: cudaSuccess (0), cudaErrorInvalidValue for
 * arguments outside the contract (odd k >= 1, k <= min(H, W), sizes > 0, P >= 0, prefixWeights given
 * exactly when P > 0 and mode is POOL, known mode and data type), or the launch error.
 */
TOKEN_DW_API int tokenDepthwiseConvLaunch(const void* input, void* output, const float* weight, const float* bias,
                                          const float* prefixWeights, int batch, int prefixTokens, int gridH,
                                          int gridW, int channels, int kernelSize, int prefixMode, int dataType,
                                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TOKEN_DEPTHWISE_CONV_KERNEL_H */
