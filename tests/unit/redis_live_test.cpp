// The remote tier against real redis-server processes started here on free loopback ports:
// faults (server down at start, killed mid-load, restarted, paused, port closed), AUTH and
// SELECT, and a 3-master Redis Cluster (spread, hash tags, a slot migration during reads).
// Exits 77 (Meson: SKIP) when redis-server or redis-cli is not installed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "redis_backend.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"
#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using namespace std::chrono_literals;
using tier::redis::RedisBackend;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::RedisCluster;
using tier::test::RedisServer;
using Clock = std::chrono::steady_clock;

namespace {

// Timing is printed, never asserted: the tests check statuses and counters, which do not depend
// on how loaded the machine is. Waits for a condition poll it, bounded.

std::unique_ptr<RedisBackend> make_backend(Json options) {
  const PluginInfo* info = Registry::global().find(PluginKind::kBackend, "redis");
  REQUIRE(info != nullptr);
  if (!options.contains("timeout")) options["timeout"] = "300ms";
  if (!options.contains("connect_timeout")) options["connect_timeout"] = "300ms";
  if (!options.contains("reconnect_max")) options["reconnect_max"] = "100ms";
  ConfigErrors errors;
  Json o = resolve_options(options, info->options, "", errors);
  REQUIRE_MESSAGE(errors.empty(), errors.joined());
  auto b = RedisBackend::create(BackendContext{"remote", 1ull << 30, o});
  REQUIRE_MESSAGE(b.is_ok(), b.status().to_string());
  return std::move(b).value();
}

Region region_of(std::vector<std::byte>& v) {
  return Region{v.data(), v.size(), MemoryKind::kHost, -1};
}

Completion put(Backend& b, const ObjectKey& k, std::vector<std::byte>& img) {
  return test::run(b, Op::kPut, k, region_of(img));
}

// Gets `k` into a fresh buffer and checks it is bit-exact against `expect` when it hits.
Completion get_checked(Backend& b, const ObjectKey& k, const std::vector<std::byte>& expect) {
  std::vector<std::byte> buf(expect.size() + 64);
  Completion c = test::run(b, Op::kGet, k, region_of(buf));
  if (c.status.is_ok()) {
    CHECK(c.bytes == expect.size());
    CHECK(std::memcmp(buf.data(), expect.data(), expect.size()) == 0);
  }
  return c;
}

// Retries a put of a fresh object until it is stored (the tier has recovered) or `limit` passes.
bool recovers(Backend& b, std::uint64_t base, std::chrono::milliseconds limit) {
  auto end = Clock::now() + limit;
  for (std::uint64_t i = 0; Clock::now() < end; ++i) {
    auto k = key_of(base + i, 77);
    auto img = make_image(k, 1000);
    if (put(b, k, img).status.is_ok()) return get_checked(b, k, img).status.is_ok();
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Submits `reqs` and polls every completion; returns them by user_data and the longest time any
// request took from its submission to its completion. `mid_run` runs once, right after the first
// completion arrives (the rest are then still in flight).
struct BatchResult {
  std::map<std::uint64_t, Completion> done;
  Clock::duration longest{};
};
BatchResult run_batch(Backend& b, std::vector<IoRequest>& reqs,
                      const std::function<void()>& mid_run = {}) {
  BatchResult res;
  std::vector<Clock::time_point> start(reqs.size());
  std::size_t next = 0;
  bool called = false;
  auto deadline = Clock::now() + 20s;
  while (res.done.size() < reqs.size() && Clock::now() < deadline) {
    if (next < reqs.size()) {
      auto r = b.submit(std::span(reqs).subspan(next));
      REQUIRE(r.is_ok());
      for (std::size_t i = next; i < next + *r; ++i) start[i] = Clock::now();
      next += *r;
    }
    Completion out[64];
    auto r = b.poll(out, 1, 50ms);
    REQUIRE(r.is_ok());
    for (std::size_t i = 0; i < *r; ++i) {
      res.longest = std::max(res.longest, Clock::now() - start[out[i].user_data]);
      CHECK(res.done.emplace(out[i].user_data, out[i]).second);
    }
    if (!called && mid_run && !res.done.empty()) {
      mid_run();
      called = true;
    }
  }
  CHECK(res.done.size() == reqs.size());
  return res;
}

long long ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// Polls `cond` every 10ms until it holds (true) or `limit` passes (false).
template <class F>
bool eventually(F&& cond, Clock::duration limit) {
  const auto end = Clock::now() + limit;
  for (;;) {
    if (cond()) return true;
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(10ms);
  }
}

// A request failure the tier's contract names for an unreachable or stalled server.
bool unreachable(const Status& s) {
  return s.code() == Code::kIoError || s.code() == Code::kTimedOut;
}

}  // namespace

TEST_CASE("server down at start: create succeeds, requests miss, the tier recovers") {
  RedisServer srv;
  auto b = make_backend({{"url", srv.url()}});  // nothing listens on the port yet
  auto k = key_of(1, 5);
  auto img = make_image(k, 4096);
  auto t0 = Clock::now();
  Completion g = get_checked(*b, k, img);
  Completion p = put(*b, k, img);
  MESSAGE("a get and a put with the server down took ", ms(Clock::now() - t0), " ms");
  CHECK_MESSAGE(unreachable(g.status), g.status.to_string());
  CHECK_MESSAGE(unreachable(p.status), p.status.to_string());
  CHECK(b->stats().timeouts.get() == 0);  // nothing waited for a reply that could not come
  CHECK(b->metrics().of(Op::kPut).errors.get() == 1);  // the save is dropped and counted
  CHECK(b->metrics().of(Op::kGet).errors.get() == 1);

  REQUIRE(srv.start());
  CHECK(recovers(*b, 100, 3000ms));
  CHECK(b->stats().connect_failures.get() > 0);
  CHECK(b->stats().connects.get() > 0);
  MESSAGE(b->describe());
}

TEST_CASE("port closed: every request fails, none hangs") {
  RedisServer nobody;  // never started
  auto b = make_backend({{"url", nobody.url()}, {"connections", 2u}});
  std::vector<std::vector<std::byte>> bufs(50, std::vector<std::byte>(8192));
  std::vector<IoRequest> reqs;
  for (std::size_t i = 0; i < bufs.size(); ++i)
    reqs.push_back(IoRequest{Op::kGet, key_of(i, 6), region_of(bufs[i]), i});
  BatchResult r = run_batch(*b, reqs);  // checks that every request completes
  for (auto& [id, c] : r.done) CHECK_MESSAGE(unreachable(c.status), c.status.to_string());
  MESSAGE("port closed: longest request ", ms(r.longest), " ms");
  CHECK(b->metrics().of(Op::kGet).errors.get() == reqs.size());
  CHECK(b->stats().connects.get() == 0);
  CHECK(b->stats().connect_failures.get() > 0);
}

TEST_CASE("server killed mid-load and restarted: no hang, no wrong data, counted, recovers") {
  RedisServer srv;
  REQUIRE(srv.start());
  auto b = make_backend({{"url", srv.url()}});
  constexpr std::size_t kN = 96;
  std::vector<std::vector<std::byte>> imgs;
  for (std::size_t i = 0; i < kN; ++i) {
    imgs.push_back(make_image(key_of(i, 7), 256 * 1024, i));
    REQUIRE(put(*b, key_of(i, 7), imgs.back()).status.is_ok());
  }
  // Reads of everything, with the server killed right after they are submitted.
  std::vector<std::vector<std::byte>> bufs(kN, std::vector<std::byte>(imgs[0].size()));
  std::vector<IoRequest> reqs;
  for (std::size_t i = 0; i < kN; ++i)
    reqs.push_back(IoRequest{Op::kGet, key_of(i, 7), region_of(bufs[i]), i});
  BatchResult r = run_batch(*b, reqs, [&] { srv.kill(); });
  std::size_t hits = 0, failures = 0;
  for (auto& [id, c] : r.done) {
    if (c.status.is_ok()) {
      ++hits;
      CHECK(std::memcmp(bufs[id].data(), imgs[id].data(), imgs[id].size()) == 0);
    } else {
      ++failures;
      CHECK_MESSAGE(unreachable(c.status), c.status.to_string());
    }
  }
  MESSAGE("killed mid-load: ", hits, " hits, ", failures, " failures, longest ", ms(r.longest),
          " ms");
  CHECK(hits + failures == kN);  // run_batch also checks that none is left hanging
  CHECK(b->metrics().of(Op::kGet).errors.get() == failures);

  // Saves while the server is down are dropped at once and counted.
  auto t0 = Clock::now();
  for (std::size_t i = 0; i < 10; ++i) {
    auto k = key_of(500 + i, 7);
    auto img = make_image(k, 1000);
    Completion c = put(*b, k, img);
    CHECK_MESSAGE(unreachable(c.status), c.status.to_string());
  }
  MESSAGE("10 saves with the server down took ", ms(Clock::now() - t0), " ms");
  CHECK(b->metrics().of(Op::kPut).errors.get() >= 10);
  CHECK(b->stats().disconnects.get() > 0);

  // Restarted empty (no persistence): old keys are misses, never stale or wrong bytes.
  REQUIRE(srv.start());
  CHECK(recovers(*b, 1000, 3000ms));
  std::vector<std::byte> buf(imgs[0].size());
  CHECK(test::run(*b, Op::kGet, key_of(3, 7), region_of(buf)).status.code() == Code::kNotFound);
  MESSAGE(b->describe());
}

TEST_CASE("a stalled server (SIGSTOP): requests time out, the tier recovers") {
  RedisServer srv;
  REQUIRE(srv.start());
  auto b = make_backend({{"url", srv.url()}});
  auto k = key_of(1, 8);
  auto img = make_image(k, 64 * 1024);
  REQUIRE(put(*b, k, img).status.is_ok());
  srv.pause();
  std::vector<std::vector<std::byte>> bufs(20, std::vector<std::byte>(img.size()));
  std::vector<IoRequest> reqs;
  for (std::size_t i = 0; i < bufs.size(); ++i)
    reqs.push_back(IoRequest{Op::kGet, k, region_of(bufs[i]), i});
  BatchResult r = run_batch(*b, reqs);
  for (auto& [id, c] : r.done) CHECK(c.status.code() == Code::kTimedOut);
  MESSAGE("stalled server, timeout 300 ms: longest request ", ms(r.longest), " ms");
  CHECK(b->stats().timeouts.get() > 0);
  CHECK(b->metrics().of(Op::kGet).errors.get() == reqs.size());
  srv.resume();
  CHECK(recovers(*b, 100, 3000ms));
  CHECK(get_checked(*b, k, img).status.is_ok());
}

TEST_CASE("AUTH with a password and with an ACL user; SELECT") {
  RedisServer srv({"--requirepass", "pw1", "--user", "alice", "on", ">pw2", "~*", "&*", "+@all"});
  REQUIRE(srv.start());
  auto k = key_of(1, 9);
  auto img = make_image(k, 2000);
  {
    auto b = make_backend({{"url", srv.url()}, {"password", "pw1"}, {"db", 3}});
    CHECK(put(*b, k, img).status.is_ok());
    CHECK(get_checked(*b, k, img).status.is_ok());
  }
  CHECK(srv.cli("-a pw1 --no-auth-warning -n 3 dbsize").find('1') == 0);
  {
    std::string url = "redis://alice:pw2@127.0.0.1:" + std::to_string(srv.port()) + "/3";
    auto b = make_backend({{"url", url}});
    CHECK(get_checked(*b, k, img).status.is_ok());
  }
  {
    auto b = make_backend({{"url", srv.url()}, {"password", "wrong"}});
    Completion c = get_checked(*b, k, img);
    CHECK(c.status.code() == Code::kIoError);
    CHECK(c.status.message().find("AUTH") != std::string_view::npos);
  }
  {
    auto b = make_backend({{"url", srv.url()}});  // no password at all
    CHECK(get_checked(*b, k, img).status.code() == Code::kIoError);
  }
}

TEST_CASE("ttl: stored objects expire on the server; keys follow the documented format") {
  RedisServer srv;
  REQUIRE(srv.start());
  auto b = make_backend({{"url", srv.url()}, {"ttl", "300ms"}, {"key_prefix", "t:"}});
  auto k = key_of(1, 12, 3);
  auto img = make_image(k, 1000);
  REQUIRE(put(*b, k, img).status.is_ok());
  std::string key = "t:" + k.ns.hex() + ":r3:" + k.id.hex();
  CHECK(srv.cli("strlen " + key).find(std::to_string(img.size())) == 0);
  std::string pttl = srv.cli("pttl " + key);
  CHECK(std::stoi(pttl) > 0);
  CHECK(std::stoi(pttl) <= 300);
  CHECK(eventually(
      [&] { return test::run(*b, Op::kContains, k).status.code() == Code::kNotFound; }, 5s));
  CHECK(b->usage().objects == 1);  // what this client stored; expiry is the server's business
}

namespace {
std::unique_ptr<TierStack> open_stack(const Json& profile) {
  ConfigErrors errors;
  auto p = parse_profile(profile, Registry::global(), "<test>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}
}  // namespace

TEST_CASE("in a stack: write-through saves are dropped and counted while the server is down") {
  RedisServer srv;
  REQUIRE(srv.start());
  Json remote = {
      {"name", "remote"},
      {"capacity", "1GiB"},
      {"backend",
       {{"type", "redis"}, {"url", srv.url()}, {"timeout", "300ms"}, {"reconnect_max", "100ms"}}}};
  auto stack = open_stack(
      {{"tiers",
        Json::array(
            {{{"name", "cpu"}, {"capacity", "8MiB"}, {"backend", {{"type", "cpu"}}}}, remote})}});
  auto only_remote = open_stack({{"tiers", Json::array({remote})}});
  auto codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  std::vector<std::byte> data(1000, std::byte{7});
  Region src{data.data(), data.size(), MemoryKind::kHost, -1};
  auto save = [&](TierStack& s, std::uint64_t n) {
    Status out;
    REQUIRE(s.save(std::span<const SaveItem>({SaveItem{key_of(n, 13), RegionList(&src, 1)}}),
                   *codec, std::span(&out, 1))
                .is_ok());
    return out;
  };
  auto load = [&](TierStack& s, std::uint64_t n) {
    std::vector<std::byte> got(data.size());
    Region dst{got.data(), got.size(), MemoryKind::kHost, -1};
    LoadResult out;
    REQUIRE(s.load(std::span<const LoadItem>({LoadItem{key_of(n, 13), RegionList(&dst, 1)}}),
                   *codec, std::span(&out, 1))
                .is_ok());
    if (out.status.is_ok()) CHECK(got == data);
    return out;
  };
  for (std::uint64_t i = 0; i < 20; ++i) CHECK(save(*stack, i).is_ok());
  CHECK(stack->flush(2000ms).is_ok());
  Backend& tier = stack->tier(1);
  CHECK(tier.metrics().of(Op::kPut).ok.get() == 20);
  CHECK(load(*only_remote, 3).tier == 0);  // another node finds it in the shared tier

  srv.kill();
  auto t0 = Clock::now();
  for (std::uint64_t i = 100; i < 120; ++i) CHECK(save(*stack, i).is_ok());  // the cpu tier
  CHECK(stack->flush(2000ms).is_ok());
  MESSAGE("20 saves and a flush with the server down took ", ms(Clock::now() - t0), " ms");
  CHECK(tier.metrics().dropped_saves.get() == 20);
  CHECK(load(*stack, 105).tier == 0);  // served by the cpu tier
  LoadResult miss = load(*only_remote, 3);
  CHECK_MESSAGE(unreachable(miss.status), miss.status.to_string());  // the tier's error
  CHECK(miss.tier == -1);

  REQUIRE(srv.start());
  std::uint64_t n = 199;
  // Write-through reaches the restarted server again once the tier has reconnected.
  CHECK(eventually(
      [&] {
        ++n;
        CHECK(save(*stack, n).is_ok());
        CHECK(stack->flush(2000ms).is_ok());
        return load(*only_remote, n).status.is_ok();
      },
      3s));
  CHECK(load(*only_remote, n).tier == 0);
}

namespace {
std::size_t count_keys(RedisServer& node, const std::string& pattern) {
  std::string out = node.cli("--scan --pattern '" + pattern + "'");
  return static_cast<std::size_t>(std::count(out.begin(), out.end(), '\n'));
}
}  // namespace

TEST_CASE("redis cluster: spread, hash tags, and a slot migration during reads") {
  RedisCluster cluster;
  REQUIRE(cluster.start());
  auto b = make_backend({{"url", cluster.node(0).url()},
                         {"mode", "cluster"},
                         {"key_prefix", "spread:"},
                         {"timeout", "2s"}});
  constexpr std::size_t kN = 300;
  std::vector<std::vector<std::byte>> imgs;
  for (std::size_t i = 0; i < kN; ++i) {
    imgs.push_back(make_image(key_of(i, 10), 4096, i));
    Completion c = put(*b, key_of(i, 10), imgs.back());
    REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
  }
  std::size_t total = 0;
  for (std::size_t n = 0; n < cluster.size(); ++n) {
    std::size_t keys = count_keys(cluster.node(n), "spread:*");
    MESSAGE("master ", n, " holds ", keys, " keys");
    CHECK(keys > kN / 6);  // CRC16 spreads them roughly evenly over the 3 masters
    total += keys;
  }
  CHECK(total == kN);

  SUBCASE("hash tag namespace_rank keeps a namespace and rank on one shard") {
    auto t = make_backend({{"url", cluster.node(1).url()},
                           {"mode", "cluster"},
                           {"key_prefix", "tag:"},
                           {"hash_tag", "namespace_rank"}});
    for (std::size_t i = 0; i < 40; ++i) {
      auto k = key_of(i, 11, 2);
      auto img = make_image(k, 512);
      REQUIRE(put(*t, k, img).status.is_ok());
    }
    std::size_t holders = 0;
    for (std::size_t n = 0; n < cluster.size(); ++n) {
      std::size_t keys = count_keys(cluster.node(n), "tag:*");
      CHECK((keys == 0 || keys == 40));
      holders += keys > 0;
    }
    CHECK(holders == 1);
  }

  SUBCASE("moving slots between masters while reading gives no wrong read") {
    std::atomic<bool> moved{false};
    std::string from = cluster.node_id(0), to = cluster.node_id(1);
    std::thread reshard([&] {
      test::shell("redis-cli --cluster reshard 127.0.0.1:" +
                  std::to_string(cluster.node(0).port()) + " --cluster-from " + from +
                  " --cluster-to " + to + " --cluster-slots 1500 --cluster-yes >/dev/null 2>&1");
      moved = true;
    });
    std::size_t passes = 0, reads = 0, failures = 0;
    std::vector<std::vector<std::byte>> bufs(kN, std::vector<std::byte>(imgs[0].size()));
    bool last = false;
    while (!last) {
      last = moved.load();  // one full pass after the migration has finished
      std::vector<IoRequest> reqs;
      for (std::size_t i = 0; i < kN; ++i)
        reqs.push_back(IoRequest{Op::kGet, key_of(i, 10), region_of(bufs[i]), i});
      BatchResult r = run_batch(*b, reqs);
      for (auto& [id, c] : r.done) {
        ++reads;
        if (!c.status.is_ok()) {
          ++failures;
          MESSAGE("read failed: ", c.status.to_string());
          continue;
        }
        CHECK(std::memcmp(bufs[id].data(), imgs[id].data(), imgs[id].size()) == 0);
      }
      ++passes;
    }
    reshard.join();
    MESSAGE(passes, " passes, ", reads, " reads, ", failures, " failed; ", b->describe());
    CHECK(failures == 0);
    CHECK(b->stats().moved.get() + b->stats().asked.get() > 0);
    CHECK(count_keys(cluster.node(0), "spread:*") < count_keys(cluster.node(1), "spread:*"));
  }
}

int main(int argc, char** argv) {
  if (!tier::test::have_program("redis-server") || !tier::test::have_program("redis-cli")) {
    std::fprintf(stderr, "redis-server or redis-cli is not installed: skipping\n");
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
