#pragma once
// libtier's version: the Meson project's, "0.1.0" (CHANGELOG.md lists what each version changed).

#include <string_view>

namespace tier {

// The version of the loaded libtier.so (tier_version() in the C API returns the same text).
std::string_view version() noexcept;

}  // namespace tier
