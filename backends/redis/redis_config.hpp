#pragma once
// Settings of the redis tier, parsed from the tier's validated options (redis_plugin.cpp lists
// them with their docs) and its url.

#include <chrono>
#include <cstdint>
#include <string>

#include "tier/json.hpp"
#include "tier/key.hpp"
#include "tier/status.hpp"

namespace tier::redis {

enum class Mode : std::uint8_t { kSingle, kCluster };
// Which part of the key Redis Cluster hashes (see docs/remote.md, "Key format").
enum class HashTag : std::uint8_t { kNone, kNamespaceRank };

struct Endpoint {
  std::string host;
  std::uint16_t port = 6379;
  std::string address() const;  // "host:port"
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

struct RedisConfig {
  Mode mode = Mode::kSingle;
  Endpoint seed;
  std::string username;  // ACL user; empty: AUTH with the password only
  std::string password;  // empty: no AUTH
  std::uint32_t db = 0;  // SELECT (single mode only; Redis Cluster has db 0 only)
  std::string key_prefix;
  HashTag hash_tag = HashTag::kNone;
  std::uint32_t connections = 4;  // per server (per master in cluster mode)
  std::chrono::microseconds timeout{0};
  std::chrono::microseconds connect_timeout{0};
  std::chrono::microseconds backoff_min{0};
  std::chrono::microseconds backoff_max{0};
  std::uint64_t ttl_ms = 0;  // 0: keys do not expire
  std::uint32_t max_in_flight = 0;
  std::uint64_t max_object_bytes = 0;
};

// What a url says; the rest of RedisConfig comes from the tier's options.
struct RedisUrl {
  Endpoint seed;
  std::string username;  // empty: none given
  std::string password;  // empty: none given
  std::uint32_t db = 0;
};
// Parses "redis://[[user]:password@]host[:port][/db]". Errors: InvalidArgument naming what is
// wrong, NotSupported (rediss://).
Result<RedisUrl> parse_redis_url(std::string_view url);

// Builds the config from resolved options (defaults filled, durations in microseconds). Options
// `username`, `password` and `db` override what the url says when given.
Result<RedisConfig> make_redis_config(const Json& options);

// The Redis key of an object: see docs/remote.md. Without a hash tag
//   <prefix><ns hex>:r<rank>:<id hex>
// and with hash_tag = namespace_rank
//   <prefix>{<ns hex>:r<rank>}:<id hex>
std::string redis_key(const RedisConfig& cfg, const ObjectKey& key);

}  // namespace tier::redis
