#pragma once
// The registry of backends, codecs and stage codecs, by name. The core registers only its identity
// codec; every other plugin, libtier's own backends and codecs included, is a shared object
// loaded with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) through the C ABI of tier/plugin.h,
// or linked statically into the program, which registers it before main() (source "static").
//
// A lookup of a name that is not registered loads the plugin of that name and kind from the
// plugin directories, once: $TIER_PLUGIN_DIR (colon-separated), then `plugins/` beside
// libtier.so (the build tree), then `libtier/plugins/` beside it (installed). Files are
// libtier_backend_NAME.so, libtier_codec_NAME.so, libtier_stage_NAME.so. For load(), a name with
// a '/' is a path; a bare file name ending in ".so" is looked for in the plugin directories, never
// in the working directory.
//
// Thread safety: every member function may be called from any thread; registration, loading
// and lookups take an internal lock (a lookup that loads a plugin holds it only around the
// registration, not around dlopen).

#include <filesystem>
#include <map>
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
  const tier_plugin* descriptor = nullptr;
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
  Status add(const tier_plugin* descriptor, std::string source,
             std::shared_ptr<void> library = {});
  // Loads a plugin by name or path (see above) and registers it. Loading the same file twice is a
  // no-op. Errors: NotFound (no file), InvalidArgument (dlopen error, missing entry symbol,
  // ABI version mismatch), as add().
  Status load(std::string_view name_or_path, PluginKind kind_hint = PluginKind::kBackend);
  // The file load() would open for `name_or_path`, found the same way, without opening it.
  // Errors: NotFound, listing every place looked at.
  Result<std::filesystem::path> locate(std::string_view name_or_path,
                                       PluginKind kind_hint = PluginKind::kBackend) const;

  // The plugin of that kind and name, loading it from the plugin directories when it is not
  // registered yet; null when there is none (or it fails to load: load() says why).
  const PluginInfo* find(PluginKind kind, std::string_view name) const;
  // The plugin of that kind and name if it is registered already; never loads anything.
  const PluginInfo* find_registered(PluginKind kind, std::string_view name) const;
  // Why the plugin file of that kind and name failed to load when find() tried it (the
  // Status::to_string of the failure), or empty.
  std::string load_error(PluginKind kind, std::string_view name) const;
  // Registered names and the names of the plugin files in the plugin directories, sorted.
  std::vector<std::string> names(PluginKind kind) const;

  // Create objects from already-validated options (the Profile loader validates them).
  Result<PluginPtr<Backend>> create_backend(std::string_view type, const BackendContext& ctx) const;
  Result<PluginPtr<Codec>> create_codec(std::string_view type, const Json& options) const;
  Result<PluginPtr<StageCodec>> create_stage(std::string_view type, const Json& options) const;

 private:
  Result<void*> create_raw(PluginKind kind, std::string_view type, const void* ctx,
                           PluginDeleter* deleter) const;
  Status add_descriptor(const tier_plugin* descriptor, std::string source,
                        std::shared_ptr<void> library) const;
  Status load_file(const std::filesystem::path& file) const;

  // Mutable: a const lookup may load a plugin from the plugin directories (filling the cache of
  // what those directories hold; what a name means does not change).
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<PluginInfo>> plugins_;
  mutable std::vector<std::string> loaded_paths_;
  mutable std::map<std::string, std::string> load_errors_;  // plugin file name -> why
};

}  // namespace tier
