#include "tier/version.hpp"

namespace tier {

std::string_view version() noexcept { return TIER_VERSION_STRING; }

}  // namespace tier
