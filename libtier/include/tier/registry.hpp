#pragma once
// The registry of backends, codecs and stage codecs, by name. Built-ins (the plugins Meson linked
// into libtier) register once, on first use of global(). External plugins are shared objects
// loaded with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) through the C ABI of tier/plugin.h.
//
// Plugin search for a bare name NAME: $TIER_PLUGIN_DIR (colon-separated), then `plugins/` beside
// libtier.so; files are libtier_backend_NAME.so, libtier_codec_NAME.so, libtier_stage_NAME.so.
// A name with a '/' or ending in ".so" is a path.
//
// Thread safety: register and load under an internal lock; lookups after start-up are read-only.

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tier/backend.hpp"
#include "tier/codec.hpp"
#include "tier/options.hpp"
#include "tier/plugin.h"

namespace tier {

enum class PluginKind : std::uint32_t { kBackend = 1, kCodec = 2, kStage = 3 };
std::string_view plugin_kind_name(PluginKind k) noexcept;

struct PluginInfo {
  PluginKind kind = PluginKind::kBackend;
  std::string name;
  std::string description;
  std::string source;  // "built-in" or the .so path
  std::vector<OptionSpec> options;
  const tier_plugin_v1* descriptor = nullptr;
  std::shared_ptr<void> library;  // keeps a dlopen'ed plugin loaded while objects live
};

// Deleter of plugin-made objects: calls the plugin's destroy and keeps its library loaded.
struct PluginDeleter {
  void (*destroy)(void*) = nullptr;
  std::shared_ptr<void> library;
  template <class T>
  void operator()(T* p) const noexcept {
    if (p != nullptr && destroy != nullptr) destroy(p);
  }
};
template <class T>
using PluginPtr = std::unique_ptr<T, PluginDeleter>;

class Registry {
 public:
  Registry() = default;
  // The process-wide registry, with the built-ins registered.
  static Registry& global();

  // Registers a descriptor. Errors: InvalidArgument (ABI version, malformed options schema,
  // a name already taken by the same kind).
  Status add(const tier_plugin_v1* descriptor, std::string source,
             std::shared_ptr<void> library = {});
  // Loads a plugin by name or path (see above) and registers it. Loading the same file twice is a
  // no-op. Errors: NotFound (no file), InvalidArgument (dlopen error, missing entry symbol,
  // ABI version mismatch), as add().
  Status load(std::string_view name_or_path, PluginKind kind_hint = PluginKind::kBackend);

  const PluginInfo* find(PluginKind kind, std::string_view name) const;
  std::vector<std::string> names(PluginKind kind) const;

  // Create objects from already-validated options (the Profile loader validates them).
  Result<PluginPtr<Backend>> create_backend(std::string_view type, const BackendContext& ctx) const;
  Result<PluginPtr<Codec>> create_codec(std::string_view type, const Json& options) const;
  Result<PluginPtr<StageCodec>> create_stage(std::string_view type, const Json& options) const;

 private:
  Result<void*> create_raw(PluginKind kind, std::string_view type, const void* ctx,
                           PluginDeleter* deleter) const;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<PluginInfo>> plugins_;
  std::vector<std::string> loaded_paths_;
};

}  // namespace tier
