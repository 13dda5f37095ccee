// Registration of the gpu backend (built in when a GPU compiler is found; see backends/gpu/meson.build).
#include "gpu_backend.hpp"
#include "tier/plugin.hpp"

namespace {
constexpr const char kGpuOptions[] = R"JSON([
  {"name": "device", "type": "uint", "default": 0, "max": 63,
   "doc": "GPU ordinal whose memory holds the tier"},
  {"name": "pinned_staging_bytes", "type": "size", "default": "8MiB", "min": 4096,
   "doc": "size of each pinned host buffer that pageable puts and gets bounce through"},
  {"name": "pinned_staging_buffers", "type": "uint", "default": 4, "max": 1024,
   "doc": "number of pinned bounce buffers (0: pageable buffers are copied by the runtime)"}
])JSON";
constexpr tier_plugin kGpu = tier::make_backend_plugin<tier::gpu::GpuBackend>(
    "gpu", "device-memory tier with exact LRU eviction, moved by GPU DMA", kGpuOptions);
}  // namespace

TIER_REGISTER_PLUGIN(gpu, kGpu)
