// The remote tier over TLS (rediss://) against real redis-server processes started here with TLS
// only, on loopback, with a test CA and certificates made at test time by `openssl`: a valid
// chain (CA file and CA directory), a wrong CA, an expired certificate, a certificate for another
// name, verification turned off, mutual TLS, and a server killed and restarted.
// Exits 77 (Meson: SKIP) when redis-server or openssl is missing, when this build has no TLS, or
// when redis-server cannot serve TLS.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/redis_tls.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "redis_backend.hpp"
#include "support/test_util.hpp"
#include "tier/options.hpp"
#include "tier/registry.hpp"

using namespace tier;
using namespace std::chrono_literals;
using tier::redis::RedisBackend;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::TestPki;
using tier::test::TlsRedisServer;

namespace {

const TestPki* g_pki = nullptr;  // made once in main()

Result<std::unique_ptr<RedisBackend>> try_backend(Json options) {
  const PluginInfo* info = Registry::global().find(PluginKind::kBackend, "redis");
  REQUIRE(info != nullptr);
  if (!options.contains("timeout")) options["timeout"] = "2s";
  options["connect_timeout"] = "2s";
  options["reconnect_max"] = "100ms";
  ConfigErrors errors;
  Json o = resolve_options(options, info->options, "", errors);
  REQUIRE_MESSAGE(errors.empty(), errors.joined());
  return RedisBackend::create(BackendContext{"remote", 1ull << 30, o});
}

std::unique_ptr<RedisBackend> make_backend(Json options) {
  auto b = try_backend(std::move(options));
  REQUIRE_MESSAGE(b.is_ok(), b.status().to_string());
  return std::move(b).value();
}

Region region_of(std::vector<std::byte>& v) {
  return Region{v.data(), v.size(), MemoryKind::kHost, -1};
}

// A put and a bit-exact get of a fresh object of `bytes`; returns the first failure, or OK.
Status round_trip(Backend& b, std::uint64_t n, std::size_t bytes = 4096) {
  auto k = key_of(n, 21);
  auto img = make_image(k, bytes, n);
  Completion p = test::run(b, Op::kPut, k, region_of(img));
  if (!p.status.is_ok()) return p.status;
  std::vector<std::byte> buf(img.size());
  Completion g = test::run(b, Op::kGet, k, region_of(buf));
  if (!g.status.is_ok()) return g.status;
  if (g.bytes != img.size() || std::memcmp(buf.data(), img.data(), img.size()) != 0)
    return Status::io_error("wrong bytes read back");
  return Status::ok();
}

bool says(const Status& s, std::string_view what) {
  return s.message().find(what) != std::string_view::npos;
}

}  // namespace

TEST_CASE("a valid chain: CA file and CA directory; values of every size go through") {
  TlsRedisServer srv(*g_pki, "server", false);
  REQUIRE_MESSAGE(srv.start(), srv.log());
  {
    auto b = make_backend({{"url", srv.url()}, {"tls_ca_file", g_pki->crt("ca")}});
    CHECK(b->describe().find("over TLS") != std::string::npos);
    for (std::size_t bytes : {1ul, 1000ul, 64ul * 1024, 1ul << 20, 3ul << 20}) {
      Status s = round_trip(*b, bytes, bytes);
      CHECK_MESSAGE(s.is_ok(), bytes, ": ", s.to_string());
    }
    // Many requests pipelined on each connection at once.
    std::vector<std::vector<std::byte>> imgs, bufs;
    std::vector<IoRequest> reqs;
    for (std::uint64_t i = 0; i < 64; ++i) {
      imgs.push_back(make_image(key_of(100 + i, 21), 20000, i));
      CHECK(test::run(*b, Op::kPut, key_of(100 + i, 21), region_of(imgs.back())).status.is_ok());
    }
    bufs.assign(imgs.size(), std::vector<std::byte>(imgs[0].size()));
    for (std::uint64_t i = 0; i < imgs.size(); ++i)
      reqs.push_back(IoRequest{Op::kGet, key_of(100 + i, 21), region_of(bufs[i]), i});
    std::size_t sent = 0, done = 0;
    auto end = std::chrono::steady_clock::now() + 20s;
    while (done < reqs.size() && std::chrono::steady_clock::now() < end) {
      if (sent < reqs.size()) sent += b->submit(std::span(reqs).subspan(sent)).value();
      Completion out[64];
      std::size_t n = b->poll(out, 1, 100ms).value();
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(out[i].status.is_ok());
        CHECK(bufs[out[i].user_data] == imgs[out[i].user_data]);
      }
      done += n;
    }
    CHECK(done == reqs.size());
    CHECK(b->stats().connect_failures.get() == 0);
  }
  {
    auto b = make_backend({{"url", srv.url("localhost")}, {"tls_ca_path", g_pki->ca_dir()}});
    Status s = round_trip(*b, 2);
    CHECK_MESSAGE(s.is_ok(), s.to_string());
  }
}

TEST_CASE("verification fails: a wrong CA, an expired certificate, another name") {
  SUBCASE("a CA that did not sign the server's certificate") {
    TlsRedisServer srv(*g_pki, "server", false);
    REQUIRE(srv.start());
    auto b = make_backend({{"url", srv.url()}, {"tls_ca_file", g_pki->crt("other-ca")}});
    Status s = round_trip(*b, 1);
    CHECK(s.code() == Code::kIoError);
    CHECK_MESSAGE(says(s, "TLS handshake failed"), s.to_string());
    // OpenSSL's reason depends on whether the server sends its CA along: "unable to get local
    // issuer certificate" or "self-signed certificate in certificate chain".
    CHECK_MESSAGE(says(s, "certificate verify failed"), s.to_string());
    CHECK(b->stats().connect_failures.get() >= 1);
    CHECK(b->stats().connects.get() == 0);
  }
  SUBCASE("the system trust store (no CA option) does not know the test CA") {
    TlsRedisServer srv(*g_pki, "server", false);
    REQUIRE(srv.start());
    auto b = make_backend({{"url", srv.url()}});
    Status s = round_trip(*b, 1);
    CHECK(s.code() == Code::kIoError);
    CHECK_MESSAGE(says(s, "certificate verify failed"), s.to_string());
  }
  SUBCASE("an expired certificate") {
    TlsRedisServer srv(*g_pki, "expired", false);
    REQUIRE(srv.start());
    auto b = make_backend({{"url", srv.url()}, {"tls_ca_file", g_pki->crt("ca")}});
    Status s = round_trip(*b, 1);
    CHECK(s.code() == Code::kIoError);
    CHECK_MESSAGE(says(s, "certificate has expired"), s.to_string());
  }
  SUBCASE("a certificate for another name; tls_server_name names it") {
    TlsRedisServer srv(*g_pki, "elsewhere", false);
    REQUIRE(srv.start());
    auto b = make_backend({{"url", srv.url()}, {"tls_ca_file", g_pki->crt("ca")}});
    Status s = round_trip(*b, 1);
    CHECK(s.code() == Code::kIoError);
    CHECK_MESSAGE(says(s, "mismatch"), s.to_string());
    auto named = make_backend({{"url", srv.url()},
                               {"tls_ca_file", g_pki->crt("ca")},
                               {"tls_server_name", "other.example"}});
    s = round_trip(*named, 2);
    CHECK_MESSAGE(s.is_ok(), s.to_string());
  }
  SUBCASE("tls_verify false encrypts without verifying") {
    TlsRedisServer srv(*g_pki, "expired", false);
    REQUIRE(srv.start());
    auto b = make_backend({{"url", srv.url()}, {"tls_verify", false}});
    Status s = round_trip(*b, 1);
    CHECK_MESSAGE(s.is_ok(), s.to_string());
  }
}

TEST_CASE("mutual TLS: a server that requires client certificates") {
  TlsRedisServer srv(*g_pki, "server", true);
  REQUIRE(srv.start());
  auto with_cert = make_backend({{"url", srv.url()},
                                 {"tls_ca_file", g_pki->crt("ca")},
                                 {"tls_cert_file", g_pki->crt("client")},
                                 {"tls_key_file", g_pki->key("client")}});
  Status s = round_trip(*with_cert, 1);
  CHECK_MESSAGE(s.is_ok(), s.to_string());
  auto without = make_backend({{"url", srv.url()}, {"tls_ca_file", g_pki->crt("ca")}});
  s = round_trip(*without, 2);
  CHECK(s.code() == Code::kIoError);
  MESSAGE("without a client certificate: ", s.to_string());
}

TEST_CASE("a server killed and restarted: the tier reconnects over TLS") {
  TlsRedisServer srv(*g_pki, "server", false);
  REQUIRE(srv.start());
  auto b = make_backend({{"url", srv.url()}, {"tls_ca_file", g_pki->crt("ca")}});
  REQUIRE(round_trip(*b, 1).is_ok());
  srv.kill();
  CHECK_FALSE(round_trip(*b, 2).is_ok());
  REQUIRE(srv.start());
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    back = round_trip(*b, 10 + static_cast<std::uint64_t>(i)).is_ok();
    if (!back) std::this_thread::sleep_for(50ms);
  }
  CHECK(back);
  CHECK(b->stats().connects.get() >= 2);
}

TEST_CASE("bad TLS options are refused at create, naming the option") {
  auto missing = try_backend({{"url", "rediss://127.0.0.1:1"}, {"tls_ca_file", "/nonexistent"}});
  CHECK(missing.status().code() == Code::kInvalidArgument);
  CHECK_MESSAGE(says(missing.status(), "tls_ca_file"), missing.status().to_string());
  auto mismatch = try_backend({{"url", "rediss://127.0.0.1:1"},
                               {"tls_cert_file", g_pki->crt("client")},
                               {"tls_key_file", g_pki->key("server")}});
  CHECK(mismatch.status().code() == Code::kInvalidArgument);
  CHECK_MESSAGE(says(mismatch.status(), "tls_key_file"), mismatch.status().to_string());
  auto plain = try_backend({{"url", "redis://127.0.0.1:1"}, {"tls_ca_file", g_pki->crt("ca")}});
  CHECK(plain.status().code() == Code::kInvalidArgument);
  CHECK_MESSAGE(says(plain.status(), "rediss://"), plain.status().to_string());
  // Issue 26: a missing tls_ca_path was reported at the first handshake, not at create.
  auto no_dir = try_backend({{"url", "rediss://127.0.0.1:1"}, {"tls_ca_path", "/nonexistent"}});
  CHECK(no_dir.status().code() == Code::kInvalidArgument);
  CHECK_MESSAGE(says(no_dir.status(), "tls_ca_path"), no_dir.status().to_string());
  auto file_as_dir =
      try_backend({{"url", "rediss://127.0.0.1:1"}, {"tls_ca_path", g_pki->crt("ca")}});
  CHECK_MESSAGE(says(file_as_dir.status(), "is not a directory"), file_as_dir.status().to_string());
  // A server name longer than any host name only ever showed "unreachable (reconnecting)".
  auto long_name =
      try_backend({{"url", "rediss://127.0.0.1:1"}, {"tls_server_name", std::string(300, 'a')}});
  CHECK(long_name.status().code() == Code::kInvalidArgument);
  CHECK_MESSAGE(says(long_name.status(), "tls_server_name"), long_name.status().to_string());
}

TEST_CASE("a FIFO named as a TLS file is refused at create, never opened (it would block)") {
  char dir[] = "/tmp/libtier-tls-fifo.XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string fifo = std::string(dir) + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* option : {"tls_ca_file", "tls_cert_file"}) {
    CAPTURE(option);
    auto b = try_backend({{"url", "rediss://127.0.0.1:1"}, {option, fifo}});
    CHECK(b.status().code() == Code::kInvalidArgument);
    CHECK_MESSAGE(says(b.status(), "is not a regular file"), b.status().to_string());
  }
  ::unlink(fifo.c_str());
  ::rmdir(dir);
}

TEST_CASE("rediss:// to a plain server: the handshake fails within connect_timeout") {
  test::RedisServer plain;
  REQUIRE(plain.start());
  auto b = make_backend({{"url", "rediss://127.0.0.1:" + std::to_string(plain.port())},
                         {"tls_ca_file", g_pki->crt("ca")}});
  Status s = round_trip(*b, 1);
  // The server waits for the end of a line that the ClientHello never has, or refuses it.
  CHECK((s.code() == Code::kTimedOut || s.code() == Code::kIoError));
  CHECK(b->stats().connect_failures.get() >= 1);
  CHECK(b->stats().connects.get() == 0);
  MESSAGE(s.to_string());
}

int main(int argc, char** argv) {
  if (!tier::test::have_program("redis-server") || !tier::test::have_program("openssl")) {
    std::fprintf(stderr, "redis-server or openssl is not installed: skipping\n");
    return tier::test::kSkip;
  }
  if (!tier::redis::tls_available()) {
    std::fprintf(stderr, "this build has no TLS (OpenSSL not found): skipping\n");
    return tier::test::kSkip;
  }
  TestPki pki;
  if (!pki.ok()) {
    std::fprintf(stderr, "cannot make test certificates: %s\n", pki.error().c_str());
    return 1;
  }
  {
    TlsRedisServer probe(pki, "server", false);
    if (!probe.start()) {
      std::fprintf(stderr, "redis-server does not serve TLS here: skipping\n%s\n",
                   probe.log().c_str());
      return tier::test::kSkip;
    }
  }
  g_pki = &pki;
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
