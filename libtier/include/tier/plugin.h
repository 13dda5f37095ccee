/* libtier plugin C ABI (the version a plugin speaks: TIER_PLUGIN_ABI_VERSION below).
 *
 * A plugin is a shared object that exports
 *
 *   const struct tier_plugin* tier_plugin_entry(void);
 *
 * returning a static descriptor. The core checks `abi_version` before reading anything else and
 * refuses a mismatch or a missing symbol with a clear error. `create` and `destroy` cross the
 * edge as C function pointers; the objects they make are C++ objects of the core's headers
 * (tier::Backend, tier::Codec, tier::StageCodec), so a plugin must be built against the same
 * libtier headers and the same libstdc++ ABI as the core (as with NIXL's plugins).
 * No exception may cross this edge: `create` reports failure by returning NULL and writing a
 * message into `error`.
 */
#ifndef TIER_PLUGIN_H_
#define TIER_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What each ABI number added: 2: Codec::direct(); 3: PayloadCheck::check_head(); 4:
 * Backend::do_list_keys(); 5: the thread-safe Backend base, Capabilities::concurrent; 6:
 * IoRequest::batch_bytes. */
#define TIER_PLUGIN_ABI_VERSION 6u
#define TIER_PLUGIN_ENTRY_SYMBOL "tier_plugin_entry"

enum tier_plugin_kind {
  TIER_PLUGIN_BACKEND = 1, /* create() returns tier::Backend*    */
  TIER_PLUGIN_CODEC = 2,   /* create() returns tier::Codec*      */
  TIER_PLUGIN_STAGE = 3,   /* create() returns tier::StageCodec* */
};

struct tier_plugin {
  uint32_t abi_version; /* TIER_PLUGIN_ABI_VERSION */
  uint32_t kind;        /* enum tier_plugin_kind */
  const char* name;     /* registry name, e.g. "disk" */
  const char* description;
  /* JSON array of option specs: [{"name","type","default","doc","min","max","choices"}].
   * Types: bool, uint, int, double, string, path, size, duration, enum. No "default" = required. */
  const char* options_json;
  /* `context` is a const tier::BackendContext* for backends, a const tier::Json* (the validated
   * options) for codecs and stages. Returns NULL on failure with a message in `error`. */
  void* (*create)(const void* context, char* error, size_t error_len);
  void (*destroy)(void* object);
};

typedef const struct tier_plugin* (*tier_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TIER_PLUGIN_H_ */
