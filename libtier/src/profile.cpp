#include "tier/profile.hpp"

#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace tier {
namespace {

const std::vector<std::string> kTopKeys = {"version", "description", "plugins", "stack", "tiers"};
const std::vector<std::string> kTierKeys = {"name", "capacity", "backend", "stage",
                                            "read", "write", "optional", "on_evict"};

const std::vector<OptionSpec>& stack_specs() {
  static const std::vector<OptionSpec> specs = parse_option_specs(R"JSON([
    {"name": "max_inflight_bytes", "type": "size", "default": "256MiB", "min": 1,
     "doc": "bytes of background writes (write-through, demotion, promotion) in flight at once; a write that does not fit is dropped and counted"},
    {"name": "op_timeout", "type": "duration", "default": "10s", "min": 1000,
     "doc": "longest wait for one tier to complete a foreground request"}
  ])JSON");
  return specs;
}

void unknown_keys(const Json& obj, const std::vector<std::string>& allowed,
                  const std::string& path, ConfigErrors& errors) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end()) continue;
    std::string hint = did_you_mean(it.key(), allowed);
    errors.add(path + "/" + it.key(),
               hint.empty() ? fmt::format("unknown key \"{}\"", it.key())
                            : fmt::format("unknown key \"{}\"; did you mean \"{}\"?", it.key(),
                                          hint));
  }
}

std::optional<std::string> string_value(const Json& v, const std::string& path,
                                        ConfigErrors& errors) {
  if (!v.is_string()) {
    errors.add(path, "expected a string, got " + describe_json(v));
    return std::nullopt;
  }
  std::string err;
  auto s = expand_env(v.get<std::string>(), &err);
  if (!s) errors.add(path, err);
  return s;
}

// A plugin reference is "type" or {"type": ..., options...}. Returns type and its options.
bool plugin_ref(const Json& v, const std::string& path, PluginKind kind, const Registry& registry,
                std::string& type, Json& options, ConfigErrors& errors) {
  Json given = Json::object();
  if (v.is_string()) {
    type = v.get<std::string>();
  } else if (v.is_object()) {
    if (!v.contains("type")) {
      errors.add(path + "/type", fmt::format("required key is missing (a {} name)",
                                             plugin_kind_name(kind)));
      return false;
    }
    if (!v["type"].is_string()) {
      errors.add(path + "/type", "expected a string, got " + describe_json(v["type"]));
      return false;
    }
    type = v["type"].get<std::string>();
    given = v;
    given.erase("type");
  } else {
    errors.add(path, fmt::format("expected a {} name or an object with \"type\", got {}",
                                 plugin_kind_name(kind), describe_json(v)));
    return false;
  }
  const PluginInfo* info = registry.find(kind, type);
  if (info == nullptr) {
    auto names = registry.names(kind);
    std::string hint = did_you_mean(type, names);
    errors.add(v.is_object() ? path + "/type" : path,
               fmt::format("unknown {} \"{}\"{}; registered: {}", plugin_kind_name(kind), type,
                           hint.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", hint),
                           fmt::join(names, ", ")));
    return false;
  }
  options = resolve_options(given, info->options, path, errors);
  return true;
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
  j["tiers"] = Json::array();
  for (const auto& t : tiers) {
    Json backend = t.backend_options;
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
      stage["type"] = t.stage_type;
      tj["stage"] = stage;
    } else {
      tj["stage"] = nullptr;
    }
    j["tiers"].push_back(tj);
  }
  return j;
}

Result<Profile> parse_profile(const Json& doc, Registry& registry, std::string source,
                              ConfigErrors* errors_out) {
  ConfigErrors errors;
  Profile p;
  p.source = std::move(source);
  auto finish = [&]() -> Result<Profile> {
    if (errors_out) *errors_out = errors;
    if (!errors.empty()) return errors.to_status();
    return p;
  };
  if (!doc.is_object()) {
    errors.add("", "expected a profile object, got " + describe_json(doc));
    return finish();
  }
  unknown_keys(doc, kTopKeys, "", errors);
  if (doc.contains("version") && doc["version"] != Json(1))
    errors.add("/version", "expected 1, got " + describe_json(doc["version"]));
  if (doc.contains("description") && !doc["description"].is_string())
    errors.add("/description", "expected a string, got " + describe_json(doc["description"]));

  if (doc.contains("plugins")) {
    const Json& pl = doc["plugins"];
    if (!pl.is_array()) {
      errors.add("/plugins", "expected an array of plugin names or paths, got " +
                                 describe_json(pl));
    } else {
      for (std::size_t i = 0; i < pl.size(); ++i) {
        std::string path = fmt::format("/plugins/{}", i);
        auto s = string_value(pl[i], path, errors);
        if (!s) continue;
        Status st = registry.load(*s);
        if (!st) errors.add(path, std::string(st.message()));
        p.plugins.push_back(*s);
      }
    }
  }

  Json stack = resolve_options(doc.contains("stack") ? doc["stack"] : Json(), stack_specs(),
                               "/stack", errors);
  if (stack.contains("max_inflight_bytes")) p.max_inflight_bytes = stack["max_inflight_bytes"];
  if (stack.contains("op_timeout")) p.op_timeout_us = stack["op_timeout"];

  if (!doc.contains("tiers")) {
    errors.add("/tiers", "required key is missing (an array of tiers, fastest first)");
    return finish();
  }
  const Json& tiers = doc["tiers"];
  if (!tiers.is_array() || tiers.empty()) {
    errors.add("/tiers", "expected a non-empty array of tiers, got " + describe_json(tiers));
    return finish();
  }
  std::set<std::string> names;
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    std::string path = fmt::format("/tiers/{}", i);
    const Json& t = tiers[i];
    if (!t.is_object()) {
      errors.add(path, "expected a tier object, got " + describe_json(t));
      continue;
    }
    unknown_keys(t, kTierKeys, path, errors);
    TierSpec spec;
    if (!t.contains("name")) {
      errors.add(path + "/name", "required key is missing (the tier's name, e.g. \"cpu\")");
    } else if (auto n = string_value(t["name"], path + "/name", errors)) {
      if (n->empty()) errors.add(path + "/name", "expected a non-empty string, got \"\"");
      else if (!names.insert(*n).second)
        errors.add(path + "/name", fmt::format("tier name \"{}\" is used twice", *n));
      spec.name = *n;
    }
    if (!t.contains("capacity")) {
      errors.add(path + "/capacity", "required key is missing (a size like \"64GiB\")");
    } else {
      Json cap = t["capacity"];
      std::string err;
      bool ok = true;
      if (cap.is_string()) {
        auto e = expand_env(cap.get<std::string>(), &err);
        if (!e) {
          errors.add(path + "/capacity", err);
          ok = false;
        } else {
          cap = *e;
        }
      }
      if (ok) {
        auto n = parse_size(cap);
        if (!n || *n == 0)
          errors.add(path + "/capacity",
                     "expected a size like \"64GiB\", got " + describe_json(t["capacity"]));
        else
          spec.capacity_bytes = *n;
      }
    }
    if (!t.contains("backend")) {
      errors.add(path + "/backend",
                 "required key is missing (e.g. {\"type\": \"cpu\"})");
    } else {
      plugin_ref(t["backend"], path + "/backend", PluginKind::kBackend, registry,
                 spec.backend_type, spec.backend_options, errors);
    }
    if (t.contains("stage") && !t["stage"].is_null()) {
      plugin_ref(t["stage"], path + "/stage", PluginKind::kStage, registry, spec.stage_type,
                 spec.stage_options, errors);
    }
    for (auto [flag, field] : {std::pair<const char*, bool*>{"read", &spec.read},
                               {"write", &spec.write}, {"optional", &spec.optional}}) {
      if (!t.contains(flag)) continue;
      if (!t[flag].is_boolean()) {
        errors.add(path + "/" + flag, "expected true or false, got " + describe_json(t[flag]));
        continue;
      }
      *field = t[flag].get<bool>();
    }
    if (t.contains("on_evict")) {
      const Json& e = t["on_evict"];
      if (e == Json("demote")) spec.on_evict = EvictPolicy::kDemote;
      else if (e == Json("drop")) spec.on_evict = EvictPolicy::kDrop;
      else errors.add(path + "/on_evict",
                      "expected one of \"demote\", \"drop\", got " + describe_json(e));
    }
    if (!spec.read && !spec.write)
      errors.add(path, "a tier that is neither read nor written does nothing; remove it");
    p.tiers.push_back(std::move(spec));
  }
  bool any_write = false;
  for (const auto& t : p.tiers) any_write |= t.write;
  if (!any_write && errors.empty()) errors.add("/tiers", "no tier is writable (\"write\": true)");
  return finish();
}

Result<Profile> load_profile(const std::string& path, Registry& registry,
                             ConfigErrors* errors) {
  std::ifstream in(path);
  if (!in) {
    Status s = Status::not_found(fmt::format("{}: cannot open profile", path));
    if (errors) errors->add("", fmt::format("cannot open profile {}", path));
    return s;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  Json doc;
  try {
    doc = Json::parse(ss.str());
  } catch (const Json::parse_error& e) {
    std::string text = ss.str();
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    std::string msg = fmt::format("{}:{}:{}: invalid JSON: {}", path, line, col > 1 ? col - 1 : 1,
                                  e.what());
    if (errors) errors->add("", msg);
    return Status::invalid(msg);
  }
  return parse_profile(doc, registry, path, errors);
}

}  // namespace tier
