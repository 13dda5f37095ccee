#pragma once
// libtier speaks JSON through nlohmann::json (Debian 12: 3.11.2, whose ABI-tagged inline namespace
// makes a plugin built against another version fail to link instead of misbehaving).
#include <nlohmann/json.hpp>

namespace tier {
using Json = nlohmann::json;
}  // namespace tier
