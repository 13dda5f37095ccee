// Pure logic of the remote tier: RESP parsing and encoding, CRC16 hash slots, urls, key format,
// options. No server needed (tests/unit/redis_live_test.cpp starts real ones).
#include <doctest/doctest.h>

#include "redis_config.hpp"
#include "resp.hpp"
#include "tier/options.hpp"
#include "tier/registry.hpp"

using namespace tier;
using namespace tier::redis;

namespace {
Json resolved(const Json& given, ConfigErrors& errors) {
  const PluginInfo* info = Registry::global().find(PluginKind::kBackend, "redis");
  REQUIRE(info != nullptr);
  return resolve_options(given, info->options, "/tiers/0/backend", errors);
}
}  // namespace

TEST_CASE("CRC16 and hash slots match Redis Cluster") {
  CHECK(crc16("123456789") == 0x31C3);  // the XModem check value
  CHECK(key_slot("foo") == 12182);      // CLUSTER KEYSLOT foo
  CHECK(key_slot("{user1000}.following") == key_slot("{user1000}.followers"));
  CHECK(key_slot("{user1000}.following") == key_slot("user1000"));
  CHECK(key_slot("foo{}{bar}") == key_slot("foo{}{bar}"));  // empty tag: the whole key
  CHECK(key_slot("foo{}{bar}") != key_slot("bar"));
  CHECK(key_slot("foo{{bar}}zap") == key_slot("{bar"));
}

namespace {
constexpr ReplyLimits kLimits{1 << 20, 1024};
}  // namespace

TEST_CASE("complete replies parse; partial ones ask for more") {
  Reply r;
  auto n = parse_reply("+OK\r\n", r, kLimits);
  REQUIRE(n.is_ok());
  CHECK(*n == 5);
  CHECK((r.type == Reply::Type::kSimple && r.str == "OK"));
  CHECK(*parse_reply("-MOVED 3999 127.0.0.1:6381\r\n", r, kLimits) == 28);
  CHECK(r.type == Reply::Type::kError);
  CHECK(r.str == "MOVED 3999 127.0.0.1:6381");
  CHECK(*parse_reply(":-42\r\n", r, kLimits) == 6);
  CHECK(r.integer == -42);
  CHECK(*parse_reply("$-1\r\n", r, kLimits) == 5);
  CHECK(r.type == Reply::Type::kNil);
  CHECK(*parse_reply("$3\r\na\r\n\r\n", r, kLimits) == 9);  // binary-safe: CRLF inside a bulk
  CHECK(r.str == "a\r\n");
  const std::string slots =
      "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n";
  CHECK(*parse_reply(slots, r, kLimits) == slots.size());
  REQUIRE(r.elements.size() == 1);
  CHECK(r.elements[0].elements[2].elements[1].integer == 7000);
  for (std::size_t cut = 0; cut < slots.size(); ++cut) {
    auto p = parse_reply(std::string_view(slots).substr(0, cut), r, kLimits);
    REQUIRE(p.is_ok());
    CHECK(*p == 0);
  }
  CHECK(parse_reply("?x\r\n", r, kLimits).status().code() == Code::kIoError);
  CHECK(parse_reply(":12a\r\n", r, kLimits).status().code() == Code::kIoError);
}

TEST_CASE("every reply has bounds: lengths and counts over them fail before any allocation") {
  Reply r;
  const ReplyLimits small{64, 4};
  auto err = [&](std::string_view in, std::string_view what) {
    auto n = parse_reply(in, r, small);
    REQUIRE_FALSE(n.is_ok());
    CHECK(n.status().code() == Code::kIoError);
    CHECK_MESSAGE(n.status().message().find(what) != std::string_view::npos, n.status().message());
  };
  err("$9999999999\r\n", "bulk length 9999999999 is over this reply's limit of 64 bytes");
  err("$65\r\n", "bulk length 65");
  err("*20000000\r\n", "array of 20000000 elements is over this reply's limit of 4");
  err("*2\r\n*2\r\n:1\r\n:2\r\n*1\r\n", "array of 1 elements");  // 5 in all, nested
  err("$99999999999999999999999\r\n", "bad integer");
  // A line without end is more data to wait for until it passes max_bytes + kReplyFraming.
  std::string line = "+" + std::string(64 + kReplyFraming - 2, 'A');
  auto n = parse_reply(line, r, small);
  REQUIRE(n.is_ok());
  CHECK(*n == 0);
  line += 'A';
  err(line, "still incomplete after 96 bytes");
  // At the limits: accepted.
  const std::string bulk = "$64\r\n" + std::string(64, 'b') + "\r\n";
  CHECK(*parse_reply(bulk, r, small) == bulk.size());
  CHECK(r.str.size() == 64);
  CHECK(*parse_reply("*2\r\n*1\r\n:1\r\n:2\r\n", r, small) > 0);
  CHECK(*parse_reply("*1\r\n", r, small) == 0);  // 1 of 4 elements declared, none arrived
}

TEST_CASE("commands encode as arrays of bulk strings") {
  CHECK(encode_command({"GET", "k"}) == "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
  CHECK(encode_command({"SELECT", "9"}) == "*2\r\n$6\r\nSELECT\r\n$1\r\n9\r\n");
}

TEST_CASE("urls") {
  RedisConfig c;
  REQUIRE(parse_redis_url("redis://alice:s3cret@cache.local:7001/5", c).is_ok());
  CHECK(c.seed.host == "cache.local");
  CHECK(c.seed.port == 7001);
  CHECK(c.username == "alice");
  CHECK(c.password == "s3cret");
  CHECK(c.db == 5);
  RedisConfig d;
  REQUIRE(parse_redis_url("redis://:pw@127.0.0.1", d).is_ok());
  CHECK(d.username.empty());
  CHECK(d.password == "pw");
  CHECK(d.seed.port == 6379);
  RedisConfig e;
  REQUIRE(parse_redis_url("redis://[::1]:6380", e).is_ok());
  CHECK(e.seed.host == "::1");
  CHECK(e.seed.port == 6380);
  RedisConfig f;
  if (tls_available()) {
    REQUIRE(parse_redis_url("rediss://h:1", f).is_ok());
    CHECK(f.tls.enabled);
    CHECK(f.seed.port == 1);
  } else {
    CHECK(parse_redis_url("rediss://h:1", f).code() == Code::kNotSupported);
  }
  CHECK_FALSE(e.tls.enabled);
  CHECK(parse_redis_url("http://h", f).code() == Code::kInvalidArgument);
  CHECK(parse_redis_url("redis://h:99999", f).code() == Code::kInvalidArgument);
  CHECK(parse_redis_url("redis://h/x", f).code() == Code::kInvalidArgument);
}

TEST_CASE("options resolve; bad ones name their path") {
  ConfigErrors errors;
  Json o = resolved({{"url", "redis://127.0.0.1:7000"},
                     {"mode", "cluster"},
                     {"hash_tag", "namespace_rank"},
                     {"timeout", "250ms"}},
                    errors);
  REQUIRE(errors.empty());
  auto cfg = make_redis_config(o);
  REQUIRE_MESSAGE(cfg.is_ok(), cfg.status().to_string());
  CHECK(cfg->mode == Mode::kCluster);
  CHECK(cfg->timeout == std::chrono::milliseconds(250));
  CHECK(cfg->connect_timeout == std::chrono::seconds(1));
  CHECK(cfg->key_prefix == "libtier:");

  ConfigErrors bad;
  resolved({{"timout", "1s"}}, bad);
  REQUIRE(bad.list().size() == 1);
  CHECK(bad.list()[0].find("/tiers/0/backend/timout") != std::string::npos);
  CHECK(bad.list()[0].find("did you mean \"timeout\"") != std::string::npos);

  ConfigErrors ok;
  CHECK(make_redis_config(resolved({{"key_prefix", "a{b}"}}, ok)).status().code() ==
        Code::kInvalidArgument);
  CHECK(make_redis_config(resolved({{"mode", "cluster"}, {"db", 2}}, ok)).status().code() ==
        Code::kInvalidArgument);
  CHECK(make_redis_config(resolved({{"username", "alice"}}, ok)).status().code() ==
        Code::kInvalidArgument);
}

TEST_CASE("key format, with and without the hash tag") {
  RedisConfig c;
  c.key_prefix = "p:";
  ObjectKey k{Key128{1, 2}, Key128{3, 4}, 7};
  CHECK(redis_key(c, k) == "p:" + k.ns.hex() + ":r7:" + k.id.hex());
  c.hash_tag = HashTag::kNamespaceRank;
  CHECK(redis_key(c, k) == "p:{" + k.ns.hex() + ":r7}:" + k.id.hex());
  ObjectKey other{k.ns, Key128{9, 9}, 7};
  CHECK(key_slot(redis_key(c, k)) == key_slot(redis_key(c, other)));
}
