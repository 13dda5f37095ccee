// Static registration of one of libtier's own plugins: linked whole into a program (Meson option
// static_plugins, and the tests that use a plugin's internals), compiled with
// -DTIER_PLUGIN_ID=<id>, it registers the plugin's descriptor with the global registry before
// main() runs, with source "static". A failure to register is a build mistake (two copies of one
// plugin): it aborts with the registry's message.
#include <cstdio>
#include <cstdlib>

#include "tier/plugin.hpp"
#include "tier/registry.hpp"

extern "C" const tier_plugin* TIER_PLUGIN_ENTRY_OF(TIER_PLUGIN_ID)(void);

namespace {
const bool kRegistered = [] {
  tier::Status s = tier::Registry::global().add(TIER_PLUGIN_ENTRY_OF(TIER_PLUGIN_ID)(), "static");
  if (!s) {
    std::fprintf(stderr, "libtier: static plugin registration failed: %s\n", s.to_string().c_str());
    std::abort();
  }
  return true;
}();
}  // namespace
