/*
 * TokenDepthwiseConv: the IPluginV3 wrapper (fields, shapes, formats, serialization) around
 * tokenDepthwiseConvLaunch. Written against TensorRT 10.3's public headers (JetPack 6).
 */
#include "tokenDepthwiseConvPlugin.h"

#include "tokenDepthwiseConvKernel.h"

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace edge
{
namespace plugins
{
namespace
{

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using Severity = nvinfer1::ILogger::Severity;

constexpr char const* kPluginName = "TokenDepthwiseConv";
constexpr char const* kPluginVersion = "1";
constexpr char const* kPluginNamespace = "";

// ---- fields --------------------------------------------------------------------------------------------

PluginField const* findField(PluginFieldCollection const* fc, char const* name)
{
    for (int32_t i = 0; fc && i < fc->nbFields; ++i)
    {
        if (fc->fields[i].name && std::strcmp(fc->fields[i].name, name) == 0)
            return &fc->fields[i];
    }
    return nullptr;
}

PluginField const& requireField(PluginFieldCollection const* fc, char const* name)
{
    PluginField const* field = findField(fc, name);
    if (!field || !field->data)
        throw std::invalid_argument(std::string("field '") + name + "' is missing");
    return *field;
}

std::vector<int32_t> readInts(PluginField const& field, int32_t count)
{
    if (field.type != PluginFieldType::kINT32 || field.length != count)
        throw std::invalid_argument(std::string("field '") + field.name + "': expected " + std::to_string(count)
            + " int32 value(s), found type " + std::to_string(static_cast<int>(field.type)) + " x "
            + std::to_string(field.length));
    auto const* data = static_cast<int32_t const*>(field.data);
    return std::vector<int32_t>(data, data + count);
}

// float32 or float16 values (ONNX tensor attributes arrive in the tensor's own type) as float.
std::vector<float> readFloats(PluginField const& field)
{
    if (field.type == PluginFieldType::kFLOAT32)
    {
        auto const* data = static_cast<float const*>(field.data);
        return std::vector<float>(data, data + field.length);
    }
    if (field.type == PluginFieldType::kFLOAT16)
    {
        auto const* data = static_cast<__half const*>(field.data);
        std::vector<float> values(field.length);
        for (int32_t i = 0; i < field.length; ++i)
            values[i] = __half2float(data[i]);
        return values;
    }
    throw std::invalid_argument(std::string("field '") + field.name + "': expected float32 or float16 values, found type "
        + std::to_string(static_cast<int>(field.type)));
}

std::string readString(PluginField const& field)
{
    if (field.type != PluginFieldType::kCHAR)
        throw std::invalid_argument(std::string("field '") + field.name + "': expected a string (char)");
    std::string text(static_cast<char const*>(field.data), field.length);
    return text.substr(0, text.find('\0'));
}

// PyTorch's [C, 1, k, k] weight -> the kernel's tap-major [k*k, C].
std::vector<float> tapMajor(TokenDepthwiseConvParams const& p)
{
    int32_t const taps = p.kernelSize * p.kernelSize;
    int32_t const channels = p.channels();
    std::vector<float> out(p.weight.size());
    for (int32_t c = 0; c < channels; ++c)
        for (int32_t t = 0; t < taps; ++t)
            out[static_cast<size_t>(t) * channels + c] = p.weight[static_cast<size_t>(c) * taps + t];
    return out;
}

bool isLinear(nvinfer1::PluginTensorDesc const& desc)
{
    return desc.format == nvinfer1::TensorFormat::kLINEAR;
}

} // namespace

// ---- parameters ----------------------------------------------------------------------------------------

int32_t TokenDepthwiseConvParams::channels() const
{
    int32_t const taps = kernelSize * kernelSize;
    return taps > 0 ? static_cast<int32_t>(weight.size() / taps) : 0;
}

int32_t TokenDepthwiseConvParams::modeCode() const
{
    return prefixMode == "pool" ? TOKEN_DW_PREFIX_POOL : TOKEN_DW_PREFIX_MEAN;
}

void TokenDepthwiseConvParams::validate() const
{
    auto fail = [](std::string const& message) { throw std::invalid_argument(message); };
    if (grid[0] <= 0 || grid[1] <= 0)
        fail("grid: expected two positive sizes H, W, found " + std::to_string(grid[0]) + ", " + std::to_string(grid[1]));
    if (kernelSize < 1 || kernelSize % 2 == 0 || kernelSize > grid[0] || kernelSize > grid[1])
        fail("kernel_size=" + std::to_string(kernelSize) + ": expected an odd size <= min(H, W)");
    if (prefixTokens < 0)
        fail("prefix_tokens=" + std::to_string(prefixTokens) + ": expected >= 0");
    if (prefixMode != "mean" && prefixMode != "pool")
        fail("prefix_mode='" + prefixMode + "': expected 'mean' or 'pool' (prefix=drop is prefix_tokens=0; "
             "prefix=attend stays in the graph)");
    size_t const taps = static_cast<size_t>(kernelSize) * kernelSize;
    if (weight.empty() || weight.size() % taps != 0)
        fail("weight: expected [C, 1, k, k] values (a multiple of k*k = " + std::to_string(taps) + "), found "
            + std::to_string(weight.size()));
    size_t const c = static_cast<size_t>(channels());
    if (!bias.empty() && bias.size() != c)
        fail("bias: expected C = " + std::to_string(c) + " values, found " + std::to_string(bias.size()));
    bool const pooled = prefixMode == "pool" && prefixTokens > 0;
    size_t const wanted = pooled ? static_cast<size_t>(prefixTokens) * tokens() * c : 0;
    if (prefixWeights.size() != wanted)
        fail("prefix_weights: expected " + std::to_string(wanted) + " values ([P, P + H*W, C] for prefix_mode 'pool' "
             "with P > 0, none otherwise), found " + std::to_string(prefixWeights.size()));
}

TokenDepthwiseConvParams parseTokenDepthwiseConvFields(PluginFieldCollection const* fc)
{
    TokenDepthwiseConvParams p;
    p.kernelSize = readInts(requireField(fc, "kernel_size"), 1)[0];
    std::vector<int32_t> const grid = readInts(requireField(fc, "grid"), 2);
    p.grid[0] = grid[0];
    p.grid[1] = grid[1];
    p.prefixTokens = readInts(requireField(fc, "prefix_tokens"), 1)[0];
    if (PluginField const* mode = findField(fc, "prefix_mode"))
        p.prefixMode = readString(*mode);
    p.weight = readFloats(requireField(fc, "weight"));
    if (PluginField const* bias = findField(fc, "bias"); bias && bias->data && bias->length > 0)
        p.bias = readFloats(*bias);
    if (PluginField const* pool = findField(fc, "prefix_weights"); pool && pool->data && pool->length > 0)
        p.prefixWeights = readFloats(*pool);
    p.validate();
    return p;
}

// ---- plugin --------------------------------------------------------------------------------------------

TokenDepthwiseConvPlugin::TokenDepthwiseConvPlugin(TokenDepthwiseConvParams params)
    : mParams(std::move(params))
{
}

TokenDepthwiseConvPlugin::TokenDepthwiseConvPlugin(TokenDepthwiseConvPlugin const& other)
    : nvinfer1::IPluginV3()
    , nvinfer1::IPluginV3OneCore()
    , nvinfer1::IPluginV3OneBuild()
    , nvinfer1::IPluginV3OneRuntime()
    , mParams(other.mParams) // device weights are per object: a clone uploads its own
{
}

TokenDepthwiseConvPlugin::~TokenDepthwiseConvPlugin()
{
    if (mDeviceWeights)
        cudaFree(mDeviceWeights);
}

nvinfer1::IPluginCapability* TokenDepthwiseConvPlugin::getCapabilityInterface(
    nvinfer1::PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

nvinfer1::IPluginV3* TokenDepthwiseConvPlugin::clone() noexcept
{
    try
    {
        return new TokenDepthwiseConvPlugin(*this);
    }
    catch (std::exception const& e)
    {
        logPluginMessage(Severity::kERROR, std::string("TokenDepthwiseConv clone: ") + e.what());
        return nullptr;
    }
}

char const* TokenDepthwiseConvPlugin::getPluginName() const noexcept
{
    return kPluginName;
}

char const* TokenDepthwiseConvPlugin::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* TokenDepthwiseConvPlugin::getPluginNamespace() const noexcept
{
    return kPluginNamespace;
}

bool TokenDepthwiseConvPlugin::matchesInput(nvinfer1::Dims const& dims) const
{
    // -1 is a dimension not known yet (the batch, at build time)
    bool const ok = dims.nbDims == 3 && (dims.d[1] == -1 || dims.d[1] == mParams.tokens())
        && (dims.d[2] == -1 || dims.d[2] == mParams.channels());
    if (!ok)
        logPluginMessage(Severity::kERROR,
            "TokenDepthwiseConv: input must be [B, " + std::to_string(mParams.tokens()) + ", "
                + std::to_string(mParams.channels()) + "] (P + H*W tokens of C channels, from the fields); found rank "
                + std::to_string(dims.nbDims) + (dims.nbDims == 3 ? " with [" + std::to_string(dims.d[0]) + ", "
                + std::to_string(dims.d[1]) + ", " + std::to_string(dims.d[2]) + "]" : std::string()));
    return ok;
}

int32_t TokenDepthwiseConvPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || !matchesInput(in[0].desc.dims))
        return -1;
    (void) out;
    return 0;
}

int32_t TokenDepthwiseConvPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs != 1)
        return -1;
    outputTypes[0] = inputTypes[0];
    return 0;
}

int32_t TokenDepthwiseConvPlugin::getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
    nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
    nvinfer1::IExprBuilder& exprBuilder) noexcept
{
    (void) shapeInputs;
    (void) nbShapeInputs;
    (void) exprBuilder;
    if (nbInputs != 1 || nbOutputs != 1 || inputs[0].nbDims != 3)
        return -1;
    outputs[0] = inputs[0]; // the mixer keeps the token layout
    return 0;
}

bool TokenDepthwiseConvPlugin::supportsFormatCombination(
    int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || pos < 0 || pos > 1)
        return false;
    nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
    if (!isLinear(desc))
        return false;
    if (pos == 0)
        return desc.type == DataType::kFLOAT || desc.type == DataType::kHALF;
    return desc.type == inOut[0].desc.type; // output: the input's type
}

int32_t TokenDepthwiseConvPlugin::getNbOutputs() const noexcept
{
    return 1;
}

size_t TokenDepthwiseConvPlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept
{
    (void) inputs;
    (void) nbInputs;
    (void) outputs;
    (void) nbOutputs;
    return 0;
}

bool TokenDepthwiseConvPlugin::uploadWeights(cudaStream_t stream) noexcept
{
    if (mDeviceWeights)
        return true;
    try
    {
        std::vector<float> host = tapMajor(mParams);
        host.insert(host.end(), mParams.bias.begin(), mParams.bias.end());
        host.insert(host.end(), mParams.prefixWeights.begin(), mParams.prefixWeights.end());
        size_t const bytes = host.size() * sizeof(float);
        cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&mDeviceWeights), bytes);
        if (status == cudaSuccess)
            status = stream ? cudaMemcpyAsync(mDeviceWeights, host.data(), bytes, cudaMemcpyHostToDevice, stream)
                            : cudaMemcpy(mDeviceWeights, host.data(), bytes, cudaMemcpyHostToDevice);
        if (stream && status == cudaSuccess)
            status = cudaStreamSynchronize(stream); // `host` is freed on return
        if (status != cudaSuccess)
        {
            logPluginMessage(Severity::kERROR,
                std::string("TokenDepthwiseConv: uploading the weights failed: ") + cudaGetErrorString(status));
            if (mDeviceWeights)
                cudaFree(mDeviceWeights);
            mDeviceWeights = nullptr;
            return false;
        }
        return true;
    }
    catch (std::exception const& e)
    {
        logPluginMessage(Severity::kERROR, std::string("TokenDepthwiseConv: ") + e.what());
        return false;
    }
}

int32_t TokenDepthwiseConvPlugin::onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    (void) out;
    if (nbInputs != 1 || nbOutputs != 1 || !matchesInput(in[0].dims))
        return -1;
    return uploadWeights(nullptr) ? 0 : -1; // before enqueue, outside any CUDA graph capture
}

int32_t TokenDepthwiseConvPlugin::enqueue(nvinfer1::PluginTensorDesc const* inputDesc,
    nvinfer1::PluginTensorDesc const* outputDesc, void const* const* inputs, void* const* outputs, void* workspace,
    cudaStream_t stream) noexcept
{
    (void) outputDesc;
    (void) workspace;
    if (!uploadWeights(stream)) // a no-op once onShapeChange has uploaded them
        return -1;
    int32_t const taps = mParams.kernelSize * mParams.kernelSize;
    int32_t const channels = mParams.channels();
    float const* weight = mDeviceWeights;
    float const* bias = mParams.bias.empty() ? nullptr : weight + static_cast<size_t>(taps) * channels;
    float const* pool = mParams.prefixWeights.empty()
        ? nullptr
        : weight + static_cast<size_t>(taps) * channels + mParams.bias.size();
    int32_t const dataType = inputDesc[0].type == DataType::kHALF ? TOKEN_DW_FLOAT16 : TOKEN_DW_FLOAT32;
    int const status = tokenDepthwiseConvLaunch(inputs[0], outputs[0], weight, bias, pool, inputDesc[0].dims.d[0],
        mParams.prefixTokens, mParams.grid[0], mParams.grid[1], channels, mParams.kernelSize, mParams.modeCode(),
        dataType, stream);
    if (status != cudaSuccess)
    {
        logPluginMessage(Severity::kERROR, std::string("TokenDepthwiseConv: tokenDepthwiseConvLaunch failed: ")
            + cudaGetErrorString(static_cast<cudaError_t>(status)));
        return -1;
    }
    return 0;
}

nvinfer1::IPluginV3* TokenDepthwiseConvPlugin::attachToContext(nvinfer1::IPluginResourceContext* context) noexcept
{
    (void) context;
    return clone();
}

nvinfer1::PluginFieldCollection const* TokenDepthwiseConvPlugin::getFieldsToSerialize() noexcept
{
    // the fields as given (PyTorch's weight layout), pointing into mParams, valid while the plugin lives
    mSerialized = {
        PluginField("kernel_size", &mParams.kernelSize, PluginFieldType::kINT32, 1),
        PluginField("grid", mParams.grid, PluginFieldType::kINT32, 2),
        PluginField("prefix_tokens", &mParams.prefixTokens, PluginFieldType::kINT32, 1),
        PluginField("prefix_mode", mParams.prefixMode.c_str(), PluginFieldType::kCHAR,
            static_cast<int32_t>(mParams.prefixMode.size())),
        PluginField("weight", mParams.weight.data(), PluginFieldType::kFLOAT32,
            static_cast<int32_t>(mParams.weight.size())),
    };
    if (!mParams.bias.empty())
        mSerialized.emplace_back(
            "bias", mParams.bias.data(), PluginFieldType::kFLOAT32, static_cast<int32_t>(mParams.bias.size()));
    if (!mParams.prefixWeights.empty())
        mSerialized.emplace_back("prefix_weights", mParams.prefixWeights.data(), PluginFieldType::kFLOAT32,
            static_cast<int32_t>(mParams.prefixWeights.size()));
    mSerializedCollection.nbFields = static_cast<int32_t>(mSerialized.size());
    mSerializedCollection.fields = mSerialized.data();
    return &mSerializedCollection;
}

// ---- creator -------------------------------------------------------------------------------------------

TokenDepthwiseConvPluginCreator::TokenDepthwiseConvPluginCreator()
    : mFields{PluginField("kernel_size", nullptr, PluginFieldType::kINT32, 1),
        PluginField("grid", nullptr, PluginFieldType::kINT32, 2),
        PluginField("prefix_tokens", nullptr, PluginFieldType::kINT32, 1),
        PluginField("prefix_mode", nullptr, PluginFieldType::kCHAR, 0),
        PluginField("weight", nullptr, PluginFieldType::kFLOAT32, 0),
        PluginField("bias", nullptr, PluginFieldType::kFLOAT32, 0),
        PluginField("prefix_weights", nullptr, PluginFieldType::kFLOAT32, 0)}
{
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

char const* TokenDepthwiseConvPluginCreator::getPluginName() const noexcept
{
    return kPluginName;
}

char const* TokenDepthwiseConvPluginCreator::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* TokenDepthwiseConvPluginCreator::getPluginNamespace() const noexcept
{
    return kPluginNamespace;
}

PluginFieldCollection const* TokenDepthwiseConvPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

nvinfer1::IPluginV3* TokenDepthwiseConvPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept
{
    (void) phase; // the same fields in both phases
    try
    {
        return new TokenDepthwiseConvPlugin(parseTokenDepthwiseConvFields(fc));
    }
    catch (std::exception const& e)
    {
        logPluginMessage(Severity::kERROR,
            std::string("TokenDepthwiseConv node '") + (name ? name : "") + "': " + e.what());
        return nullptr;
    }
}

} // namespace plugins
} // namespace edge
