// Host-side checks of the TokenDepthwiseConv IPluginV3 wrapper: fields, validation messages, formats, types,
// configuration and the serialize -> create round trip. Needs TensorRT's headers, not its libraries or a GPU
// (nothing here touches the device). Built and run by tests/plugins/test_token_depthwise.py; prints one line
// per failed check and exits with the number of failures.
#include "tokenDepthwiseConvPlugin.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder);
extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

using namespace nvinfer1;

namespace
{
int gFailures = 0;

void check(bool ok, char const* what)
{
    if (!ok)
    {
        std::printf("FAILED: %s\n", what);
        ++gFailures;
    }
}

// Keeps the last message TensorRT's logger would have received.
class LastMessage : public ILogger
{
public:
    void log(Severity, AsciiChar const* msg) noexcept override { text = msg; }
    std::string text;
};

class Finder : public ILoggerFinder
{
public:
    ILogger* findLogger() override { return &logger; }
    LastMessage logger;
};

// The fields of a node: P = 1 prefix token pooled, k = 3 on a 4 x 5 grid, C = 8 channels.
struct Node
{
    int32_t k = 3;
    int32_t grid[2] = {4, 5};
    int32_t prefix = 1;
    std::string mode = "pool";
    std::vector<float> weight = std::vector<float>(8 * 9, 0.5f);
    std::vector<float> bias = std::vector<float>(8, 0.25f);
    std::vector<float> pool = std::vector<float>(1 * 21 * 8, 0.1f);
    std::vector<PluginField> fields;
    PluginFieldCollection collection{};

    PluginFieldCollection const* get()
    {
        fields = {PluginField("kernel_size", &k, PluginFieldType::kINT32, 1),
            PluginField("grid", grid, PluginFieldType::kINT32, 2),
            PluginField("prefix_tokens", &prefix, PluginFieldType::kINT32, 1),
            PluginField("prefix_mode", mode.c_str(), PluginFieldType::kCHAR, static_cast<int32_t>(mode.size())),
            PluginField("weight", weight.data(), PluginFieldType::kFLOAT32, static_cast<int32_t>(weight.size())),
            PluginField("bias", bias.data(), PluginFieldType::kFLOAT32, static_cast<int32_t>(bias.size())),
            PluginField("prefix_weights", pool.data(), PluginFieldType::kFLOAT32, static_cast<int32_t>(pool.size()))};
        collection.nbFields = static_cast<int32_t>(fields.size());
        collection.fields = fields.data();
        return &collection;
    }
};

DynamicPluginTensorDesc tensor(DataType type, TensorFormat format, int64_t batch, int64_t tokens, int64_t channels)
{
    DynamicPluginTensorDesc desc{};
    desc.desc.type = type;
    desc.desc.format = format;
    desc.desc.dims.nbDims = 3;
    desc.desc.dims.d[0] = batch;
    desc.desc.dims.d[1] = tokens;
    desc.desc.dims.d[2] = channels;
    return desc;
}

IPluginCreatorV3One* tokenDepthwiseCreator()
{
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = getCreators(count);
    for (int32_t i = 0; i < count; ++i)
    {
        auto* creator = static_cast<IPluginCreatorV3One*>(creators[i]);
        if (std::strcmp(creator->getPluginName(), "TokenDepthwiseConv") == 0)
            return creator;
    }
    return nullptr;
}
} // namespace

int main()
{
    Finder finder;
    setLoggerFinder(&finder);
    IPluginCreatorV3One* creator = tokenDepthwiseCreator();
    check(creator != nullptr, "getCreators lists TokenDepthwiseConv");
    if (!creator)
        return gFailures;
    check(std::strcmp(creator->getPluginVersion(), "1") == 0, "plugin version 1");
    check(creator->getFieldNames()->nbFields == 7, "seven fields");

    Node node;
    std::unique_ptr<IPluginV3> plugin(creator->createPlugin("dw0", node.get(), TensorRTPhase::kBUILD));
    check(plugin != nullptr, "valid fields create a plugin");
    if (!plugin)
        return gFailures;
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(build->getNbOutputs() == 1, "one output");

    DynamicPluginTensorDesc io[2] = {tensor(DataType::kHALF, TensorFormat::kLINEAR, -1, 21, 8),
        tensor(DataType::kHALF, TensorFormat::kLINEAR, -1, 21, 8)};
    check(build->supportsFormatCombination(0, io, 1, 1), "fp16 linear input");
    check(build->supportsFormatCombination(1, io, 1, 1), "fp16 output after an fp16 input");
    io[1].desc.type = DataType::kFLOAT;
    check(!build->supportsFormatCombination(1, io, 1, 1), "no fp32 output after an fp16 input");
    io[0].desc.type = DataType::kINT8;
    check(!build->supportsFormatCombination(0, io, 1, 1), "no int8 input");
    io[0] = tensor(DataType::kFLOAT, TensorFormat::kCHW32, -1, 21, 8);
    check(!build->supportsFormatCombination(0, io, 1, 1), "linear format only");

    DataType outType{};
    DataType const inType = DataType::kHALF;
    check(build->getOutputDataTypes(&outType, 1, &inType, 1) == 0 && outType == DataType::kHALF, "output type = input");

    DynamicPluginTensorDesc good[2] = {tensor(DataType::kFLOAT, TensorFormat::kLINEAR, -1, 21, 8),
        tensor(DataType::kFLOAT, TensorFormat::kLINEAR, -1, 21, 8)};
    check(build->configurePlugin(good, 1, good + 1, 1) == 0, "configure [B, 21, 8]");
    DynamicPluginTensorDesc bad[2] = {tensor(DataType::kFLOAT, TensorFormat::kLINEAR, 2, 20, 8),
        tensor(DataType::kFLOAT, TensorFormat::kLINEAR, 2, 20, 8)};
    check(build->configurePlugin(bad, 1, bad + 1, 1) != 0, "refuse 20 tokens where P + H*W = 21");
    check(finder.logger.text.find("[B, 21, 8]") != std::string::npos, "the refusal names the expected shape");

    // serialize -> create: the same plugin again
    PluginFieldCollection const* saved = runtime->getFieldsToSerialize();
    check(saved->nbFields == 7, "seven serialized fields");
    std::unique_ptr<IPluginV3> restored(creator->createPlugin("dw0", saved, TensorRTPhase::kRUNTIME));
    check(restored != nullptr, "serialized fields create the plugin again");
    std::unique_ptr<IPluginV3> copy(plugin->clone());
    check(copy != nullptr, "clone");

    // validation messages name the field
    Node even;
    even.k = 2;
    even.weight.assign(8 * 4, 0.5f);
    check(creator->createPlugin("dw1", even.get(), TensorRTPhase::kBUILD) == nullptr, "refuse k = 2");
    check(finder.logger.text.find("kernel_size=2") != std::string::npos, "message names kernel_size");
    Node attend;
    attend.mode = "attend";
    check(creator->createPlugin("dw2", attend.get(), TensorRTPhase::kBUILD) == nullptr, "refuse prefix_mode attend");
    check(finder.logger.text.find("prefix_mode") != std::string::npos, "message names prefix_mode");
    Node shortPool;
    shortPool.pool.resize(20 * 8);
    check(creator->createPlugin("dw3", shortPool.get(), TensorRTPhase::kBUILD) == nullptr, "refuse short prefix_weights");
    check(finder.logger.text.find("prefix_weights") != std::string::npos, "message names prefix_weights");
    Node mean;
    mean.mode = "mean";
    mean.pool.clear();
    std::unique_ptr<IPluginV3> meanPlugin(creator->createPlugin("dw4", mean.get(), TensorRTPhase::kBUILD));
    check(meanPlugin != nullptr, "prefix_mode mean without prefix_weights");

    std::printf("%d failed\n", gFailures);
    return gFailures;
}
