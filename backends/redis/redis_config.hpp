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

// TLS of a rediss:// tier (docs/remote.md, "TLS"). The server's certificate chain and name are
// verified unless `verify` is false.
struct TlsConfig {
  bool enabled = false;     // the url is rediss://
  bool verify = true;       // verify the server's chain and name
  std::string ca_file;      // PEM file of trusted CAs; with ca_path empty too: the system's
  std::string ca_path;      // directory of hashed CA certificates (c_rehash)
  std::string cert_file;    // client certificate chain (PEM), for servers that require one
  std::string key_file;     // its private key (PEM); empty: in cert_file
  std::string server_name;  // SNI and the name verified; empty: the host of each connection
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
  TlsConfig tls;
};

// True when this build has TLS (the Meson feature `tls`: OpenSSL was found).
bool tls_available() noexcept;

// Parses "redis[s]://[[user]:password@]host[:port][/db]" into `cfg` (seed, username, password,
// db, tls.enabled for rediss://). Errors: InvalidArgument naming what is wrong; NotSupported for
// rediss:// in a build without TLS.
Status parse_redis_url(std::string_view url, RedisConfig& cfg);

// Builds the config from resolved options (defaults filled, durations in microseconds). Options
// `username`, `password` and `db` override what the url says when given.
Result<RedisConfig> make_redis_config(const Json& options);

// The Redis key of an object: see docs/remote.md. Without a hash tag
//   <prefix><ns hex>:r<rank>:<id hex>
// and with hash_tag = namespace_rank
//   <prefix>{<ns hex>:r<rank>}:<id hex>
std::string redis_key(const RedisConfig& cfg, const ObjectKey& key);

}  // namespace tier::redis
