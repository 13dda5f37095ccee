// A shared object that is not a libtier plugin: it lacks tier_plugin_entry.
extern "C" __attribute__((visibility("default"))) int not_a_plugin(void) { return 1; }
