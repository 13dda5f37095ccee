// Registration of the zstd stage codec (built in when libzstd is found).
#include "tier/plugin.hpp"
#include "zstd_stage.hpp"
#include "zstd_options.h"  // kPluginOptions, from options.json (libtier/plugins)

namespace {
constexpr tier_plugin kZstd = tier::make_stage_plugin<tier::zstd::ZstdStage>(
    "zstd", "lossless zstd stage; records the inner layout id and raw size", kPluginOptions);
}  // namespace

TIER_REGISTER_PLUGIN(zstd, kZstd)
