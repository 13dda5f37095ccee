// Registration of the disk backend (built in when liburing is found).
#include "disk_backend.hpp"
#include "tier/plugin.hpp"
#include "disk_options.h"  // kPluginOptions, from options.json (libtier/plugins)

namespace {
constexpr tier_plugin kDisk = tier::make_backend_plugin<tier::disk::DiskBackend>(
    "disk", "persistent io_uring disk tier (O_DIRECT, log-structured regions)", kPluginOptions);
}  // namespace

TIER_REGISTER_PLUGIN(disk, kDisk)
