// tierctl check PROFILE / tierctl explain PROFILE / tierctl schema
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cli.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"

namespace {

// Without --load-plugins no plugin is loaded, so none of its code runs: the profile's structure,
// the types of its backends and stages and the plugins it lists are checked, the options of
// plugins not registered in this program are not (each is listed as not checked).
int run_check(tier::cli::Args& args) {
  tier::ProfileLoad how{.load_plugins = args.flag("load-plugins")};
  args.finish();
  if (args.positional().size() != 1)
    return tier::cli::fail("usage: tierctl check PROFILE [--load-plugins]", 2);
  const std::string& path = args.positional()[0];
  std::vector<std::string> unchecked;
  how.unchecked = &unchecked;
  tier::ConfigErrors errors;
  auto p = tier::load_profile(path, tier::Registry::global(), &errors, how);
  for (const auto& u : unchecked) fmt::print("{}: {}\n", path, u);
  if (!p) {
    for (const auto& e : errors.list()) fmt::print(stderr, "{}: {}\n", path, e);
    if (errors.empty()) fmt::print(stderr, "{}\n", p.status().to_string());
    fmt::print(stderr, "{}: {} error{}\n", path, errors.list().size(),
               errors.list().size() == 1 ? "" : "s");
    return 1;
  }
  fmt::print("{}: ok ({} tier{}){}\n", path, p->tiers.size(), p->tiers.size() == 1 ? "" : "s",
             unchecked.empty() ? ""
                               : "; plugins not loaded, their options not checked "
                                 "(--load-plugins loads and checks them)");
  return 0;
}

int run_explain(tier::cli::Args& args) {
  bool json = args.flag("json");
  args.finish();
  if (args.positional().size() != 1)
    return tier::cli::fail("usage: tierctl explain PROFILE [--json]", 2);
  const std::string& path = args.positional()[0];
  tier::ConfigErrors errors;
  auto& registry = tier::Registry::global();
  auto p = tier::load_profile(path, registry, &errors);
  if (!p) {
    for (const auto& e : errors.list()) fmt::print(stderr, "{}: {}\n", path, e);
    return 1;
  }
  tier::Json j = p->to_json();
  for (auto& t : j["tiers"]) {
    const auto* info = registry.find(tier::PluginKind::kBackend,
                                     t["backend"]["type"].get<std::string>());
    t["backend_source"] = info ? info->source : "?";
  }
  if (json) {
    fmt::print("{}\n", tier::json_text(j, 2));
    return 0;
  }
  fmt::print("profile {}\n", path);
  fmt::print("  background writes in flight: at most {}\n", j["stack"]["max_inflight"].get<std::string>());
  fmt::print("  foreground timeout: {} ms\n", p->op_timeout_us / 1000);
  if (p->metrics.enabled)
    fmt::print("  metrics: GET http://{}/metrics (timeout {} ms, at most {} connections)\n",
               j["metrics"]["listen"].get<std::string>(), p->metrics.timeout_us / 1000,
               p->metrics.max_connections);
  if (p->log_level) fmt::print("  log level: {}\n", tier::log_level_name(*p->log_level));
  for (std::size_t i = 0; i < p->tiers.size(); ++i) {
    const auto& t = p->tiers[i];
    fmt::print("  tier {} \"{}\": backend {} ({}), capacity {}, {}{}, on eviction {}{}\n", i, t.name,
               t.backend_type, j["tiers"][i]["backend_source"].get<std::string>(),
               tier::format_size(t.capacity_bytes), t.read ? "read" : "",
               t.write ? (t.read ? "+write" : "write") : "",
               t.on_evict == tier::EvictPolicy::kDemote ? "demote" : "drop",
               t.optional ? ", optional (left out where its backend cannot run)" : "");
    // The options as Profile::to_json gives them: secrets and URL passwords redacted.
    tier::Json backend = j["tiers"][i]["backend"];
    backend.erase("type");
    fmt::print("    backend options: {}\n", tier::json_text(backend));
    tier::Json stage = j["tiers"][i]["stage"];
    if (stage.is_object()) stage.erase("type");
    fmt::print("    stage: {}\n", t.stage_type.empty()
                                      ? std::string("none (raw payload)")
                                      : t.stage_type + " " + tier::json_text(stage));
  }
  return 0;
}

int run_schema(tier::cli::Args& args) {
  args.finish();
  if (!args.positional().empty()) return tier::cli::fail("usage: tierctl schema", 2);
  fmt::print("{}\n", tier::json_text(tier::profile_schema_json(), 2));
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(check, "check PROFILE [--load-plugins]",
                 "validate a profile; exit 0 if valid, else print every error with its JSON path "
                 "and exit 1; loads no plugin (their options are then not checked) unless "
                 "--load-plugins",
                 run_check);
TIER_CLI_COMMAND(explain, "explain PROFILE [--json]",
                 "print the resolved tiers, capacities, stages and plugins, defaults filled in",
                 run_explain);
TIER_CLI_COMMAND(schema, "schema",
                 "print the keys a profile and its tiers take, with type and doc, as JSON",
                 run_schema);
