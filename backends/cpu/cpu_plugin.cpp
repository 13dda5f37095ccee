// Registration of the cpu backend (built in).
#include "cpu_backend.hpp"
#include "tier/plugin.hpp"
#include "cpu_options.h"  // kPluginOptions, from options.json (libtier/plugins)

namespace {
constexpr tier_plugin kCpu = tier::make_backend_plugin<tier::cpu::CpuBackend>(
    "cpu", "host-memory tier with LRU eviction, in the heap or in shared memory, optionally pinned for GPU DMA", kPluginOptions);
}  // namespace

TIER_REGISTER_PLUGIN(cpu, kCpu)
