// The remote tier against a hostile or broken server: a fake RESP server on a loopback port
// (a plain-socket server on a thread of its own) answers the handshake PING or the first data
// command with scripted bytes, then floods, drips or keeps still. Each request must end with a
// clear error (IoError naming the protocol problem, or TimedOut), never hang, and the
// connection's read buffer must stay within its bound (RedisStats::read_buffer_peak).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "redis_backend.hpp"
#include "support/test_util.hpp"
#include "tier/options.hpp"
#include "tier/registry.hpp"

using namespace tier;
using namespace std::chrono_literals;
using tier::redis::RedisBackend;
using tier::test::key_of;
using tier::test::make_image;

namespace {

// What the fake server does after a scripted reply.
enum class Then { kStill, kFlood, kDrip };

struct Script {
  std::string ping = "+PONG\r\n";  // the reply to PING
  Then after_ping = Then::kStill;  // kStill: go on to the data command
  std::string reply;               // the reply to the first SET or GET
  Then after_reply = Then::kStill;
  char fill = 'x';  // the byte flooded or dripped
};

class FakeRedis {
 public:
  explicit FakeRedis(Script script) : script_(std::move(script)) {
    // Non-blocking: serve() polls 10 ms at a time and then accepts, so that a stop is seen
    // whether or not a client ever connects again (a blocking accept after a poll that timed
    // out waited for a connection that never came, and the destructor's join with it).
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeRedis() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

 private:
  // Waits up to 10 ms for `events` on `fd`; false when the server is stopping.
  bool wait_for(int fd, short events) {
    pollfd p{fd, events, 0};
    ::poll(&p, 1, 10);
    return !stop_;
  }
  bool send_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      if (!wait_for(fd, POLLOUT)) return false;
      ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN) return false;
      if (n > 0) bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  // Floods or drips until the client goes away or the server stops.
  void tail(int fd, Then then) {
    const std::string chunk(then == Then::kFlood ? 64 * 1024 : 1, script_.fill);
    while (!stop_ && send_all(fd, chunk))
      if (then == Then::kDrip) wait_for(fd, 0);  // one byte per 10 ms
  }
  void session(int fd) {
    std::string in;
    bool pinged = false;
    char buf[4096];
    while (wait_for(fd, POLLIN)) {
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return;  // the client closed the connection
      if (n > 0) in.append(buf, static_cast<std::size_t>(n));
      if (std::size_t at = in.find("\r\nPING\r\n"); !pinged && at != std::string::npos) {
        pinged = true;
        in.erase(0, at + 8);  // the data command may have come in the same read
        if (!send_all(fd, script_.ping)) return;
        if (script_.after_ping != Then::kStill) return tail(fd, script_.after_ping);
      }
      if (pinged && (in.find("\r\nSET\r\n") != std::string::npos ||
                     in.find("\r\nGET\r\n") != std::string::npos)) {
        in.clear();
        if (!send_all(fd, script_.reply)) return;
        if (script_.after_reply != Then::kStill) return tail(fd, script_.after_reply);
      }
    }
  }
  void serve() {
    while (wait_for(fd_, POLLIN)) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK);
      if (c < 0) continue;
      ++connections_;
      session(c);
      ::close(c);
    }
  }

  Script script_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

constexpr auto kTimeout = 300ms;  // the tier's request and connect timeout here
// A request that has not ended by then has hung: far beyond the timeout plus the sweep interval.
constexpr auto kHung = 30 * kTimeout;

std::unique_ptr<RedisBackend> make_backend(const std::string& url, Json options = Json::object()) {
  const PluginInfo* info = Registry::global().find(PluginKind::kBackend, "redis");
  REQUIRE(info != nullptr);
  options["url"] = url;
  options["connections"] = 1u;
  options["timeout"] = "300ms";
  options["connect_timeout"] = "300ms";
  options["reconnect_max"] = "100ms";
  ConfigErrors errors;
  Json o = resolve_options(options, info->options, "", errors);
  REQUIRE_MESSAGE(errors.empty(), errors.joined());
  auto b = RedisBackend::create(BackendContext{"remote", 1ull << 30, o});
  REQUIRE_MESSAGE(b.is_ok(), b.status().to_string());
  return std::move(b).value();
}

// Runs one request on a helper thread (which owns the backend meanwhile) and returns its
// completion; a request that has not ended within kHung ends the test program: it hung.
Completion run_bounded(Backend& b, Op op, std::vector<std::byte>& buf) {
  auto done = std::async(std::launch::async, [&] {
    return test::run(b, op, key_of(1, 3), Region{buf.data(), buf.size(), MemoryKind::kHost, -1},
                     std::chrono::duration_cast<std::chrono::milliseconds>(10 * kHung));
  });
  if (done.wait_for(kHung) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: the request did not end within %lld ms\n",
                 static_cast<long long>(kHung.count()));
    std::_Exit(1);
  }
  return done.get();
}

// Checks the buffer bound and that the tier stays usable for the next request.
void check_bounded(const RedisBackend& b) {
  CHECK(b.stats().read_buffer_peak.get() <= redis::kReadBufferBytes);
  MESSAGE(b.describe());
}

bool says(const Completion& c, std::string_view what) {
  return c.status.message().find(what) != std::string_view::npos;
}

}  // namespace

TEST_CASE("PING answered with a 9999999999-byte bulk and a flood: IoError at the header") {
  FakeRedis srv({.ping = "$9999999999\r\n", .after_ping = Then::kFlood});
  auto b = make_backend(srv.url());
  std::vector<std::byte> buf(4096);
  Completion c = run_bounded(*b, Op::kGet, buf);
  CHECK(c.status.code() == Code::kIoError);
  CHECK_MESSAGE(says(c, "bulk length 9999999999 is over this reply's limit of 65536 bytes"),
                c.status.to_string());
  CHECK_MESSAGE(says(c, "in the reply to PING"), c.status.to_string());
  CHECK(b->stats().protocol_errors.get() >= 1);
  check_bounded(*b);
}

TEST_CASE("SET answered with a 9999999999-byte bulk and a flood: IoError at the header") {
  FakeRedis srv({.reply = "$9999999999\r\n", .after_reply = Then::kFlood});
  auto b = make_backend(srv.url());
  auto img = make_image(key_of(1, 3), 1000);
  Completion c = run_bounded(*b, Op::kPut, img);
  CHECK(c.status.code() == Code::kIoError);
  CHECK_MESSAGE(says(c, "bulk length 9999999999"), c.status.to_string());
  CHECK_MESSAGE(says(c, "in the reply to SET"), c.status.to_string());
  CHECK(b->stats().protocol_errors.get() >= 1);
  CHECK(b->usage().objects == 0);
  check_bounded(*b);
}

TEST_CASE("GET answered with a value longer than max_object_bytes: IoError at the header") {
  FakeRedis srv({.reply = "$9999999999\r\n", .after_reply = Then::kFlood});
  auto b = make_backend(srv.url());
  std::vector<std::byte> buf(4096);
  Completion c = run_bounded(*b, Op::kGet, buf);
  CHECK(c.status.code() == Code::kIoError);
  CHECK_MESSAGE(says(c, "value of 9999999999 bytes is over the limit of 536870912 bytes"),
                c.status.to_string());
  CHECK(b->stats().protocol_errors.get() >= 1);
  check_bounded(*b);
}

TEST_CASE("a status line without end: IoError once it passes the limit") {
  FakeRedis srv({.ping = "+PON", .after_ping = Then::kFlood, .fill = 'G'});
  auto b = make_backend(srv.url());
  std::vector<std::byte> buf(4096);
  Completion c = run_bounded(*b, Op::kGet, buf);
  CHECK(c.status.code() == Code::kIoError);
  CHECK_MESSAGE(says(c, "over this reply's limit of 65536 bytes"), c.status.to_string());
  CHECK(b->stats().protocol_errors.get() >= 1);
  check_bounded(*b);
}

TEST_CASE("an 11-byte *20000000 header: IoError at once, nothing allocated for it") {
  SUBCASE("in the reply to PING") {
    FakeRedis srv({.ping = "*20000000\r\n"});
    auto b = make_backend(srv.url());
    std::vector<std::byte> buf(4096);
    Completion c = run_bounded(*b, Op::kGet, buf);
    CHECK(c.status.code() == Code::kIoError);
    CHECK_MESSAGE(says(c, "array of 20000000 elements is over this reply's limit of 64"),
                  c.status.to_string());
    check_bounded(*b);
  }
  SUBCASE("in the reply to GET") {
    FakeRedis srv({.reply = "*20000000\r\n"});
    auto b = make_backend(srv.url());
    std::vector<std::byte> buf(4096);
    Completion c = run_bounded(*b, Op::kGet, buf);
    CHECK(c.status.code() == Code::kIoError);
    CHECK_MESSAGE(says(c, "array of 20000000 elements"), c.status.to_string());
    CHECK_MESSAGE(says(c, "in the reply to GET"), c.status.to_string());
    check_bounded(*b);
  }
}

TEST_CASE("a reply that drips and never completes: TimedOut") {
  SUBCASE("a GET value") {
    FakeRedis srv({.reply = "$100000\r\n", .after_reply = Then::kDrip});
    auto b = make_backend(srv.url());
    std::vector<std::byte> buf(200000);
    Completion c = run_bounded(*b, Op::kGet, buf);
    CHECK_MESSAGE(c.status.code() == Code::kTimedOut, c.status.to_string());
    CHECK(b->stats().timeouts.get() >= 1);
    check_bounded(*b);
  }
  SUBCASE("the reply to PING") {
    FakeRedis srv({.ping = "+PO", .after_ping = Then::kDrip, .fill = 'N'});
    auto b = make_backend(srv.url());
    std::vector<std::byte> buf(4096);
    Completion c = run_bounded(*b, Op::kGet, buf);
    CHECK_MESSAGE(c.status.code() == Code::kTimedOut, c.status.to_string());
    CHECK(b->stats().timeouts.get() >= 1);
    check_bounded(*b);
  }
}

TEST_CASE("a GET value within max_object_bytes flooded for ever: TimedOut, nothing buffered") {
  // 60 GB fits max_object_bytes (64GiB here) but not the 4 KiB buffer: the value is streamed
  // and dropped; the server keeps sending, so the deadline is enforced between reads.
  FakeRedis srv({.reply = "$60000000000\r\n", .after_reply = Then::kFlood});
  auto b = make_backend(srv.url(), {{"max_object_bytes", "64GiB"}});
  std::vector<std::byte> buf(4096);
  Completion c = run_bounded(*b, Op::kGet, buf);
  CHECK_MESSAGE(c.status.code() == Code::kTimedOut, c.status.to_string());
  CHECK(b->stats().timeouts.get() >= 1);
  check_bounded(*b);
}
