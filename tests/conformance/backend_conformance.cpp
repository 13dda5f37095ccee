// tier-conformance: one conformance suite for every backend, installed for plugin authors
// (docs/plugins.md, "Proving a backend"). The tier under test is tier 0 of the profile named by
// the first argument, else by TIER_TEST_CONFIG; Meson runs this binary once per backend profile
// (tests/conformance/*.json). Other arguments are doctest's (--test-case-exclude=..., -s).
//
// Capacity: tier 0 must hold at least kMinCapacity (the largest object the cases store plus the
// batch case's 200 objects), checked before any case runs; the eviction case fills the tier, so a
// capacity above kMaxFillCapacity is not filled and that case is reported as not exercised.
//
// Exit codes: 0 every case passed; 1 a case failed or the backend failed to start; 2 usage,
// profile or capacity error; 3 every case that ran passed but eviction was not exercised
// (capacity above kMaxFillCapacity): not a pass; 77 (Meson: SKIP) the backend cannot start here
// for a reason it reports as NotSupported (no io_uring, no GPU, no server).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::run;

namespace {

Profile g_profile;
constexpr std::uint64_t kMinCapacity = 4ull << 20;
constexpr std::uint64_t kMaxFillCapacity = 256ull << 20;
constexpr int kExitNotExercised = 3;
bool g_eviction_not_exercised = false;

struct Fixture {
  PluginPtr<Backend> backend{nullptr, {}};
  Fixture() {
    const TierSpec& t = g_profile.tiers.at(0);
    auto b = Registry::global().create_backend(t.backend_type,
                                               BackendContext{t.name, t.capacity_bytes,
                                                              t.backend_options});
    REQUIRE_MESSAGE(b.is_ok(), b.status().to_string());
    backend = std::move(b).value();
  }
  Backend& b() { return *backend; }
  // Buffers honouring the backend's alignment.
  std::shared_ptr<std::byte[]> aligned(std::size_t bytes) {
    std::size_t a = std::max<std::size_t>(b().capabilities().io_alignment, 64);
    std::size_t n = (bytes + a - 1) / a * a;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(a, n));
    return std::shared_ptr<std::byte[]>(p, [](std::byte* q) { std::free(q); });
  }
  std::size_t round(std::size_t bytes) {
    std::size_t a = b().capabilities().io_alignment;
    return (bytes + a - 1) / a * a;
  }
  // An aligned copy of an image (padded with zeros to the alignment; the header says the size).
  Region put_region(const std::vector<std::byte>& img, std::shared_ptr<std::byte[]>& hold) {
    std::size_t n = round(img.size());
    hold = aligned(n);
    std::memset(hold.get(), 0, n);
    std::memcpy(hold.get(), img.data(), img.size());
    return Region{hold.get(), n, MemoryKind::kHost, -1};
  }
  Completion put(const ObjectKey& k, const std::vector<std::byte>& img) {
    std::shared_ptr<std::byte[]> hold;
    return run(b(), Op::kPut, k, put_region(img, hold));
  }
  Completion get(const ObjectKey& k, std::size_t cap, std::shared_ptr<std::byte[]>& hold) {
    std::size_t n = round(cap);
    hold = aligned(n);
    return run(b(), Op::kGet, k, Region{hold.get(), n, MemoryKind::kHost, -1});
  }
  // Gets `k` back and checks it holds exactly `img`.
  void check_stored(const ObjectKey& k, const std::vector<std::byte>& img) {
    std::shared_ptr<std::byte[]> hold;
    Completion g = get(k, img.size(), hold);
    REQUIRE_MESSAGE(g.status.is_ok(), g.status.to_string());
    CHECK(g.bytes == img.size());
    CHECK(std::memcmp(hold.get(), img.data(), img.size()) == 0);
  }
};

}  // namespace

TEST_CASE_FIXTURE(Fixture, "put then get round-trips bit-exact") {
  for (std::size_t size : {1ul, 4096ul, 100'000ul, 1ul << 20}) {
    auto k = key_of(size);
    auto img = make_image(k, size);
    Completion c = put(k, img);
    REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
    check_stored(k, img);
  }
}

TEST_CASE_FIXTURE(Fixture, "put is put-if-absent") {
  auto k = key_of(7);
  REQUIRE(put(k, make_image(k, 1000, 1)).status.is_ok());
  Completion again = put(k, make_image(k, 1000, 2));
  CHECK(again.status.code() == Code::kAlreadyExists);
  std::shared_ptr<std::byte[]> hold;
  Completion g = get(k, 2000, hold);
  REQUIRE(g.status.is_ok());
  auto first = make_image(k, 1000, 1);
  CHECK(std::memcmp(hold.get(), first.data(), first.size()) == 0);  // the first one stays
}

TEST_CASE_FIXTURE(Fixture, "missing keys, contains and remove") {
  auto k = key_of(11);
  std::shared_ptr<std::byte[]> hold;
  CHECK(get(k, 4096, hold).status.code() == Code::kNotFound);
  CHECK(run(b(), Op::kContains, k).status.code() == Code::kNotFound);
  auto img = make_image(k, 3000);
  REQUIRE(put(k, img).status.is_ok());
  Completion c = run(b(), Op::kContains, k);
  CHECK(c.status.is_ok());
  CHECK(c.bytes == img.size());
  CHECK(run(b(), Op::kRemove, k).status.is_ok());
  CHECK(run(b(), Op::kContains, k).status.code() == Code::kNotFound);
  CHECK(run(b(), Op::kRemove, k).status.code() == Code::kNotFound);
  REQUIRE(put(k, img).status.is_ok());  // a removed key can be stored again
}

TEST_CASE_FIXTURE(Fixture, "namespaces and ranks never hit each other") {
  auto a = key_of(5, 100, 0), other_ns = key_of(5, 200, 0), other_rank = key_of(5, 100, 1);
  REQUIRE(put(a, make_image(a, 512)).status.is_ok());
  CHECK(run(b(), Op::kContains, other_ns).status.code() == Code::kNotFound);
  CHECK(run(b(), Op::kContains, other_rank).status.code() == Code::kNotFound);
}

// Clearing a namespace (TierStack::clear, an engine's clear after new weights) lists a tier's keys
// of one namespace. A tier either cannot (NotSupported: nothing else happens) or names exactly the
// namespace's stored objects, every rank's, and nothing of another namespace. The namespace is
// new in every run: shared tiers (shm, disk, redis) keep earlier runs' objects.
TEST_CASE_FIXTURE(Fixture, "list_keys names exactly a namespace's stored objects, every rank's") {
  const std::uint64_t ns = 0x6c697374ull ^ (std::uint64_t{std::random_device{}()} << 20);
  const std::vector<ObjectKey> mine = {key_of(1, ns, 0), key_of(2, ns, 0), key_of(3, ns, 1)};
  const ObjectKey other = key_of(1, ns + 1, 0);
  for (const ObjectKey& k : mine) REQUIRE(put(k, make_image(k, 700)).status.is_ok());
  REQUIRE(put(other, make_image(other, 700)).status.is_ok());
  auto listed = b().list_keys(mine[0].ns);
  if (!listed) {
    CHECK(listed.status().code() == Code::kNotSupported);
  } else {
    std::set<std::string> got, want;
    for (const ObjectKey& k : *listed) got.insert(k.to_string());
    for (const ObjectKey& k : mine) want.insert(k.to_string());
    CHECK(got == want);
    for (const ObjectKey& k : *listed) CHECK(run(b(), Op::kRemove, k).status.is_ok());
    auto after = b().list_keys(mine[0].ns);
    REQUIRE(after.is_ok());
    CHECK(after->empty());
    CHECK(run(b(), Op::kContains, other).status.is_ok());  // the other namespace stays
  }
  for (const ObjectKey& k : mine) (void)run(b(), Op::kRemove, k);
  (void)run(b(), Op::kRemove, other);
}

TEST_CASE_FIXTURE(Fixture, "a too-small get buffer is refused with the size needed") {
  auto k = key_of(13);
  auto img = make_image(k, 64 * 1024);
  REQUIRE(put(k, img).status.is_ok());
  std::shared_ptr<std::byte[]> hold;
  Completion g = get(k, round(1024), hold);
  CHECK(g.status.code() == Code::kInvalidArgument);
  CHECK(g.bytes >= img.size());
}

TEST_CASE_FIXTURE(Fixture, "a batch of requests completes exactly once each") {
  constexpr std::size_t kN = 200;
  std::vector<std::vector<std::byte>> imgs;
  std::vector<std::shared_ptr<std::byte[]>> holds(kN);
  std::vector<IoRequest> reqs;
  for (std::size_t i = 0; i < kN; ++i) {
    auto k = key_of(1000 + i);
    imgs.push_back(make_image(k, 8192, i));
    reqs.push_back(IoRequest{Op::kPut, k, put_region(imgs.back(), holds[i]), i});
  }
  std::set<std::uint64_t> seen;
  std::size_t next = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen.size() < kN && std::chrono::steady_clock::now() < deadline) {
    if (next < kN) {
      auto r = b().submit(std::span(reqs).subspan(next));
      REQUIRE(r.is_ok());
      next += *r;
    }
    Completion out[64];
    auto r = b().poll(out, 1, std::chrono::microseconds(100000));
    REQUIRE(r.is_ok());
    for (std::size_t i = 0; i < *r; ++i) {
      CHECK_MESSAGE(out[i].status.is_ok(), out[i].status.to_string());
      CHECK(seen.insert(out[i].user_data).second);
    }
  }
  CHECK(seen.size() == kN);
  CHECK(b().in_flight() == 0);
  for (std::size_t i = 0; i < kN; i += 37) {
    std::shared_ptr<std::byte[]> hold;
    Completion g = get(reqs[i].key, 16384, hold);
    REQUIRE(g.status.is_ok());
    CHECK(std::memcmp(hold.get(), imgs[i].data(), imgs[i].size()) == 0);
  }
}

// A save's or load's shape: many objects of tens of KiB, all puts in one submit, then all gets in
// one submit into distinct buffers (the cpu tier moves such windows on several threads at once).
// Each completes once, Ok, with exactly its own bytes.
TEST_CASE_FIXTURE(Fixture, "one submit of many small puts, then one of their gets") {
  constexpr std::size_t kN = 24, kPayload = 40 * 1024;
  std::vector<std::vector<std::byte>> imgs;
  std::vector<std::shared_ptr<std::byte[]>> holds(kN), outs(kN);
  std::vector<IoRequest> puts, gets;
  for (std::size_t i = 0; i < kN; ++i) {
    auto k = key_of(7000 + i);
    imgs.push_back(make_image(k, kPayload, i));
    puts.push_back(IoRequest{Op::kPut, k, put_region(imgs.back(), holds[i]), i});
    outs[i] = aligned(round(imgs[i].size()));
    gets.push_back(IoRequest{
        Op::kGet, k, Region{outs[i].get(), round(imgs[i].size()), MemoryKind::kHost, -1}, kN + i});
  }
  for (const auto* batch : {&puts, &gets}) {
    std::map<std::uint64_t, Completion> done;
    std::size_t next = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (done.size() < kN && std::chrono::steady_clock::now() < deadline) {
      if (next < kN) {
        auto r = b().submit(std::span(*batch).subspan(next));
        REQUIRE(r.is_ok());
        next += *r;
      }
      Completion out[64];
      auto r = b().poll(out, 1, std::chrono::microseconds(100000));
      REQUIRE(r.is_ok());
      for (std::size_t i = 0; i < *r; ++i) CHECK(done.emplace(out[i].user_data, out[i]).second);
    }
    REQUIRE(done.size() == kN);
    for (const auto& [id, c] : done) {
      CHECK_MESSAGE(c.status.is_ok(), c.status.to_string());
      CHECK(c.bytes == imgs[id % kN].size());
    }
  }
  for (std::size_t i = 0; i < kN; ++i)
    CHECK(std::memcmp(outs[i].get(), imgs[i].data(), imgs[i].size()) == 0);
  CHECK(b().in_flight() == 0);
}

// Capabilities::concurrent: several threads submit and poll at once; every request completes
// exactly once, in whichever thread polls it, with its own bytes. A tier that does not declare
// it is used by one thread at a time, and this case has nothing to prove.
TEST_CASE_FIXTURE(Fixture, "a concurrent backend serves several threads at once") {
  if (!b().capabilities().concurrent) {
    MESSAGE("not concurrent: one thread at a time");
    return;
  }
  constexpr std::size_t kThreads = 4, kPerThread = 24, kPayload = 20000;
  const std::size_t n = kThreads * kPerThread;
  std::vector<std::vector<std::byte>> imgs(n);
  std::vector<std::shared_ptr<std::byte[]>> puts(n), gets(n);
  for (std::size_t i = 0; i < n; ++i) imgs[i] = make_image(key_of(3000 + i), kPayload, i);
  std::mutex mu;
  std::map<std::uint64_t, Completion> done;  // user_data -> completion, whoever polled it
  auto poll_some = [&] {
    Completion out[8];
    auto r = b().poll(out, 0, std::chrono::microseconds(0));
    REQUIRE(r.is_ok());
    std::lock_guard lock(mu);
    for (std::size_t i = 0; i < *r; ++i) CHECK(done.emplace(out[i].user_data, out[i]).second);
  };
  // Runs one request (user_data `id`) and returns its completion, polled by any thread.
  auto one = [&](const IoRequest& req) {
    for (;;) {
      auto r = b().submit(std::span(&req, 1));
      REQUIRE(r.is_ok());
      if (*r == 1) break;
      poll_some();
    }
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);;) {
      {
        std::lock_guard lock(mu);
        auto it = done.find(req.user_data);
        if (it != done.end()) return it->second;
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      poll_some();
      std::this_thread::yield();
    }
  };
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t j = 0; j < kPerThread; ++j) {
        const std::size_t i = t * kPerThread + j;
        const ObjectKey k = key_of(3000 + i);
        const std::size_t cap = round(imgs[i].size());
        Region pr;
        {
          std::lock_guard lock(mu);  // the fixture's allocation helpers are not shared
          pr = put_region(imgs[i], puts[i]);
          gets[i] = aligned(cap);
        }
        if (!one(IoRequest{Op::kPut, k, pr, 4 * i}).status.is_ok()) ++wrong[t];
        Completion g = one(IoRequest{Op::kGet, k, Region{gets[i].get(), cap, MemoryKind::kHost, -1},
                                     4 * i + 1});
        if (!g.status.is_ok() || std::memcmp(gets[i].get(), imgs[i].data(), imgs[i].size()) != 0)
          ++wrong[t];
        if (!one(IoRequest{Op::kContains, k, Region{}, 4 * i + 2}).status.is_ok()) ++wrong[t];
        if (j % 3 == 0 && !one(IoRequest{Op::kRemove, k, Region{}, 4 * i + 3}).status.is_ok())
          ++wrong[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < kThreads; ++t) CHECK(wrong[t] == 0);
  CHECK(done.size() == n * 3 + (kPerThread + 2) / 3 * kThreads);
  CHECK(b().in_flight() == 0);
}

TEST_CASE_FIXTURE(Fixture, "a put whose image does not match its key is refused") {
  auto k = key_of(21), other = key_of(22);
  Completion c = put(k, make_image(other, 100));
  CHECK(c.status.code() == Code::kInvalidArgument);
  CHECK(run(b(), Op::kContains, k).status.code() == Code::kNotFound);
}

// Capabilities::gather_puts: the header in `buf`, the payload in tail regions (split across a
// checksum chunk here) store the same image as the whole; with seals_puts the header comes
// without its payload checksum and the tier computes it, and a header buffer of another size is
// refused.
TEST_CASE_FIXTURE(Fixture, "a gather put stores its image; a sealing tier computes its checksum") {
  const Capabilities caps = b().capabilities();
  if (!caps.gather_puts) {
    MESSAGE("the tier takes no gather puts");
    return;
  }
  auto k = key_of(23);
  auto img = make_image(k, 100'000);
  std::vector<std::byte> head(img.begin(), img.begin() + kObjectHeaderBytes);
  if (caps.seals_puts) {  // any payload checksum: the tier computes its own
    auto h = parse_object_header(head);
    REQUIRE(h.is_ok());
    h->payload_checksum = 0;
    write_object_header(head, *h);
  }
  std::byte* payload = img.data() + kObjectHeaderBytes;
  const Region tail[] = {Region{payload, 1000, MemoryKind::kHost, -1},
                         Region{payload + 1000, 70'000, MemoryKind::kHost, -1},
                         Region{payload + 71'000, 29'000, MemoryKind::kHost, -1}};
  if (caps.seals_puts) {
    IoRequest short_head{Op::kPut, k, Region{head.data(), 95, MemoryKind::kHost, -1}, 42, tail};
    CHECK(run(b(), short_head).status.code() == Code::kInvalidArgument);
  }
  IoRequest req{Op::kPut, k, Region{head.data(), head.size(), MemoryKind::kHost, -1}, 42, tail};
  Completion c = run(b(), req);
  REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
  check_stored(k, img);
}

// IoRequest::batch_bytes is a hint (a host tier writes the copies of a batch larger than the
// caches with non-temporal stores): whatever it says, puts and gets, whole and gathered, store and
// return the same bytes.
TEST_CASE_FIXTURE(Fixture, "a request's batch_bytes changes no result") {
  const Capabilities caps = b().capabilities();
  std::uint64_t id = 9000;
  for (std::uint64_t batch : {std::uint64_t{0}, std::uint64_t{64} << 10, UINT64_MAX}) {
    for (std::size_t size : {100ul, 4096ul + 7, 100'000ul}) {
      CAPTURE(batch);
      CAPTURE(size);
      const ObjectKey k = key_of(id++);
      auto img = make_image(k, size);
      std::shared_ptr<std::byte[]> hold;
      IoRequest put{Op::kPut, k, put_region(img, hold), 1};
      put.batch_bytes = batch;
      Completion c = run(b(), put);
      REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
      std::shared_ptr<std::byte[]> out = aligned(round(size + kObjectHeaderBytes));
      IoRequest get{Op::kGet, k,
                    Region{out.get(), round(size + kObjectHeaderBytes), MemoryKind::kHost, -1}, 2};
      get.batch_bytes = batch;
      Completion g = run(b(), get);
      REQUIRE_MESSAGE(g.status.is_ok(), g.status.to_string());
      CHECK(std::memcmp(out.get(), img.data(), img.size()) == 0);
      if (!caps.gather_puts) continue;
      const ObjectKey kg = key_of(id++);  // the same payload, gathered from the caller's bytes
      auto gathered = make_image(kg, size);
      std::vector<std::byte> head(gathered.begin(), gathered.begin() + kObjectHeaderBytes);
      const Region tail[] = {
          Region{gathered.data() + kObjectHeaderBytes, size, MemoryKind::kHost, -1}};
      IoRequest gp{Op::kPut, kg, Region{head.data(), head.size(), MemoryKind::kHost, -1}, 3, tail};
      gp.batch_bytes = batch;
      Completion cg = run(b(), gp);
      REQUIRE_MESSAGE(cg.status.is_ok(), cg.status.to_string());
      check_stored(kg, gathered);
    }
  }
}

TEST_CASE_FIXTURE(Fixture, "poll with nothing in flight returns no completion") {
  Completion out[4];
  auto t0 = std::chrono::steady_clock::now();
  auto r = b().poll(out, 1, std::chrono::microseconds(2'000'000));
  REQUIRE(r.is_ok());
  CHECK(*r == 0);
  CHECK(b().in_flight() == 0);
  // It should not wait for completions that cannot come; the time is a figure, not a verdict.
  MESSAGE("poll(min 1, wait 2s) with nothing in flight took "
          << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count()
          << " ms");
}

// A tier whose capacity is advisory (redis: the server's memory policy evicts) leaves this case
// out by name in its runner (redis_env.sh).
TEST_CASE_FIXTURE(Fixture, "capacity is never exceeded; old objects are evicted") {
  const std::uint64_t cap = b().usage().capacity_bytes;
  REQUIRE(cap > 0);
  if (cap > kMaxFillCapacity) {
    g_eviction_not_exercised = true;
    std::fprintf(stderr,
                 "eviction NOT EXERCISED: tier 0's capacity %s is above %s, too large to fill "
                 "here; give the profile under test a smaller capacity\n",
                 format_size(cap).c_str(), format_size(kMaxFillCapacity).c_str());
    return;
  }
  const std::size_t payload = 256 * 1024;
  const std::size_t count = cap / payload + 8;
  for (std::size_t i = 0; i < count; ++i) {
    auto k = key_of(50'000 + i);
    Completion c = put(k, make_image(k, payload));
    CHECK_MESSAGE((c.status.is_ok() || c.status.code() == Code::kNoSpace), c.status.to_string());
    CHECK(b().usage().used_bytes <= cap);
  }
  CHECK(b().metrics().evictions.get() > 0);
  auto last = key_of(50'000 + count - 1);
  CHECK(run(b(), Op::kContains, last).status.is_ok());  // the newest survives
}

// Lookup leases (docs/leases.md). A tier that cannot lease says NotSupported and counts it; every
// other tier holds a leased key against eviction until the lease is released or expires.
struct LeaseFixture : Fixture {
  static constexpr std::size_t kPayload = 256 * 1024;
  // Puts enough new objects to evict everything unleased (capacity plus some), from key `base`.
  void fill(std::uint64_t base) {
    const std::size_t count = b().usage().capacity_bytes / kPayload + 8;
    for (std::size_t i = 0; i < count; ++i) {
      auto k = key_of(base + i);
      Completion c = put(k, make_image(k, kPayload));
      CHECK_MESSAGE((c.status.is_ok() || c.status.code() == Code::kNoSpace), c.status.to_string());
      CHECK(b().usage().used_bytes <= b().usage().capacity_bytes);
    }
  }
  // False (with a message) when the tier cannot lease or is too large to fill here.
  bool leases_apply(const ObjectKey& probe) {
    std::uint8_t held = 0;
    const auto before = b().metrics().leases_unsupported.get();
    auto id = b().lease(std::span(&probe, 1), std::chrono::seconds(60), std::span(&held, 1));
    if (!id && id.status().code() == Code::kNotSupported) {
      CHECK(b().metrics().leases_unsupported.get() == before + 1);
      CHECK(held == 0);
      MESSAGE("this tier cannot lease (NotSupported, counted): " << id.status().to_string());
      return false;
    }
    REQUIRE_MESSAGE(id.is_ok(), id.status().to_string());
    CHECK(*id == 0);  // the probe key is absent: nothing held
    if (b().usage().capacity_bytes > kMaxFillCapacity) {
      MESSAGE("lease eviction cases not exercised: capacity too large to fill here");
      return false;
    }
    return true;
  }
};

TEST_CASE_FIXTURE(LeaseFixture, "a leased key survives eviction pressure until released") {
  if (!leases_apply(key_of(60'999))) return;
  auto k = key_of(60'000), absent = key_of(60'001);
  REQUIRE(put(k, make_image(k, kPayload)).status.is_ok());
  const ObjectKey keys[] = {k, absent};
  std::uint8_t held[2] = {9, 9};
  auto id = b().lease(keys, std::chrono::seconds(600), held);
  REQUIRE(id.is_ok());
  CHECK(*id != 0);
  CHECK(held[0] == 1);
  CHECK(held[1] == 0);
  CHECK(b().metrics().leases.get() == 1);
  CHECK(b().metrics().leased_keys.get() == 1);
  fill(61'000);
  CHECK(b().metrics().evictions.get() > 0);
  CHECK(run(b(), Op::kContains, k).status.is_ok());  // the oldest object, but leased
  std::shared_ptr<std::byte[]> hold;
  Completion g = get(k, kObjectHeaderBytes + kPayload, hold);
  CHECK(g.status.is_ok());
  b().release(*id);
  b().release(*id);  // a second release is ignored
  CHECK(b().metrics().lease_releases.get() == 1);
  CHECK(b().metrics().lease_expiries.get() == 0);
  fill(62'000);
  CHECK(run(b(), Op::kContains, k).status.code() == Code::kNotFound);  // evictable again
}

TEST_CASE_FIXTURE(LeaseFixture, "a lease that reaches its deadline no longer holds its key") {
  if (!leases_apply(key_of(63'999))) return;
  auto k = key_of(63'000);
  REQUIRE(put(k, make_image(k, kPayload)).status.is_ok());
  std::uint8_t held = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto id = b().lease(std::span(&k, 1), std::chrono::milliseconds(1), std::span(&held, 1));
  REQUIRE(id.is_ok());
  CHECK(held == 1);
  // The deadline itself is what is tested: wait until it has certainly passed.
  while (std::chrono::steady_clock::now() < t0 + std::chrono::milliseconds(5)) {
  }
  fill(64'000);
  CHECK(run(b(), Op::kContains, k).status.code() == Code::kNotFound);
  b().release(*id);  // ended already: counted once, as expired
  CHECK(b().metrics().lease_expiries.get() == 1);
  CHECK(b().metrics().lease_releases.get() == 0);
}

TEST_CASE_FIXTURE(LeaseFixture, "a leased key can still be removed explicitly") {
  if (!leases_apply(key_of(65'999))) return;
  auto k = key_of(65'000);
  REQUIRE(put(k, make_image(k, 4096)).status.is_ok());
  std::uint8_t held = 0;
  auto id = b().lease(std::span(&k, 1), std::chrono::seconds(60), std::span(&held, 1));
  REQUIRE(id.is_ok());
  CHECK(held == 1);
  CHECK(run(b(), Op::kRemove, k).status.is_ok());
  CHECK(run(b(), Op::kContains, k).status.code() == Code::kNotFound);
  b().release(*id);
  CHECK(b().metrics().lease_releases.get() == 1);
}

TEST_CASE_FIXTURE(Fixture, "misaligned buffers are refused exactly when the tier needs alignment") {
  const std::size_t a = b().capabilities().io_alignment;
  const std::size_t n = std::max<std::size_t>(a, 64);
  auto hold = aligned(2 * n);
  auto k = key_of(31);
  Completion g = run(b(), Op::kGet, k, Region{hold.get() + 1, n, MemoryKind::kHost, -1});
  // A tier without an alignment requirement looks the (absent) key up instead.
  CHECK(g.status.code() == (a > 1 ? Code::kInvalidArgument : Code::kNotFound));
}

// Persistent backends keep their files under ${TIER_TEST_TMP}: a fresh directory per run unless
// the caller sets it, removed at exit.
struct TempDir {
  std::string path;
  TempDir() {
    if (std::getenv("TIER_TEST_TMP") != nullptr) return;
    std::string pattern = (std::filesystem::temp_directory_path() / "libtier-conf-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) return;
    path = pattern;
    ::setenv("TIER_TEST_TMP", path.c_str(), 1);
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

int main(int argc, char** argv) {
  TempDir tmp;
  const char* path = std::getenv("TIER_TEST_CONFIG");
  std::vector<char*> doctest_args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-' && doctest_args.size() == 1 && i == 1)
      path = argv[i];
    else
      doctest_args.push_back(argv[i]);
  }
  if (path == nullptr) {
    std::fprintf(stderr,
                 "usage: tier-conformance PROFILE [doctest options]\n"
                 "  (or TIER_TEST_CONFIG=PROFILE); tier 0 of the profile is under test\n");
    return 2;
  }
  ConfigErrors errors;
  auto p = load_profile(path, Registry::global(), &errors);
  if (!p) {
    std::fprintf(stderr, "%s\n", p.status().to_string().c_str());
    return 2;
  }
  g_profile = *p;
  const TierSpec& t = g_profile.tiers.at(0);
  if (t.capacity_bytes < kMinCapacity) {
    std::fprintf(stderr,
                 "%s: tier 0 \"%s\" has capacity %s; the conformance suite needs at least %s "
                 "(and at most %s to exercise eviction)\n",
                 path, t.name.c_str(), format_size(t.capacity_bytes).c_str(),
                 format_size(kMinCapacity).c_str(), format_size(kMaxFillCapacity).c_str());
    return 2;
  }
  auto probe = Registry::global().create_backend(
      t.backend_type, BackendContext{t.name, t.capacity_bytes, t.backend_options});
  if (!probe) {
    std::fprintf(stderr, "cannot start %s: %s\n", t.backend_type.c_str(),
                 probe.status().to_string().c_str());
    return probe.status().code() == Code::kNotSupported ? tier::test::kSkip : 1;
  }
  probe.value().reset();
  doctest::Context ctx(static_cast<int>(doctest_args.size()), doctest_args.data());
  int rc = ctx.run();
  if (rc == 0 && g_eviction_not_exercised) {
    std::fprintf(stderr,
                 "tier-conformance: NOT A PASS: every case that ran passed, but eviction was NOT "
                 "EXERCISED (tier 0's capacity is above %s)\n",
                 format_size(kMaxFillCapacity).c_str());
    return kExitNotExercised;
  }
  return rc;
}
