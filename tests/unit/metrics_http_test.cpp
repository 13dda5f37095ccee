// The metrics endpoint of a profile's "metrics" section over real TCP sockets (docs/metrics.md):
// GET /metrics answers the Prometheus text; other paths and methods are refused; an oversized, a
// slow or a surplus connection is cut off and the endpoint keeps serving; a port in use fails the
// open. Scraped while two threads save and load (suite threads: ThreadSanitizer).
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::test::key_of;

namespace {

std::unique_ptr<TierStack> open_stack(const std::string& metrics) {
  ConfigErrors errors;
  auto p = parse_profile(
      Json::parse(R"({"tiers": [{"name": "cpu", "capacity": "4MiB", "backend": "cpu"}],
                      "metrics": )" +
                  metrics + "}"),
      Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}

// A connected socket to "127.0.0.1:port".
int connect_to(const std::string& endpoint) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port =
      htons(static_cast<std::uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  REQUIRE(inet_pton(AF_INET, endpoint.substr(0, endpoint.rfind(':')).c_str(), &a.sin_addr) == 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Everything the server sends until it closes (or 10 s pass: a test failure, not a measure).
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) {
      out += "<no close>";
      break;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::string http_exchange(const std::string& endpoint, const std::string& request) {
  const int fd = connect_to(endpoint);
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply = read_all(fd);
  ::close(fd);
  return reply;
}

std::string get(const std::string& endpoint, const std::string& path = "/metrics") {
  return http_exchange(endpoint, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
}

}  // namespace

TEST_CASE("GET /metrics: 200 with the Prometheus text of the stack") {
  auto s = open_stack(R"({"listen": "127.0.0.1:0"})");
  const std::string ep = s->metrics_endpoint();
  REQUIRE(ep.rfind("127.0.0.1:", 0) == 0);
  CHECK(ep != "127.0.0.1:0");
  const std::string reply = get(ep);
  CHECK(reply.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(reply.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(reply.find("\r\n\r\n# HELP libtier_ops_total") != std::string::npos);
  CHECK(reply.find("libtier_tier_capacity_bytes{tier=\"cpu\"} 4194304\n") != std::string::npos);
  CHECK(reply.find("libtier_op_duration_seconds_count{op=\"save\",tier=\"cpu\"} 0") !=
        std::string::npos);
  CHECK(get(ep, "/metrics?x=1").rfind("HTTP/1.1 200", 0) == 0);
}

TEST_CASE("only GET /metrics: another path 404, another method 405, a body refused") {
  auto s = open_stack(R"({"listen": "127.0.0.1:0"})");
  const std::string ep = s->metrics_endpoint();
  CHECK(get(ep, "/").rfind("HTTP/1.1 404", 0) == 0);
  CHECK(get(ep, "/metrics/../etc").rfind("HTTP/1.1 404", 0) == 0);
  const std::string post = http_exchange(ep, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(post.rfind("HTTP/1.1 405", 0) == 0);
  CHECK(post.find("Allow: GET") != std::string::npos);
  // A request with a body is not read: the connection closes without an answer.
  CHECK(http_exchange(ep, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            .empty());
  CHECK(http_exchange(ep, "garbage\r\n\r\n").empty());
  CHECK(get(ep).rfind("HTTP/1.1 200", 0) == 0);  // still serving
}

TEST_CASE("a request larger than 8 KiB is cut off; the endpoint keeps serving") {
  auto s = open_stack(R"({"listen": "127.0.0.1:0"})");
  const std::string ep = s->metrics_endpoint();
  const std::string big =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  CHECK(http_exchange(ep, big).find("200 OK") == std::string::npos);
  CHECK(get(ep).rfind("HTTP/1.1 200", 0) == 0);
}

TEST_CASE("a client that sends nothing is disconnected after the timeout") {
  auto s = open_stack(R"({"listen": "127.0.0.1:0", "timeout": "200ms"})");
  const std::string ep = s->metrics_endpoint();
  const int idle = connect_to(ep);
  CHECK(read_all(idle).empty());  // closed by the server, well before read_all's 10 s
  ::close(idle);
  // A trickle of bytes does not extend the deadline either.
  const int slow = connect_to(ep);
  ::send(slow, "GET /met", 8, MSG_NOSIGNAL);
  CHECK(read_all(slow).empty());
  ::close(slow);
  CHECK(get(ep).rfind("HTTP/1.1 200", 0) == 0);
}

TEST_CASE("max_connections: a connection beyond them is closed at once") {
  auto s = open_stack(R"({"listen": "127.0.0.1:0", "max_connections": 2, "timeout": "30s"})");
  const std::string ep = s->metrics_endpoint();
  const int a = connect_to(ep), b = connect_to(ep);
  // Once the server holds both (waiting for their requests), a third is closed unanswered; until
  // it has accepted them, a third may still be served.
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    refused = get(ep).empty();
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(refused);
  ::close(a);
  ::close(b);
  std::string after;
  for (int i = 0; i < 100 && after.rfind("HTTP/1.1 200", 0) != 0; ++i) {
    after = get(ep);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(after.rfind("HTTP/1.1 200", 0) == 0);
}

TEST_CASE("a port in use fails the open with IoError naming the address") {
  auto first = open_stack(R"({"listen": "127.0.0.1:0"})");
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers": [{"name": "cpu", "capacity": "1MiB",
      "backend": "cpu"}], "metrics": {"listen": ")" +
                                     first->metrics_endpoint() + R"("}})"),
                         Registry::global(), "<t>", &errors);
  REQUIRE(p.is_ok());
  auto second = TierStack::open(*p);
  REQUIRE_FALSE(second.is_ok());
  CHECK(second.status() == Code::kIoError);
  CHECK(std::string(second.status().message()).find(first->metrics_endpoint()) !=
        std::string::npos);
}

TEST_CASE("scrapes while two threads save and load: counters only, no lock, no race") {
  auto s = open_stack(R"({"listen": "127.0.0.1:0"})");
  auto codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  std::atomic<bool> stop{false};
  constexpr int kItems = 200;
  auto worker = [&](std::uint64_t base) {
    std::vector<std::byte> data(4096, std::byte{7});
    for (int i = 0; i < kItems; ++i) {
      Region r = host_region(data);
      Status out;
      SaveItem item{key_of(base + static_cast<std::uint64_t>(i)), RegionList(&r, 1)};
      CHECK(s->save(std::span(&item, 1), *codec, std::span(&out, 1)).is_ok());
      LoadResult res;
      LoadItem li{key_of(base + static_cast<std::uint64_t>(i)), RegionList(&r, 1)};
      CHECK(s->load(std::span(&li, 1), *codec, std::span(&res, 1)).is_ok());
    }
  };
  std::thread scraper([&] {
    while (!stop.load()) CHECK(get(s->metrics_endpoint()).rfind("HTTP/1.1 200", 0) == 0);
  });
  std::thread t1(worker, 0), t2(worker, 100000);
  t1.join();
  t2.join();
  stop = true;
  scraper.join();
  const std::string reply = get(s->metrics_endpoint());
  CHECK(reply.find("libtier_op_duration_seconds_count{op=\"save\",tier=\"cpu\"} " +
                   std::to_string(2 * kItems) + "\n") != std::string::npos);
  CHECK(reply.find("libtier_op_duration_seconds_count{op=\"load\",tier=\"cpu\"} " +
                   std::to_string(2 * kItems) + "\n") != std::string::npos);
}
