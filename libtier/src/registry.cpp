#include "tier/registry.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "identity_codec.hpp"

namespace tier {
namespace fs = std::filesystem;

std::string_view plugin_kind_name(PluginKind k) noexcept {
  switch (k) {
    case PluginKind::kBackend: return "backend";
    case PluginKind::kCodec: return "codec";
    case PluginKind::kStage: return "stage";
  }
  return "unknown";
}

Registry& Registry::global() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never destroyed: plugins may outlive static destruction order
    Status s = r->add(identity_codec_plugin(), "built-in");
    if (!s) throw std::logic_error("the identity codec failed to register: " + s.to_string());
    return r;
  }();
  return *registry;
}

Status Registry::add(const tier_plugin* d, std::string source, std::shared_ptr<void> library) {
  return add_descriptor(d, std::move(source), std::move(library));
}

Status Registry::add_descriptor(const tier_plugin* d, std::string source,
                                std::shared_ptr<void> library) const {
  if (d == nullptr) return Status::invalid(fmt::format("{}: plugin descriptor is null", source));
  if (d->abi_version != TIER_PLUGIN_ABI_VERSION)
    return Status::invalid(fmt::format(
        "{}: plugin ABI version {} does not match libtier's {}; rebuild the plugin against "
        "this libtier",
        source, d->abi_version, TIER_PLUGIN_ABI_VERSION));
  if (d->kind < 1 || d->kind > 3)
    return Status::invalid(fmt::format("{}: unknown plugin kind {}", source, d->kind));
  if (d->name == nullptr || *d->name == '\0' || d->create == nullptr || d->destroy == nullptr)
    return Status::invalid(fmt::format("{}: plugin descriptor lacks a name, create or destroy",
                                       source));
  auto info = std::make_shared<PluginInfo>();
  info->kind = static_cast<PluginKind>(d->kind);
  info->name = d->name;
  info->description = d->description ? d->description : "";
  info->source = std::move(source);
  info->descriptor = d;
  info->library = std::move(library);
  try {
    info->options = parse_option_specs(d->options_json ? d->options_json : "[]");
  } catch (const std::exception& e) {
    return Status::invalid(fmt::format("{}: plugin \"{}\": {}", info->source, info->name,
                                       e.what()));
  }
  std::lock_guard lock(mu_);
  for (const auto& p : plugins_)
    if (p->kind == info->kind && p->name == info->name)
      return Status::invalid(fmt::format("{}: a {} named \"{}\" is already registered (from {})",
                                         info->source, plugin_kind_name(info->kind), info->name,
                                         p->source));
  plugins_.push_back(std::move(info));
  return Status::ok();
}

namespace {

std::vector<fs::path> search_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("TIER_PLUGIN_DIR")) {
    std::string_view s(env);
    while (!s.empty()) {
      auto p = s.find(':');
      if (p != 0) dirs.emplace_back(std::string(s.substr(0, p)));
      if (p == std::string_view::npos) break;
      s.remove_prefix(p + 1);
    }
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&search_dirs), &info) != 0 && info.dli_fname != nullptr) {
    fs::path libdir = fs::path(info.dli_fname).parent_path();
    dirs.push_back(libdir / "plugins");             // the build tree (build/libtier/plugins)
    dirs.push_back(libdir / "libtier" / "plugins");  // installed: <libdir>/libtier/plugins
  }
  return dirs;
}

std::string plugin_file_name(PluginKind kind, std::string_view name) {
  return fmt::format("libtier_{}_{}.so", plugin_kind_name(kind), name);
}

// A bare name can only name a plugin file: no path separators, no "..", no hidden files.
bool is_plugin_name(std::string_view name) {
  if (name.empty() || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace

Status Registry::load(std::string_view name_or_path, PluginKind kind_hint) {
  TIER_ASSIGN_OR_RETURN(fs::path file, locate(name_or_path, kind_hint));
  return load_file(file);
}

Result<fs::path> Registry::locate(std::string_view name_or_path, PluginKind kind_hint) const {
  std::string target(name_or_path);
  fs::path file;
  std::vector<std::string> tried;
  if (target.find('/') != std::string::npos) {  // a path: taken as given
    file = target;
    tried.push_back(target);
    if (!fs::exists(file)) file.clear();
  } else {  // a name or a file name: only in the plugin directories, never the working directory
    const bool file_name = target.size() > 3 && target.ends_with(".so");
    const PluginKind kinds[] = {kind_hint, PluginKind::kBackend, PluginKind::kCodec,
                                PluginKind::kStage};
    for (const fs::path& dir : search_dirs()) {
      for (PluginKind k : kinds) {
        fs::path candidate = dir / (file_name ? target : plugin_file_name(k, target));
        tried.push_back(candidate.string());
        if (file.empty() && fs::exists(candidate)) file = candidate;
        if (file_name) break;
      }
    }
  }
  if (file.empty())
    return Status::not_found(fmt::format(
        "plugin \"{}\" not found (looked for: {}); set TIER_PLUGIN_DIR or give a path", target,
        fmt::join(tried, ", ")));
  return file;
}

Status Registry::load_file(const std::filesystem::path& file) const {
  std::string canonical = fs::weakly_canonical(file).string();
  {
    std::lock_guard lock(mu_);
    if (std::find(loaded_paths_.begin(), loaded_paths_.end(), canonical) != loaded_paths_.end())
      return Status::ok();
  }
  // dlopen of a FIFO (or a device) would block or act: only a regular file is a plugin.
  std::error_code ec;
  if (!fs::is_regular_file(canonical, ec))
    return Status::invalid(fmt::format("cannot load plugin {}: not a regular file", canonical));
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr)
    return Status::invalid(fmt::format("cannot load plugin {}: {}", canonical, dlerror()));
  std::shared_ptr<void> library(handle, [](void* h) { dlclose(h); });
  auto entry = reinterpret_cast<tier_plugin_entry_fn>(dlsym(handle, TIER_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr)
    return Status::invalid(fmt::format("plugin {} does not export {}(); is it a libtier plugin?",
                                       canonical, TIER_PLUGIN_ENTRY_SYMBOL));
  TIER_RETURN_IF_ERROR(add_descriptor(entry(), canonical, library));
  std::lock_guard lock(mu_);
  loaded_paths_.push_back(canonical);
  return Status::ok();
}

const PluginInfo* Registry::find_registered(PluginKind kind, std::string_view name) const {
  std::lock_guard lock(mu_);
  for (const auto& p : plugins_)
    if (p->kind == kind && p->name == name) return p.get();
  return nullptr;
}

const PluginInfo* Registry::find(PluginKind kind, std::string_view name) const {
  if (const PluginInfo* info = find_registered(kind, name)) return info;
  if (!is_plugin_name(name)) return nullptr;
  for (const fs::path& dir : search_dirs()) {
    fs::path file = dir / plugin_file_name(kind, name);
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;
    Status loaded = load_file(file);
    if (loaded) return find_registered(kind, name);
    std::lock_guard lock(mu_);
    load_errors_[plugin_file_name(kind, name)] = loaded.to_string();
    return nullptr;
  }
  return nullptr;
}

std::string Registry::load_error(PluginKind kind, std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = load_errors_.find(plugin_file_name(kind, name));
  return it == load_errors_.end() ? std::string() : it->second;
}

std::vector<std::string> Registry::names(PluginKind kind) const {
  std::vector<std::string> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& p : plugins_)
      if (p->kind == kind) out.push_back(p->name);
  }
  std::string prefix = fmt::format("libtier_{}_", plugin_kind_name(kind));
  for (const fs::path& dir : search_dirs()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      std::string file = entry.path().filename().string();
      if (file.size() > prefix.size() + 3 && file.starts_with(prefix) && file.ends_with(".so"))
        out.push_back(file.substr(prefix.size(), file.size() - prefix.size() - 3));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Result<void*> Registry::create_raw(PluginKind kind, std::string_view type, const void* ctx,
                                   PluginDeleter* deleter) const {
  const PluginInfo* info = find(kind, type);
  if (info == nullptr) {
    std::string why = load_error(kind, type);
    if (!why.empty())
      return Status::invalid(fmt::format("{} \"{}\": its plugin failed to load: {}",
                                         plugin_kind_name(kind), type, why));
    return Status::invalid(fmt::format("unknown {} \"{}\"; registered: {}",
                                       plugin_kind_name(kind), type,
                                       fmt::join(names(kind), ", ")));
  }
  char error[512] = {0};
  void* obj = info->descriptor->create(ctx, error, sizeof error);
  if (obj == nullptr) {
    // create() errors cross the C edge as "<code name>: <message>" (Status::to_string), so a
    // NotSupported (no GPU, no io_uring) stays NotSupported; a plain message is InvalidArgument.
    std::string_view e = error[0] ? error : "no reason given";
    Code code = Code::kInvalidArgument;
    for (int c = 1; c <= static_cast<int>(Code::kNoSpace); ++c) {
      std::string_view name = code_name(static_cast<Code>(c));
      if (e.size() > name.size() + 2 && e.substr(0, name.size()) == name &&
          e.substr(name.size(), 2) == ": ") {
        code = static_cast<Code>(c);
        e.remove_prefix(name.size() + 2);
        break;
      }
    }
    return Status(code, fmt::format("{} \"{}\" failed to start: {}", plugin_kind_name(kind),
                                    type, e));
  }
  deleter->destroy = info->descriptor->destroy;
  deleter->library = info->library;
  return obj;
}

Result<PluginPtr<Backend>> Registry::create_backend(std::string_view type,
                                                    const BackendContext& ctx) const {
  PluginDeleter d;
  TIER_ASSIGN_OR_RETURN(void* obj, create_raw(PluginKind::kBackend, type, &ctx, &d));
  return PluginPtr<Backend>(static_cast<Backend*>(obj), std::move(d));
}

Result<PluginPtr<Codec>> Registry::create_codec(std::string_view type, const Json& options) const {
  PluginDeleter d;
  TIER_ASSIGN_OR_RETURN(void* obj, create_raw(PluginKind::kCodec, type, &options, &d));
  return PluginPtr<Codec>(static_cast<Codec*>(obj), std::move(d));
}

Result<PluginPtr<StageCodec>> Registry::create_stage(std::string_view type,
                                                     const Json& options) const {
  PluginDeleter d;
  TIER_ASSIGN_OR_RETURN(void* obj, create_raw(PluginKind::kStage, type, &options, &d));
  return PluginPtr<StageCodec>(static_cast<StageCodec*>(obj), std::move(d));
}

}  // namespace tier
