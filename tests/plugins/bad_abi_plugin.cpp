// A plugin built for another ABI version: the core must refuse it with a clear error.
#include "tier/plugin.h"

namespace {
void* create(const void*, char*, size_t) { return nullptr; }
void destroy(void*) {}
const tier_plugin kBad = {TIER_PLUGIN_ABI_VERSION + 1, TIER_PLUGIN_BACKEND, "badabi",
                             "wrong ABI", "[]", &create, &destroy};
}  // namespace

extern "C" __attribute__((visibility("default"))) const tier_plugin* tier_plugin_entry(void) {
  return &kBad;
}
