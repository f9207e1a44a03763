/*
 * TensorRT IPluginV3 wrapper of the token-layout depthwise convolution ("TokenDepthwiseConv", version "1").
 *
 * One input, one output, both [B, P + H*W, C], fp32 or fp16 (the same type), linear format; B may be dynamic.
 * Fields (ONNX attributes of the custom node; see README.md for the table):
 *   kernel_size     int32            odd k <= min(H, W)
 *   grid            int32[2]         H, W
 *   prefix_tokens   int32            P >= 0
 *   prefix_mode     char             "mean" or "pool" (edge's prefix=drop is prefix_tokens = 0)
 *   weight          float32|float16  [C, 1, k, k], PyTorch's depthwise Conv2d weight as stored
 *   bias            float32|float16  [C], optional
 *   prefix_weights  float32|float16  [P, P + H*W, C], prefix_mode "pool" with P > 0 only
 * The plugin keeps the weights as given (what it serializes) and uploads them once per plugin object in the
 * kernel's layout (tap-major [k*k, C], fp32).
 */
#ifndef TOKEN_DEPTHWISE_CONV_PLUGIN_H
#define TOKEN_DEPTHWISE_CONV_PLUGIN_H

#include <NvInferRuntime.h>

#include <string>
#include <vector>

namespace edge
{
namespace plugins
{

// What a TokenDepthwiseConv node computes, as read from its fields.
struct TokenDepthwiseConvParams
{
    int32_t kernelSize{0};
    int32_t grid[2]{0, 0};
    int32_t prefixTokens{0};
    std::string prefixMode{"mean"};
    std::vector<float> weight;        // [C, 1, k, k]
    std::vector<float> bias;          // [C] or empty
    std::vector<float> prefixWeights; // [P, P + H*W, C] or empty

    int32_t channels() const;
    int32_t tokens() const { return prefixTokens + grid[0] * grid[1]; }
    int32_t modeCode() const;
    // Throws std::invalid_argument naming the field, what was expected and what was found.
    void validate() const;
};

// Reads and validates the fields; throws std::invalid_argument on a missing, mistyped or inconsistent field.
TokenDepthwiseConvParams parseTokenDepthwiseConvFields(nvinfer1::PluginFieldCollection const* fields);

class TokenDepthwiseConvPlugin : public nvinfer1::IPluginV3,
                                 public nvinfer1::IPluginV3OneCore,
                                 public nvinfer1::IPluginV3OneBuild,
                                 public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit TokenDepthwiseConvPlugin(TokenDepthwiseConvParams params);
    TokenDepthwiseConvPlugin(TokenDepthwiseConvPlugin const& other);
    TokenDepthwiseConvPlugin& operator=(TokenDepthwiseConvPlugin const&) = delete;
    ~TokenDepthwiseConvPlugin() override;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    // Checks the input's rank and static sizes against the fields; returns false (and logs) when they differ.
    bool matchesInput(nvinfer1::Dims const& dims) const;
    // Uploads the weights in the kernel's layout once; `stream` null means synchronous copies.
    bool uploadWeights(cudaStream_t stream) noexcept;

    TokenDepthwiseConvParams mParams;
    float* mDeviceWeights{nullptr};   // [k*k, C] tap-major, then [C] bias, then [P, P + H*W, C] prefix weights
    std::vector<nvinfer1::PluginField> mSerialized;
    nvinfer1::PluginFieldCollection mSerializedCollection{};
};

class TokenDepthwiseConvPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    TokenDepthwiseConvPluginCreator();

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

// Error and warning lines through the logger TensorRT hands to the library (setLoggerFinder), else stderr.
void logPluginMessage(nvinfer1::ILogger::Severity severity, std::string const& message) noexcept;

} // namespace plugins
} // namespace edge

#endif // TOKEN_DEPTHWISE_CONV_PLUGIN_H
