#pragma once
// Profiles: the JSON an operator writes to pick tiers. Strict (see tier/options.hpp): every error
// is reported with its JSON pointer, and all errors are reported at once.
//
// {
//   "version": 1,                         // optional; only 1 exists
//   "plugins": ["mock", "/opt/x/libtier_backend_y.so"],   // loaded before tiers are checked
//   "stack": { "max_inflight_bytes": "256MiB", "op_timeout": "10s" },
//   "metrics": { "listen": "127.0.0.1:9464" },   // optional: the HTTP endpoint of /metrics
//   "log": { "level": "info" },                    // optional: error | warn | info | debug | off
//   "tiers": [
//     { "name": "cpu", "capacity": "${TIER_CPU_CAPACITY:-4GiB}",
//       "backend": { "type": "cpu", ...backend options... },
//       "stage": { "type": "zstd", "level": 3 },          // optional, per tier
//       "read": true, "write": true, "on_evict": "demote",   // "demote" | "drop"
//       "optional": false }   // true: left out when the backend cannot run here
//   ]
// }

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tier/json.hpp"
#include "tier/log.hpp"
#include "tier/registry.hpp"
#include "tier/status.hpp"

namespace tier {

enum class EvictPolicy { kDemote, kDrop };

struct TierSpec {
  std::string name;
  std::uint64_t capacity_bytes = 0;
  std::string backend_type;
  Json backend_options;  // resolved: defaults filled in
  std::vector<std::string> secret_options;  // backend options that to_json() never shows
  std::string stage_type;  // "" = raw
  Json stage_options;
  bool read = true;
  bool write = true;
  // Left out of the stack (instead of failing it) when its backend cannot run on this machine
  // (create() reports not_supported: no io_uring, no GPU).
  bool optional = false;
  EvictPolicy on_evict = EvictPolicy::kDemote;
};

// The profile's "metrics" section: an HTTP endpoint serving GET /metrics (docs/metrics.md).
struct MetricsEndpoint {
  bool enabled = false;        // the profile has a "metrics" section
  std::string host;            // an IP address literal ("localhost" is read as 127.0.0.1)
  std::uint16_t port = 9464;   // 0: a free port, chosen when the endpoint starts
  bool allow_remote = false;   // a host other than a loopback address was allowed explicitly
  std::uint64_t timeout_us = 5'000'000;  // longest a request may take to arrive and be answered
  std::uint32_t max_connections = 16;    // connections served at once; more are closed at once
};

struct Profile {
  std::string source;  // file path, or "<inline>"
  std::vector<std::string> plugins;
  std::uint64_t max_inflight_bytes = 256ull << 20;
  std::uint64_t op_timeout_us = 10'000'000;
  std::vector<TierSpec> tiers;
  MetricsEndpoint metrics;
  std::optional<LogLevel> log_level;  // "log": {"level": ...}; applied when a stack opens

  // The resolved profile with every default filled in (tierctl explain).
  Json to_json() const;
  int find_tier(std::string_view name) const;  // index or -1
};

// Parses and validates, in three steps that each report every error they find:
//   1. read: the document against the table of profile and tier keys (pure: the registry is
//      not consulted, nothing is loaded);
//   2. load: the plugins the profile lists, into `registry`;
//   3. validate: each backend and stage against `registry` (type registered, options checked
//      against its schema, defaults filled in), then the rules across tiers.
// Errors: InvalidArgument whose message lists every error, one per line, each starting with its
// JSON pointer; `errors` (if given) receives them one by one.
Result<Profile> parse_profile(const Json& document, Registry& registry, std::string source,
                              ConfigErrors* errors = nullptr);
// The keys a profile takes, for `tierctl schema`: {"profile": [...], "stack": [...], "tier": [...]},
// each entry {name, type, doc, ...}.
Json profile_schema_json();
// Limits on a profile file, so that a hostile or mistaken file costs bounded memory and time.
inline constexpr std::size_t kMaxProfileBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMaxProfileDepth = 64;

// How load_profile treats plugins.
struct ProfileLoad {
  // false: nothing is loaded, so no plugin code runs (tierctl check without --load-plugins).
  // Step 1 is unchanged; step 2 only locates each listed plugin (a missing one is an error); in
  // step 3 a backend or stage whose plugin is not registered yet must have a plugin file in the
  // plugin directories (or, when the profile lists plugins, may come from them), and its options
  // are not checked: they stay as written in the returned profile, which is for checking only,
  // not for opening a stack.
  bool load_plugins = true;
  // Receives "<JSON pointer>: <what was not checked and why>" for each plugin not loaded and each
  // backend or stage whose options were not checked.
  std::vector<std::string>* unchecked = nullptr;
};

// Reads a file (JSON syntax errors are reported with line and column) and parses it. The file
// must be a regular file of at most kMaxProfileBytes; JSON nested deeper than kMaxProfileDepth
// and a key that appears twice in one object are errors naming the JSON pointer. A relative
// value of a `path`-typed plugin option (after ${VAR} expansion) and a plugin named by a
// relative path ("plugins": ["lib/x.so"]) are taken relative to the directory of the profile
// file, never the working directory; parse_profile (no file) leaves them as given.
// Errors: NotFound (no such file), InvalidArgument.
Result<Profile> load_profile(const std::string& path, Registry& registry,
                             ConfigErrors* errors = nullptr);
Result<Profile> load_profile(const std::string& path, Registry& registry, ConfigErrors* errors,
                             const ProfileLoad& how);

}  // namespace tier
