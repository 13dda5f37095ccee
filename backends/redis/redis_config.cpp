#include "redis_config.hpp"

#include <fmt/format.h>

#include <charconv>

#include "tier/options.hpp"

namespace tier::redis {

std::string Endpoint::address() const { return fmt::format("{}:{}", host, port); }

namespace {

// Durations and sizes arrive as integers when given, or as their schema default's text.
std::chrono::microseconds duration_of(const Json& o, const char* name) {
  return std::chrono::microseconds(parse_duration_us(o.at(name)).value_or(0));
}
std::uint64_t size_of(const Json& o, const char* name) {
  return parse_size(o.at(name)).value_or(0);
}

template <class T>
bool parse_number(std::string_view s, T& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

}  // namespace

Status parse_redis_url(std::string_view url, RedisConfig& cfg) {
  constexpr std::string_view kScheme = "redis://", kTlsScheme = "rediss://";
  cfg.tls.enabled = url.starts_with(kTlsScheme);
  if (cfg.tls.enabled && !tls_available())
    return Status(Code::kNotSupported,
                  "url: rediss:// (TLS) needs libtier built with OpenSSL (libssl-dev, meson "
                  "-Dtls=enabled); this build has none");
  if (!cfg.tls.enabled && !url.starts_with(kScheme))
    return Status::invalid(
        fmt::format("url: expected redis[s]://host[:port][/db], got \"{}\"", url));
  std::string_view rest = url.substr(cfg.tls.enabled ? kTlsScheme.size() : kScheme.size());
  std::size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    std::size_t colon = cred.find(':');
    if (colon == std::string_view::npos) {
      cfg.password.assign(cred);  // redis://secret@host: a password only
    } else {
      cfg.username.assign(cred.substr(0, colon));
      cfg.password.assign(cred.substr(colon + 1));
    }
  }
  std::size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && !parse_number(db, cfg.db))
      return Status::invalid(fmt::format("url: database \"{}\" is not a number", db));
  }
  std::string_view host = hostport;
  if (hostport.starts_with('[')) {  // [::1]:6379
    std::size_t close = hostport.find(']');
    if (close == std::string_view::npos) return Status::invalid("url: unterminated [ in host");
    host = hostport.substr(1, close - 1);
    std::string_view after = hostport.substr(close + 1);
    if (after.starts_with(':') && !parse_number(after.substr(1), cfg.seed.port))
      return Status::invalid(fmt::format("url: bad port in \"{}\"", hostport));
  } else {
    std::size_t colon = hostport.rfind(':');
    if (colon != std::string_view::npos) {
      host = hostport.substr(0, colon);
      if (!parse_number(hostport.substr(colon + 1), cfg.seed.port))
        return Status::invalid(fmt::format("url: bad port in \"{}\"", hostport));
    }
  }
  if (host.empty()) return Status::invalid(fmt::format("url: no host in \"{}\"", url));
  if (cfg.seed.port == 0) return Status::invalid("url: port 0");
  cfg.seed.host.assign(host);
  return Status::ok();
}

Result<RedisConfig> make_redis_config(const Json& o) {
  RedisConfig cfg;
  TIER_RETURN_IF_ERROR(parse_redis_url(o.at("url").get<std::string>(), cfg));
  cfg.mode = o.at("mode").get<std::string>() == "cluster" ? Mode::kCluster : Mode::kSingle;
  if (auto u = o.at("username").get<std::string>(); !u.empty()) cfg.username = u;
  if (auto p = o.at("password").get<std::string>(); !p.empty()) cfg.password = p;
  if (!cfg.username.empty() && cfg.password.empty())
    return Status::invalid("username: an ACL user needs a password");
  if (std::int64_t db = o.at("db").get<std::int64_t>(); db >= 0)
    cfg.db = static_cast<std::uint32_t>(db);
  if (cfg.mode == Mode::kCluster && cfg.db != 0)
    return Status::invalid("db: Redis Cluster has database 0 only");
  cfg.key_prefix = o.at("key_prefix").get<std::string>();
  if (cfg.key_prefix.find_first_of("{}") != std::string::npos)
    return Status::invalid(
        fmt::format("key_prefix: \"{}\" contains a brace, which would act as a cluster hash tag",
                    cfg.key_prefix));
  cfg.hash_tag = o.at("hash_tag").get<std::string>() == "namespace_rank" ? HashTag::kNamespaceRank
                                                                         : HashTag::kNone;
  cfg.connections = o.at("connections").get<std::uint32_t>();
  cfg.timeout = duration_of(o, "timeout");
  cfg.connect_timeout = duration_of(o, "connect_timeout");
  cfg.backoff_min = duration_of(o, "reconnect_min");
  cfg.backoff_max = duration_of(o, "reconnect_max");
  if (cfg.timeout.count() <= 0 || cfg.connect_timeout.count() <= 0)
    return Status::invalid("timeout and connect_timeout must be greater than 0");
  if (cfg.backoff_max < cfg.backoff_min)
    return Status::invalid("reconnect_max: must not be smaller than reconnect_min");
  cfg.ttl_ms = static_cast<std::uint64_t>(duration_of(o, "ttl").count()) / 1000;
  cfg.max_in_flight = o.at("max_in_flight").get<std::uint32_t>();
  cfg.max_object_bytes = size_of(o, "max_object_bytes");
  TlsConfig& tls = cfg.tls;
  tls.verify = o.at("tls_verify").get<bool>();
  tls.ca_file = o.at("tls_ca_file").get<std::string>();
  tls.ca_path = o.at("tls_ca_path").get<std::string>();
  tls.cert_file = o.at("tls_cert_file").get<std::string>();
  tls.key_file = o.at("tls_key_file").get<std::string>();
  tls.server_name = o.at("tls_server_name").get<std::string>();
  if (!tls.enabled) {
    for (const char* name :
         {"tls_ca_file", "tls_ca_path", "tls_cert_file", "tls_key_file", "tls_server_name"})
      if (!o.at(name).get<std::string>().empty())
        return Status::invalid(
            fmt::format("{}: set, but the url is redis:// (rediss:// turns TLS on)", name));
    if (!tls.verify)
      return Status::invalid("tls_verify: set, but the url is redis:// (rediss:// turns TLS on)");
  }
  if (!tls.key_file.empty() && tls.cert_file.empty())
    return Status::invalid("tls_key_file: a client key needs tls_cert_file");
  // SNI and the certificate's name check take a DNS name of at most 253 bytes (RFC 1035; SNI's
  // field is 255) or an address: a longer one could only ever fail every handshake.
  if (tls.enabled) {
    const bool own = !tls.server_name.empty();
    const std::string& name = own ? tls.server_name : cfg.seed.host;
    if (name.size() > 253 || name.find('\0') != std::string::npos)
      return Status::invalid(fmt::format(
          "{}: a TLS server name is a host name of at most 253 bytes without NUL, got {} bytes",
          own ? "tls_server_name" : "url", name.size()));
  }
  if (tls.key_file.empty()) tls.key_file = tls.cert_file;
  return cfg;
}

std::string redis_key(const RedisConfig& cfg, const ObjectKey& key) {
  if (cfg.hash_tag == HashTag::kNamespaceRank)
    return fmt::format("{}{{{}:r{}}}:{}", cfg.key_prefix, key.ns.hex(), key.rank, key.id.hex());
  return fmt::format("{}{}:r{}:{}", cfg.key_prefix, key.ns.hex(), key.rank, key.id.hex());
}

}  // namespace tier::redis
