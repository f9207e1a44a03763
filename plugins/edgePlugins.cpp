/*
 * The entry points TensorRT looks up in a plugin library (TensorRT 10: IPluginRegistry::loadLibrary,
 * `trtexec --dynamicPlugins=libedge_plugins.so`, Python `trt.get_plugin_registry().load_library(path)`):
 *   setLoggerFinder  TensorRT hands the library a way to find its logger;
 *   getCreators      every plugin creator of this library (one per plugin in plugins/).
 */
#include "tokenDepthwiseConv/tokenDepthwiseConvPlugin.h"

#include <atomic>
#include <cstdio>

#define EDGE_PLUGINS_EXPORT extern "C" __attribute__((visibility("default")))

namespace edge
{
namespace plugins
{
namespace
{
std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};
} // namespace

void logPluginMessage(nvinfer1::ILogger::Severity severity, std::string const& message) noexcept
{
    nvinfer1::ILoggerFinder* finder = gLoggerFinder.load();
    nvinfer1::ILogger* logger = finder ? finder->findLogger() : nullptr;
    if (logger)
        logger->log(severity, message.c_str());
    else
        std::fprintf(stderr, "[edge plugins] %s\n", message.c_str());
}

} // namespace plugins
} // namespace edge

EDGE_PLUGINS_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    edge::plugins::gLoggerFinder.store(finder);
}

EDGE_PLUGINS_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static edge::plugins::TokenDepthwiseConvPluginCreator tokenDepthwiseConv;
    static nvinfer1::IPluginCreatorInterface* const creators[] = {&tokenDepthwiseConv};
    nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}
