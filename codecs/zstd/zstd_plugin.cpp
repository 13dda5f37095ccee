// Registration of the zstd stage codec (built in when libzstd is found).
#include "tier/plugin.hpp"
#include "zstd_stage.hpp"

namespace {
constexpr const char kZstdOptions[] = R"JSON([
  {"name": "level", "type": "int", "default": 3, "min": -7, "max": 22,
   "doc": "zstd compression level: negative = faster, up to 22 = smaller"},
  {"name": "max_raw_bytes", "type": "size", "default": "16GiB",
   "doc": "largest raw payload accepted; a stored object declaring more is treated as corrupt"}
])JSON";
constexpr tier_plugin kZstd = tier::make_stage_plugin<tier::zstd::ZstdStage>(
    "zstd", "lossless zstd stage; records the inner layout id and raw size", kZstdOptions);
}  // namespace

TIER_REGISTER_PLUGIN(zstd, kZstd)
