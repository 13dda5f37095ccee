// The dlopen entry point of one of libtier's own plugins: compiled into its shared module with
// -DTIER_PLUGIN_ID=<id>, it exports tier_plugin_entry() (tier/plugin.h) returning the
// descriptor that the plugin's TIER_REGISTER_PLUGIN(<id>, ...) defined.
#include "tier/plugin.hpp"

extern "C" const tier_plugin* TIER_PLUGIN_ENTRY_OF(TIER_PLUGIN_ID)(void);

extern "C" __attribute__((visibility("default"))) const tier_plugin* tier_plugin_entry(void) {
  return TIER_PLUGIN_ENTRY_OF(TIER_PLUGIN_ID)();
}
