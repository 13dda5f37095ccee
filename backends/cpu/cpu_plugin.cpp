// Registration of the cpu backend (built in).
#include "cpu_backend.hpp"
#include "tier/plugin.hpp"

namespace {
constexpr const char kCpuOptions[] = R"JSON([
  {"name": "mode", "type": "enum", "choices": ["heap"], "default": "heap",
   "doc": "where objects live: heap = this process's memory"}
])JSON";
constexpr tier_plugin_v1 kCpu = tier::make_backend_plugin<tier::cpu::CpuBackend>(
    "cpu", "host-memory tier with exact LRU eviction", kCpuOptions);
}  // namespace

TIER_REGISTER_PLUGIN(cpu, kCpu)
