// Registration of the gpu backend (built in when a GPU compiler is found; see backends/gpu/meson.build).
#include "gpu_backend.hpp"
#include "tier/plugin.hpp"
#include "gpu_options.h"  // kPluginOptions, from options.json (libtier/plugins)

namespace {
constexpr tier_plugin kGpu = tier::make_backend_plugin<tier::gpu::GpuBackend>(
    "gpu", "device-memory tier with exact LRU eviction, moved by GPU DMA", kPluginOptions);
}  // namespace

TIER_REGISTER_PLUGIN(gpu, kGpu)
