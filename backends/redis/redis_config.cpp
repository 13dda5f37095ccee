#include "redis_config.hpp"

#include <fmt/format.h>

#include <charconv>
#include <optional>

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

// The whole of `s` as a number of type T, or nullopt.
template <class T>
std::optional<T> parse_number(std::string_view s) {
  T value{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

// "host[:port]" or "[v6 address][:port]"; the port defaults to Endpoint's.
Result<Endpoint> parse_host_port(std::string_view hostport) {
  Endpoint seed;
  std::string_view host = hostport;
  std::optional<std::string_view> port;
  if (hostport.starts_with('[')) {  // [::1]:6379
    std::size_t close = hostport.find(']');
    if (close == std::string_view::npos) return Status::invalid("url: unterminated [ in host");
    host = hostport.substr(1, close - 1);
    std::string_view after = hostport.substr(close + 1);
    if (after.starts_with(':')) port = after.substr(1);
  } else if (std::size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (port) {
    auto n = parse_number<std::uint16_t>(*port);
    if (!n) return Status::invalid(fmt::format("url: bad port in \"{}\"", hostport));
    seed.port = *n;
  }
  seed.host.assign(host);
  return seed;
}

}  // namespace

Result<RedisUrl> parse_redis_url(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.starts_with("rediss://"))
    return Status(Code::kNotSupported, "url: rediss:// (TLS) is not supported by this tier yet");
  if (!url.starts_with(kScheme))
    return Status::invalid(fmt::format("url: expected redis://host[:port][/db], got \"{}\"", url));
  RedisUrl out;
  std::string_view rest = url.substr(kScheme.size());
  std::size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    std::size_t colon = cred.find(':');
    if (colon == std::string_view::npos) {
      out.password.assign(cred);  // redis://secret@host: a password only
    } else {
      out.username.assign(cred.substr(0, colon));
      out.password.assign(cred.substr(colon + 1));
    }
  }
  std::size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      auto n = parse_number<std::uint32_t>(db);
      if (!n) return Status::invalid(fmt::format("url: database \"{}\" is not a number", db));
      out.db = *n;
    }
  }
  TIER_ASSIGN_OR_RETURN(out.seed, parse_host_port(rest.substr(0, slash)));
  if (out.seed.host.empty()) return Status::invalid(fmt::format("url: no host in \"{}\"", url));
  if (out.seed.port == 0) return Status::invalid("url: port 0");
  return out;
}

Result<RedisConfig> make_redis_config(const Json& o) {
  TIER_ASSIGN_OR_RETURN(RedisUrl url, parse_redis_url(o.at("url").get<std::string>()));
  RedisConfig cfg;
  cfg.seed = std::move(url.seed);
  cfg.username = std::move(url.username);
  cfg.password = std::move(url.password);
  cfg.db = url.db;
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
  return cfg;
}

std::string redis_key(const RedisConfig& cfg, const ObjectKey& key) {
  if (cfg.hash_tag == HashTag::kNamespaceRank)
    return fmt::format("{}{{{}:r{}}}:{}", cfg.key_prefix, key.ns.hex(), key.rank, key.id.hex());
  return fmt::format("{}{}:r{}:{}", cfg.key_prefix, key.ns.hex(), key.rank, key.id.hex());
}

}  // namespace tier::redis
