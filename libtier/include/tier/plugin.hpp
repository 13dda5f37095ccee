#pragma once
// C++ side of the plugin edge: builds a tier_plugin descriptor from a class, with concepts
// that turn a wrong plugin class into a readable compile error, and thunks that keep exceptions
// from crossing the edge.
//
//   final class DiskBackend : public tier::Backend {
//    public:
//     static tier::Result<std::unique_ptr<DiskBackend>> create(const tier::BackendContext&);
//   };
//   constexpr tier_plugin kDisk = tier::make_backend_plugin<DiskBackend>(
//       "disk", "io_uring disk tier", kDiskOptions);
//   TIER_REGISTER_PLUGIN(disk, kDisk)
//
// A third-party plugin is compiled with -DTIER_BUILD_AS_PLUGIN (docs/plugins.md).

#include <concepts>
#include <cstdio>
#include <exception>
#include <memory>
#include <type_traits>

#include "tier/backend.hpp"
#include "tier/codec.hpp"
#include "tier/json.hpp"
#include "tier/plugin.h"

namespace tier {

template <class B>
concept backend_plugin = std::derived_from<B, Backend> && std::is_final_v<B> &&
                         requires(const BackendContext& c) {
                           { B::create(c) } -> std::same_as<Result<std::unique_ptr<B>>>;
                         };
template <class C>
concept codec_plugin = std::derived_from<C, Codec> && std::is_final_v<C> &&
                       requires(const Json& options) {
                         { C::create(options) } -> std::same_as<Result<std::unique_ptr<C>>>;
                       };
template <class S>
concept stage_plugin = std::derived_from<S, StageCodec> && std::is_final_v<S> &&
                       requires(const Json& options) {
                         { S::create(options) } -> std::same_as<Result<std::unique_ptr<S>>>;
                       };

namespace detail {
inline void copy_error(const std::string& msg, char* out, std::size_t n) noexcept {
  if (n == 0) return;
  std::snprintf(out, n, "%s", msg.c_str());
}
template <class T, class Base, class Ctx>
void* create_thunk(const void* ctx, char* err, std::size_t n) noexcept {
  try {
    auto r = T::create(*static_cast<const Ctx*>(ctx));
    if (!r) {
      copy_error(r.status().to_string(), err, n);  // "<code name>: <message>"
      return nullptr;
    }
    return static_cast<Base*>(std::move(r).value().release());
  } catch (const std::exception& e) {
    copy_error(e.what(), err, n);
  } catch (...) {
    copy_error("unknown exception in plugin create()", err, n);
  }
  return nullptr;
}
template <class Base>
void destroy_thunk(void* p) noexcept {
  delete static_cast<Base*>(p);
}
}  // namespace detail

template <backend_plugin B>
constexpr tier_plugin make_backend_plugin(const char* name, const char* description,
                                             const char* options_json) {
  return {TIER_PLUGIN_ABI_VERSION, TIER_PLUGIN_BACKEND, name, description, options_json,
          &detail::create_thunk<B, Backend, BackendContext>, &detail::destroy_thunk<Backend>};
}
template <codec_plugin C>
constexpr tier_plugin make_codec_plugin(const char* name, const char* description,
                                           const char* options_json) {
  return {TIER_PLUGIN_ABI_VERSION, TIER_PLUGIN_CODEC, name, description, options_json,
          &detail::create_thunk<C, Codec, Json>, &detail::destroy_thunk<Codec>};
}
template <stage_plugin S>
constexpr tier_plugin make_stage_plugin(const char* name, const char* description,
                                           const char* options_json) {
  return {TIER_PLUGIN_ABI_VERSION, TIER_PLUGIN_STAGE, name, description, options_json,
          &detail::create_thunk<S, StageCodec, Json>, &detail::destroy_thunk<StageCodec>};
}

}  // namespace tier

// TIER_REGISTER_PLUGIN(id, descriptor) defines `tier_plugin_entry_<id>()`. A plugin compiled
// with TIER_BUILD_AS_PLUGIN also exports `tier_plugin_entry()`, the symbol the registry's dlopen
// looks for. libtier's own plugins are compiled once without it and get their
// `tier_plugin_entry()` from libtier/plugins/entry.cpp (shared module) or register themselves
// from libtier/plugins/static_entry.cpp (linked statically): the same descriptor either way.
#define TIER_PLUGIN_ENTRY_PASTE(id) tier_plugin_entry_##id
#define TIER_PLUGIN_ENTRY_OF(id) TIER_PLUGIN_ENTRY_PASTE(id)  // expands `id` first
#if defined(TIER_BUILD_AS_PLUGIN)
#define TIER_REGISTER_PLUGIN(id, descriptor)                                                      \
  extern "C" const tier_plugin* TIER_PLUGIN_ENTRY_OF(id)(void) { return &(descriptor); }       \
  extern "C" __attribute__((visibility("default"))) const tier_plugin* tier_plugin_entry(void) { \
    return &(descriptor);                                                                         \
  }
#else
#define TIER_REGISTER_PLUGIN(id, descriptor) \
  extern "C" const tier_plugin* TIER_PLUGIN_ENTRY_OF(id)(void) { return &(descriptor); }
#endif
