#include "tier/profile.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <span>
#include <sstream>

namespace tier {
namespace {

// ---- Step 1: read the document (pure: no registry, no plugin) -----------------------------------

// A backend or stage as a tier names it: "type" or {"type": ..., options...}. The type is checked
// against the registry only in step 3, once the profile's plugins are loaded.
struct PluginRef {
  std::string type;
  Json options = Json::object();  // as given, without "type"
  std::string path;               // JSON pointer of the reference
  bool is_object = false;         // an unknown type is then reported at path + "/type"
};

// One tier as read from the document; its spec lacks the plugin types and options.
struct TierDraft {
  std::string path;  // "/tiers/<i>"
  TierSpec spec;
  std::optional<PluginRef> backend;
  std::optional<PluginRef> stage;
};

struct PluginEntry {
  std::string path;  // "/plugins/<i>"
  std::string name;  // name or .so path, ${VAR} expanded
};

// What step 1 reads: the stack options in `profile`, the plugins to load, the tiers to check.
struct ProfileDraft {
  Profile profile;
  std::vector<PluginEntry> plugins;
  std::vector<TierDraft> tiers;
};

// One key of a profile object. The tables below drive reading, the unknown-key hints and
// profile_schema_json().
template <class Target>
struct KeySpec {
  std::string_view name;
  std::string_view type;  // for the schema: "string", "size", ...
  std::string_view doc;
  // Non-empty: the key is required, and a missing one is reported as
  // "required key is missing (<missing>)".
  std::string_view missing;
  // Checks the value and stores it in `target`; errors are reported at `path`.
  void (*read)(const Json& value, const std::string& path, Target& target, ConfigErrors& errors);
};

void report_unknown_keys(const Json& obj, std::span<const std::string> allowed,
                         const std::string& path, ConfigErrors& errors) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end()) continue;
    std::string hint = did_you_mean(it.key(), allowed);
    errors.add(path + "/" + it.key(),
               hint.empty()
                   ? fmt::format("unknown key \"{}\"", it.key())
                   : fmt::format("unknown key \"{}\"; did you mean \"{}\"?", it.key(), hint));
  }
}

// Reads the object `obj` at `path` key by key, as `keys` says.
template <class Target>
void read_object(const Json& obj, const std::string& path, std::span<const KeySpec<Target>> keys,
                 Target& target, ConfigErrors& errors) {
  std::vector<std::string> names;
  for (const auto& key : keys) names.emplace_back(key.name);
  report_unknown_keys(obj, names, path, errors);
  for (const auto& key : keys) {
    std::string name(key.name);
    std::string key_path = path + "/" + name;
    if (obj.contains(name)) {
      key.read(obj[name], key_path, target, errors);
    } else if (!key.missing.empty()) {
      errors.add(key_path, fmt::format("required key is missing ({})", key.missing));
    }
  }
}

template <class Target>
Json key_table_json(std::span<const KeySpec<Target>> keys) {
  Json arr = Json::array();
  for (const auto& key : keys)
    arr.push_back({{"name", std::string(key.name)},
                   {"type", std::string(key.type)},
                   {"required", !key.missing.empty()},
                   {"doc", std::string(key.doc)}});
  return arr;
}

std::optional<std::string> read_string(const Json& v, const std::string& path,
                                       ConfigErrors& errors) {
  if (!v.is_string()) {
    errors.add(path, "expected a string, got " + describe_json(v));
    return std::nullopt;
  }
  return errors.value_or_add(path, expand_env(v.get<std::string>()));
}

std::optional<bool> read_bool(const Json& v, const std::string& path, ConfigErrors& errors) {
  if (v.is_boolean()) return v.get<bool>();
  errors.add(path, "expected true or false, got " + describe_json(v));
  return std::nullopt;
}

std::optional<PluginRef> read_plugin_ref(const Json& v, const std::string& path, PluginKind kind,
                                         ConfigErrors& errors) {
  PluginRef ref{.path = path, .is_object = v.is_object()};
  if (v.is_string()) {
    ref.type = v.get<std::string>();
    return ref;
  }
  if (!v.is_object()) {
    errors.add(path, fmt::format("expected a {} name or an object with \"type\", got {}",
                                 plugin_kind_name(kind), describe_json(v)));
    return std::nullopt;
  }
  if (!v.contains("type")) {
    errors.add(path + "/type",
               fmt::format("required key is missing (a {} name)", plugin_kind_name(kind)));
    return std::nullopt;
  }
  if (!v["type"].is_string()) {
    errors.add(path + "/type", "expected a string, got " + describe_json(v["type"]));
    return std::nullopt;
  }
  ref.type = v["type"].get<std::string>();
  ref.options = v;
  ref.options.erase("type");
  return ref;
}

void read_capacity(const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
  Json size = v;
  if (v.is_string()) {
    auto expanded = errors.value_or_add(path, expand_env(v.get<std::string>()));
    if (!expanded) return;
    size = *expanded;
  }
  auto bytes = parse_size(size);
  if (!bytes || *bytes == 0) {
    errors.add(path, "expected a size like \"64GiB\", got " + describe_json(v));
    return;
  }
  tier.spec.capacity_bytes = *bytes;
}

constexpr KeySpec<TierDraft> kTierKeys[] = {
    {"name", "string", "the tier's name, unique in the profile", "the tier's name, e.g. \"cpu\"",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       auto name = read_string(v, path, errors);
       if (!name) return;
       if (name->empty()) errors.add(path, "expected a non-empty string, got \"\"");
       tier.spec.name = *name;
     }},
    {"capacity", "size", "bytes the tier may hold, e.g. \"64GiB\"", "a size like \"64GiB\"",
     read_capacity},
    {"backend", "plugin", "the backend: a name, or {\"type\": name, ...its options}",
     "e.g. {\"type\": \"cpu\"}",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       tier.backend = read_plugin_ref(v, path, PluginKind::kBackend, errors);
     }},
    {"stage", "plugin", "a stage codec applied to payloads in this tier (null: raw)", "",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       if (!v.is_null()) tier.stage = read_plugin_ref(v, path, PluginKind::kStage, errors);
     }},
    {"read", "bool", "lookups read this tier (default true)", "",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       if (auto b = read_bool(v, path, errors)) tier.spec.read = *b;
     }},
    {"write", "bool", "stores write this tier (default true)", "",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       if (auto b = read_bool(v, path, errors)) tier.spec.write = *b;
     }},
    {"optional", "bool",
     "left out, instead of failing the stack, when its backend cannot run here (default false)", "",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       if (auto b = read_bool(v, path, errors)) tier.spec.optional = *b;
     }},
    {"on_evict", "enum", "\"demote\" (to the next tier, the default) or \"drop\"", "",
     [](const Json& v, const std::string& path, TierDraft& tier, ConfigErrors& errors) {
       if (v == Json("demote"))
         tier.spec.on_evict = EvictPolicy::kDemote;
       else if (v == Json("drop"))
         tier.spec.on_evict = EvictPolicy::kDrop;
       else
         errors.add(path, "expected one of \"demote\", \"drop\", got " + describe_json(v));
     }},
};

const std::vector<OptionSpec>& stack_specs() {
  static const std::vector<OptionSpec> specs = parse_option_specs(R"JSON([
    {"name": "max_inflight_bytes", "type": "size", "default": "256MiB", "min": 1,
     "doc": "bytes of background writes (write-through, demotion, promotion) in flight at once; a write that does not fit is dropped and counted"},
    {"name": "op_timeout", "type": "duration", "default": "10s", "min": 1000,
     "doc": "longest wait for one tier to complete a foreground request"}
  ])JSON");
  return specs;
}

void read_plugins(const Json& v, const std::string& path, ProfileDraft& draft,
                  ConfigErrors& errors) {
  if (!v.is_array()) {
    errors.add(path, "expected an array of plugin names or paths, got " + describe_json(v));
    return;
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string entry_path = fmt::format("{}/{}", path, i);
    if (auto name = read_string(v[i], entry_path, errors))
      draft.plugins.push_back({entry_path, *name});
  }
}

void read_stack(const Json& v, const std::string& path, ProfileDraft& draft, ConfigErrors& errors) {
  Json stack = resolve_options(v, stack_specs(), path, errors);
  if (stack.contains("max_inflight_bytes"))
    draft.profile.max_inflight_bytes = stack["max_inflight_bytes"];
  if (stack.contains("op_timeout")) draft.profile.op_timeout_us = stack["op_timeout"];
}

const std::vector<OptionSpec>& metrics_specs() {
  static const std::vector<OptionSpec> specs = parse_option_specs(R"JSON([
    {"name": "listen", "type": "string", "default": "127.0.0.1:9464",
     "doc": "address:port of the HTTP endpoint serving GET /metrics (Prometheus text): an IPv4 address, [IPv6] or localhost; port 0 picks a free port; a loopback address unless allow_remote"},
    {"name": "allow_remote", "type": "bool", "default": false,
     "doc": "allow a listen address other than a loopback one: the counters are then served to anyone who can connect"},
    {"name": "timeout", "type": "duration", "default": "5s", "min": 1000, "max": 60000000,
     "doc": "longest a request may take to arrive and its answer to be sent; a slower client is disconnected"},
    {"name": "max_connections", "type": "uint", "default": 16, "min": 1, "max": 1024,
     "doc": "connections served at once; a connection beyond them is closed at once"}
  ])JSON");
  return specs;
}

const std::vector<OptionSpec>& log_specs() {
  static const std::vector<OptionSpec> specs = parse_option_specs(R"JSON([
    {"name": "level", "type": "enum", "choices": ["error", "warn", "info", "debug", "off"],
     "default": "warn",
     "doc": "libtier's log level for the process, applied when a stack opens this profile, unless TIER_LOG_LEVEL or the program set one (docs/logging.md)"}
  ])JSON");
  return specs;
}

// "host:port" into `m`: host an IPv4 literal, "[IPv6]" or "localhost". Returns the error, or "".
std::string parse_listen(const std::string& text, MetricsEndpoint& m) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos)
    return fmt::format("expected address:port like \"127.0.0.1:9464\", got \"{}\"", text);
  std::string host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  unsigned long p = 0;
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      (p = std::stoul(port)) > 65535)
    return fmt::format("port \"{}\" is not a number in [0, 65535]", port);
  if (host == "localhost") host = "127.0.0.1";
  bool loopback = false;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr a6{};
    if (inet_pton(AF_INET6, host.c_str(), &a6) != 1)
      return fmt::format("\"{}\" is not an IPv6 address", host);
    loopback = IN6_IS_ADDR_LOOPBACK(&a6);
  } else {
    in_addr a4{};
    if (inet_pton(AF_INET, host.c_str(), &a4) != 1)
      return fmt::format(
          "\"{}\" is not an IPv4 address, [IPv6] or localhost (names are not resolved)", host);
    loopback = (ntohl(a4.s_addr) >> 24) == 127;
  }
  if (!loopback && !m.allow_remote)
    return fmt::format(
        "{} is not a loopback address: anyone who can connect would read the counters; set "
        "\"allow_remote\": true to listen there",
        host);
  m.host = host;
  m.port = static_cast<std::uint16_t>(p);
  return "";
}

void read_metrics(const Json& v, const std::string& path, ProfileDraft& draft,
                  ConfigErrors& errors) {
  const std::size_t before = errors.list().size();
  Json m = resolve_options(v, metrics_specs(), path, errors);
  if (errors.list().size() != before) return;
  MetricsEndpoint& out = draft.profile.metrics;
  out.enabled = true;
  out.allow_remote = m["allow_remote"].get<bool>();
  out.timeout_us = m["timeout"].get<std::uint64_t>();
  out.max_connections = m["max_connections"].get<std::uint32_t>();
  if (std::string why = parse_listen(m["listen"].get<std::string>(), out); !why.empty())
    errors.add(path + "/listen", why);
}

void read_log(const Json& v, const std::string& path, ProfileDraft& draft, ConfigErrors& errors) {
  const std::size_t before = errors.list().size();
  Json l = resolve_options(v, log_specs(), path, errors);
  if (errors.list().size() != before) return;
  draft.profile.log_level = parse_log_level(l["level"].get<std::string>()).value();
}

void read_tiers(const Json& v, const std::string& path, ProfileDraft& draft, ConfigErrors& errors) {
  if (!v.is_array() || v.empty()) {
    errors.add(path, "expected a non-empty array of tiers, got " + describe_json(v));
    return;
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    TierDraft tier{.path = fmt::format("{}/{}", path, i)};
    if (!v[i].is_object()) {
      errors.add(tier.path, "expected a tier object, got " + describe_json(v[i]));
      continue;
    }
    read_object<TierDraft>(v[i], tier.path, kTierKeys, tier, errors);
    draft.tiers.push_back(std::move(tier));
  }
}

constexpr KeySpec<ProfileDraft> kProfileKeys[] = {
    {"version", "integer", "the profile format; only 1 exists", "",
     [](const Json& v, const std::string& path, ProfileDraft&, ConfigErrors& errors) {
       if (v != Json(1)) errors.add(path, "expected 1, got " + describe_json(v));
     }},
    {"description", "string", "free text for people", "",
     [](const Json& v, const std::string& path, ProfileDraft&, ConfigErrors& errors) {
       if (!v.is_string()) errors.add(path, "expected a string, got " + describe_json(v));
     }},
    {"plugins", "array of strings",
     "plugin names or .so paths, loaded before the tiers' backends and stages are checked", "",
     read_plugins},
    {"stack", "object", "options of the tier stack: max_inflight_bytes, op_timeout", "",
     read_stack},
    {"metrics", "object",
     "an HTTP endpoint serving GET /metrics: listen, allow_remote, timeout, max_connections "
     "(docs/metrics.md)",
     "", read_metrics},
    {"log", "object", "libtier's log level: {\"level\": \"info\"} (docs/logging.md)", "",
     read_log},
    {"tiers", "array of objects", "the tiers, fastest first", "an array of tiers, fastest first",
     read_tiers},
};

ProfileDraft read_profile(const Json& doc, std::string source, ConfigErrors& errors) {
  ProfileDraft draft;
  draft.profile.source = std::move(source);
  if (!doc.is_object()) {
    errors.add("", "expected a profile object, got " + describe_json(doc));
    return draft;
  }
  read_object<ProfileDraft>(doc, "", kProfileKeys, draft, errors);
  return draft;
}

// ---- Step 2: load the plugins the profile lists -----------------------------------------------

// A plugin named by a relative path ("plugins/x.so") is found beside the profile (`base_dir`),
// never in the working directory; a bare name is searched in the plugin directories only.
std::string plugin_target(const PluginEntry& plugin, const std::filesystem::path& base_dir) {
  if (plugin.name.find('/') != std::string::npos &&
      std::filesystem::path(plugin.name).is_relative() && !base_dir.empty())
    return (base_dir / plugin.name).lexically_normal().string();
  return plugin.name;
}

void load_plugins(std::span<const PluginEntry> plugins, Registry& registry, Profile& profile,
                  const std::filesystem::path& base_dir, ConfigErrors& errors) {
  for (const auto& plugin : plugins) {
    Status st = registry.load(plugin_target(plugin, base_dir));
    if (!st) errors.add(plugin.path, std::string(st.message()));
    profile.plugins.push_back(plugin.name);
  }
}

// Without loading (ProfileLoad::load_plugins false): each plugin is found as load() would find
// it, and never opened.
void locate_plugins(std::span<const PluginEntry> plugins, const Registry& registry,
                    Profile& profile, const std::filesystem::path& base_dir, ConfigErrors& errors,
                    std::vector<std::string>* unchecked) {
  for (const auto& plugin : plugins) {
    auto file = registry.locate(plugin_target(plugin, base_dir));
    if (!file)
      errors.add(plugin.path, std::string(file.status().message()));
    else if (unchecked != nullptr)
      unchecked->push_back(fmt::format("{}: plugin {} not loaded", plugin.path, file->string()));
    profile.plugins.push_back(plugin.name);
  }
}

// ---- Step 3: check each backend and stage against the registry, then across tiers --------------

// A relative `path`-typed option names a file relative to the profile's directory (`base_dir`,
// when the profile was read from a file); absolute paths and a document without a file (empty
// `base_dir`: relative to the working directory) are kept as given. ${VAR} is expanded first.
void anchor_paths(Json& options, std::span<const OptionSpec> specs,
                  const std::filesystem::path& base_dir) {
  if (base_dir.empty()) return;
  for (const auto& s : specs) {
    if (s.type != OptionType::kPath || !options.contains(s.name) || !options[s.name].is_string())
      continue;
    std::filesystem::path p = options[s.name].get<std::string>();
    if (p.is_relative()) options[s.name] = (base_dir / p).lexically_normal().string();
  }
}

// How step 3 finds the plugin of a backend or stage: through the registry, which loads it from
// the plugin directories when needed, or (`load` false) only among the plugins registered
// already; `listed_not_loaded`: the profile lists plugins that step 2 did not load.
struct PluginLookup {
  const Registry& registry;
  bool load = true;
  bool listed_not_loaded = false;
  std::vector<std::string>* unchecked = nullptr;

  const PluginInfo* find(PluginKind kind, const std::string& type) const {
    return load ? registry.find(kind, type) : registry.find_registered(kind, type);
  }
};

Result<std::string> read_profile_file(const std::string& path);  // below

// The option schema of the plugin file of `kind` and `type`, read from the data file the build
// installs beside it (libtier_backend_disk.so: libtier_backend_disk.json, the same JSON as the
// plugin's tier_plugin::options_json), so that a plugin's options are checked without loading it.
// The file is read as a profile is: a regular file of at most kMaxProfileBytes. Errors: NotFound
// (no plugin file of that kind and type, or no schema beside it), InvalidArgument (malformed).
Result<std::vector<OptionSpec>> installed_schema(const Registry& registry, PluginKind kind,
                                                 const std::string& type) {
  TIER_ASSIGN_OR_RETURN(std::filesystem::path file, registry.locate(type, kind));
  if (file.filename() != fmt::format("libtier_{}_{}.so", plugin_kind_name(kind), type))
    return Status::not_found(fmt::format("{} is not a {} plugin", file.string(),
                                         plugin_kind_name(kind)));
  const std::string schema = file.replace_extension(".json").string();
  auto text = read_profile_file(schema);
  if (!text) return text.status();
  try {
    return parse_option_specs(*text);
  } catch (const std::exception& e) {
    return Status::invalid(fmt::format("{}: not an option schema: {}", schema, e.what()));
  }
}

// The options of `ref` with defaults filled in; its options as written when its plugin is not
// loaded and has no schema installed beside it (reported in lookup.unchecked); nullopt when its
// type is unknown.
std::optional<Json> resolve_plugin_ref(const PluginRef& ref, PluginKind kind,
                                       const PluginLookup& lookup,
                                       const std::filesystem::path& base_dir,
                                       ConfigErrors& errors) {
  const Registry& registry = lookup.registry;
  const PluginInfo* info = lookup.find(kind, ref.type);
  if (info == nullptr) {
    const std::string where = ref.is_object ? ref.path + "/type" : ref.path;
    auto names = registry.names(kind);  // registered names and plugin files, nothing loaded
    if (!lookup.load) {
      std::string why;
      if (std::find(names.begin(), names.end(), ref.type) != names.end()) {
        auto schema = installed_schema(registry, kind, ref.type);
        if (schema) {  // checked without loading the plugin
          Json options = resolve_options(ref.options, *schema, ref.path, errors);
          anchor_paths(options, *schema, base_dir);
          return options;
        }
        if (!(schema.status() == Code::kNotFound)) {
          errors.add(where, std::string(schema.status().message()));
          return std::nullopt;
        }
        why = fmt::format(
            "{} \"{}\" is a plugin that is not loaded and has no option schema beside it: its "
            "options are not checked",
            plugin_kind_name(kind), ref.type);
      } else if (lookup.listed_not_loaded) {
        why = fmt::format(
            "{} \"{}\" is not registered; it may come from the profile's plugins, "
            "which are not loaded: not checked",
            plugin_kind_name(kind), ref.type);
      }
      if (!why.empty()) {
        if (lookup.unchecked != nullptr) lookup.unchecked->push_back(ref.path + ": " + why);
        return ref.options;
      }
    }
    if (std::string why = registry.load_error(kind, ref.type); !why.empty()) {
      errors.add(where, fmt::format("{} \"{}\": its plugin failed to load: {}",
                                    plugin_kind_name(kind), ref.type, why));
      return std::nullopt;
    }
    std::string hint = did_you_mean(ref.type, names);
    errors.add(where,
               fmt::format("unknown {} \"{}\"{}; registered: {}", plugin_kind_name(kind), ref.type,
                           hint.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", hint),
                           fmt::join(names, ", ")));
    return std::nullopt;
  }
  Json options = resolve_options(ref.options, info->options, ref.path, errors);
  anchor_paths(options, info->options, base_dir);
  return options;
}

TierSpec resolve_tier(const TierDraft& tier, const PluginLookup& lookup,
                      const std::filesystem::path& base_dir, ConfigErrors& errors) {
  TierSpec spec = tier.spec;
  if (tier.backend) {
    spec.backend_type = tier.backend->type;
    if (auto options =
            resolve_plugin_ref(*tier.backend, PluginKind::kBackend, lookup, base_dir, errors))
      spec.backend_options = std::move(*options);
    if (const PluginInfo* info = lookup.find(PluginKind::kBackend, spec.backend_type))
      for (const OptionSpec& o : info->options)
        if (o.secret) spec.secret_options.push_back(o.name);
  }
  if (tier.stage) {
    spec.stage_type = tier.stage->type;
    if (auto options =
            resolve_plugin_ref(*tier.stage, PluginKind::kStage, lookup, base_dir, errors))
      spec.stage_options = std::move(*options);
  }
  return spec;
}

// The rules that span a tier's keys or several tiers.
void check_tiers(std::span<const TierDraft> tiers, ConfigErrors& errors) {
  std::set<std::string> names;
  bool any_write = false;
  for (const auto& tier : tiers) {
    const TierSpec& spec = tier.spec;
    if (!spec.name.empty() && !names.insert(spec.name).second)
      errors.add(tier.path + "/name", fmt::format("tier name \"{}\" is used twice", spec.name));
    if (!spec.read && !spec.write)
      errors.add(tier.path, "a tier that is neither read nor written does nothing; remove it");
    any_write |= spec.write;
  }
  if (!any_write && errors.empty()) errors.add("/tiers", "no tier is writable (\"write\": true)");
}

// "<path>:<line>:<column>: invalid JSON: ..." for a syntax error in `text`.
std::string json_syntax_error(const std::string& path, const std::string& text,
                              const Json::parse_error& e) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < e.byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return fmt::format("{}:{}:{}: invalid JSON: {}", path, line, col > 1 ? col - 1 : 1, e.what());
}

}  // namespace

int Profile::find_tier(std::string_view name) const {
  for (std::size_t i = 0; i < tiers.size(); ++i)
    if (tiers[i].name == name) return static_cast<int>(i);
  return -1;
}

Json Profile::to_json() const {
  Json j;
  j["source"] = source;
  j["plugins"] = plugins;
  j["stack"] = {{"max_inflight_bytes", max_inflight_bytes},
                {"max_inflight", format_size(max_inflight_bytes)},
                {"op_timeout_us", op_timeout_us}};
  if (metrics.enabled)
    j["metrics"] = {{"listen", metrics.host.find(':') != std::string::npos
                                   ? fmt::format("[{}]:{}", metrics.host, metrics.port)
                                   : fmt::format("{}:{}", metrics.host, metrics.port)},
                    {"allow_remote", metrics.allow_remote},
                    {"timeout_us", metrics.timeout_us},
                    {"max_connections", metrics.max_connections}};
  if (log_level) j["log"] = {{"level", std::string(log_level_name(*log_level))}};
  j["tiers"] = Json::array();
  for (const auto& t : tiers) {
    Json backend = t.backend_options;
    for (auto& [name, value] : backend.items())  // credentials never leave through explain
      if (value.is_string()) value = redact_url_passwords(value.get<std::string>());
    for (const std::string& name : t.secret_options)
      if (backend.contains(name) && !(backend[name].is_string() && backend[name].empty()))
        backend[name] = kRedacted;
    backend["type"] = t.backend_type;
    Json tj = {{"name", t.name},
               {"capacity_bytes", t.capacity_bytes},
               {"capacity", format_size(t.capacity_bytes)},
               {"backend", backend},
               {"read", t.read},
               {"write", t.write},
               {"optional", t.optional},
               {"on_evict", t.on_evict == EvictPolicy::kDemote ? "demote" : "drop"}};
    if (!t.stage_type.empty()) {
      Json stage = t.stage_options;
      for (auto& [name, value] : stage.items())
        if (value.is_string()) value = redact_url_passwords(value.get<std::string>());
      stage["type"] = t.stage_type;
      tj["stage"] = stage;
    } else {
      tj["stage"] = nullptr;
    }
    j["tiers"].push_back(tj);
  }
  return j;
}

Json profile_schema_json() {
  return {{"profile", key_table_json<ProfileDraft>(kProfileKeys)},
          {"stack", options_schema_json(stack_specs())},
          {"metrics", options_schema_json(metrics_specs())},
          {"log", options_schema_json(log_specs())},
          {"tier", key_table_json<TierDraft>(kTierKeys)}};
}

namespace {

Result<Profile> parse_profile_at(const Json& doc, Registry& registry, std::string source,
                                 const std::filesystem::path& base_dir, ConfigErrors* errors_out,
                                 const ProfileLoad& how) {
  ConfigErrors errors;
  ProfileDraft draft = read_profile(doc, std::move(source), errors);
  Profile profile = std::move(draft.profile);
  if (how.load_plugins)
    load_plugins(draft.plugins, registry, profile, base_dir, errors);
  else
    locate_plugins(draft.plugins, registry, profile, base_dir, errors, how.unchecked);
  const PluginLookup lookup{.registry = registry,
                            .load = how.load_plugins,
                            .listed_not_loaded = !how.load_plugins && !draft.plugins.empty(),
                            .unchecked = how.unchecked};
  for (const auto& tier : draft.tiers)
    profile.tiers.push_back(resolve_tier(tier, lookup, base_dir, errors));
  check_tiers(draft.tiers, errors);
  if (errors_out) *errors_out = errors;
  if (!errors.empty()) return errors.to_status();
  return profile;
}

}  // namespace

Result<Profile> parse_profile(const Json& doc, Registry& registry, std::string source,
                              ConfigErrors* errors_out) {
  return parse_profile_at(doc, registry, std::move(source), {}, errors_out, ProfileLoad{});
}

namespace {

// A JSON pointer's escaping of one key (RFC 6901): "~" -> "~0", "/" -> "~1".
std::string json_pointer_escape(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// Reads a profile file: a regular file (not a FIFO, a device or /dev/zero) of at most
// kMaxProfileBytes. Errors: NotFound, InvalidArgument.
Result<std::string> read_profile_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st))
    return Status::not_found(fmt::format("{}: cannot open profile", path));
  if (!std::filesystem::is_regular_file(st))
    return Status::invalid(fmt::format("{}: a profile must be a regular file", path));
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxProfileBytes)
    return Status::invalid(fmt::format("{}: a profile is at most {} bytes{}", path,
                                       kMaxProfileBytes, ec ? "" : fmt::format(", got {}", size)));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(fmt::format("{}: cannot open profile", path));
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  return text;
}

// Parses a profile's text, refusing nesting deeper than kMaxProfileDepth and a key that appears
// twice in one object (both would otherwise be accepted silently: the last value wins).
// Errors: InvalidArgument naming the JSON pointer.
Result<Json> parse_profile_text(const std::string& path, const std::string& text) {
  struct Frame {
    bool object = false;
    std::string pointer;          // of the container itself
    std::set<std::string> keys;   // objects: the keys seen so far
    std::string key;              // objects: the key whose value comes next
    std::size_t next_index = 0;   // arrays: the index of the next element
  };
  std::vector<Frame> frames;
  std::string error;
  auto child_pointer = [&]() {
    if (frames.empty()) return std::string();
    Frame& top = frames.back();
    if (top.object) return top.pointer + "/" + json_pointer_escape(top.key);
    return top.pointer + "/" + std::to_string(top.next_index++);
  };
  Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (depth > static_cast<int>(kMaxProfileDepth)) {
      error = fmt::format("{}: nesting deeper than {} levels", child_pointer(), kMaxProfileDepth);
      throw std::runtime_error(error);
    }
    switch (event) {
      case E::object_start:
      case E::array_start: {
        Frame f;
        f.object = event == E::object_start;
        f.pointer = child_pointer();
        frames.push_back(std::move(f));
        break;
      }
      case E::key: {
        Frame& top = frames.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second) {
          error = fmt::format("{}/{}: duplicate key \"{}\" (a key may appear once per object)",
                              top.pointer, json_pointer_escape(top.key), top.key);
          throw std::runtime_error(error);
        }
        break;
      }
      case E::object_end:
      case E::array_end: frames.pop_back(); break;
      case E::value:
        if (!frames.empty() && !frames.back().object) ++frames.back().next_index;
        break;
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::parse_error& e) {
    return Status::invalid(json_syntax_error(path, text, e));
  } catch (const std::runtime_error&) {
    return Status::invalid(fmt::format("{}: {}", path, error));
  }
}

}  // namespace

Result<Profile> load_profile(const std::string& path, Registry& registry, ConfigErrors* errors) {
  return load_profile(path, registry, errors, ProfileLoad{});
}

Result<Profile> load_profile(const std::string& path, Registry& registry, ConfigErrors* errors,
                             const ProfileLoad& how) {
  auto text = read_profile_file(path);
  Result<Json> doc = text ? parse_profile_text(path, *text) : Result<Json>(text.status());
  if (!doc) {
    if (errors) errors->add("", std::string(doc.status().message()));
    return doc.status();
  }
  std::error_code ec;
  std::filesystem::path base_dir = std::filesystem::absolute(path, ec).parent_path();
  return parse_profile_at(*doc, registry, path, base_dir, errors, how);
}

}  // namespace tier
