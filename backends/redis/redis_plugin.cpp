// Registration of the redis backend (built in when Boost.Asio is available).
#include "redis_backend.hpp"
#include "tier/plugin.hpp"
#include "redis_options.h"  // kPluginOptions, from options.json (libtier/plugins)

namespace {
constexpr tier_plugin kRedis = tier::make_backend_plugin<tier::redis::RedisBackend>(
    "redis", "Redis / Redis Cluster tier over Boost.Asio (shared by many nodes)", kPluginOptions);
}  // namespace

TIER_REGISTER_PLUGIN(redis, kRedis)
