// The cpu tier's shm mode with real processes on real shared memory: several writers and readers
// on one segment, kill -9 of writers at random instants and at chosen crash points, restart and
// reattach, two namespaces side by side. Children are fork()ed, talk to the segment through the
// registry-created backend (so the core verifies every get), and report through exit codes.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "shm/store.hpp"
#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::cpu::ShmCrashPoint;
using tier::cpu::ShmStore;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::run;
using tier::test::wait_child;

namespace {

constexpr std::uint64_t kCapacity = 16ull << 20;

// A segment name unique to this test run, removed when the test case ends.
struct Segment {
  std::string name;
  Segment() {
    static int counter = 0;
    name = fmt::format("libtier-unit-{}-{}", ::getpid(), counter++);
  }
  ~Segment() { ShmStore::remove_segment(name).ignore(); }
};

// Children fork()ed from this multi-threaded process start no thread (ThreadSanitizer cannot
// follow them): their tiers map pages on first use ("off"), not on a mapping thread.
Json shm_options(const std::string& segment, const char* prefault = "off") {
  return Json{{"mode", "shm"}, {"segment", segment}, {"block_size", 16384}, {"prefault", prefault}};
}

PluginPtr<Backend> open_backend(const std::string& segment, std::uint64_t capacity = kCapacity,
                                const char* prefault = "off") {
  auto b = Registry::global().create_backend(
      "cpu", BackendContext{"cpu", capacity, shm_options(segment, prefault)});
  if (!b) {
    std::fprintf(stderr, "open %s: %s\n", segment.c_str(), b.status().to_string().c_str());
    return PluginPtr<Backend>(nullptr, {});
  }
  return std::move(b).value();
}

// Deterministic payload size of a key: 1 KiB .. ~200 KiB.
std::size_t payload_of(const ObjectKey& k) { return 1024 + (k.id.lo * 7919 + k.ns.lo) % 200'000; }

// Exit codes of children.
constexpr int kChildOk = 0, kChildCorrupt = 3, kChildSetup = 4, kChildError = 5;

// Runs `fn` in a child process; returns the child's pid.
pid_t spawn(const std::function<int()>& fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(60);  // a hung child dies instead of hanging the suite
    set_verify_threads(1);  // a forked child starts no thread (ThreadSanitizer cannot follow it)
    int rc = fn();
    ::_exit(rc);
  }
  return pid;
}

// Puts `count` objects of namespace `ns` starting at id `first`, forever when `count` is 0.
int writer(const std::string& segment, std::uint64_t ns, std::uint64_t first, std::uint64_t count,
           std::uint64_t seed = 0) {
  auto b = open_backend(segment);
  if (!b) return kChildSetup;
  for (std::uint64_t i = 0; count == 0 || i < count; ++i) {
    auto k = key_of(first + (count == 0 ? i % 5000 : i), ns);
    auto img = make_image(k, payload_of(k), seed);
    Completion c = run(*b, Op::kPut, k, host_region(img));
    if (!c.status.is_ok() && c.status.code() != Code::kAlreadyExists) {
      std::fprintf(stderr, "writer put: %s\n", c.status.to_string().c_str());
      return kChildError;
    }
  }
  return kChildOk;
}

// Reads random keys of [first, first + span) in namespace `ns` for `ms` milliseconds; every hit
// must be bit-exact. Returns kChildCorrupt on any wrong byte or checksum failure.
int reader(const std::string& segment, std::uint64_t ns, std::uint64_t first, std::uint64_t span,
           int ms, std::uint64_t seed = 0, std::uint64_t* hits_out = nullptr) {
  auto b = open_backend(segment);
  if (!b) return kChildSetup;
  std::mt19937_64 rng(::getpid());
  std::vector<std::byte> buf(300'000);
  std::uint64_t hits = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    auto k = key_of(first + rng() % span, ns);
    Completion c = run(*b, Op::kGet, k, host_region(buf));
    if (c.status.code() == Code::kNotFound) continue;
    if (!c.status.is_ok()) {
      std::fprintf(stderr, "reader get: %s\n", c.status.to_string().c_str());
      return c.status.code() == Code::kChecksumMismatch ? kChildCorrupt : kChildError;
    }
    auto want = make_image(k, payload_of(k), seed);
    if (c.bytes != want.size() || std::memcmp(buf.data(), want.data(), want.size()) != 0) {
      std::fprintf(stderr, "reader: wrong bytes for %s\n", k.to_string().c_str());
      return kChildCorrupt;
    }
    ++hits;
  }
  if (hits_out != nullptr) *hits_out = hits;
  return kChildOk;
}

// Checks every object of the segment and that nothing is left reserved or pinned.
void check_segment(const std::string& segment) {
  auto store = ShmStore::attach(segment);
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  auto report = (*store)->verify();
  REQUIRE(report.is_ok());
  CHECK(report->corrupt == 0);
  for (const auto& p : report->problems) MESSAGE(p);
  auto found = (*store)->inspect();
  REQUIRE(found.is_ok());
  const cpu::ShmStats& st = found->stats;
  CHECK(st.used_bytes <= st.capacity_bytes);
  CHECK(st.writing == 0);
  CHECK(st.doomed == 0);
  CHECK(st.clients == 1);  // this store only: every child's slot was released or reaped
}

// Fills the whole segment from this process: proves no lock is stuck and no space leaked.
void fill_segment(const std::string& segment) {
  auto b = open_backend(segment);
  REQUIRE(b != nullptr);
  const std::size_t payload = 512 * 1024;
  for (std::uint64_t i = 0; i < 2 * kCapacity / payload; ++i) {
    auto k = key_of(900'000 + i, 77);
    auto img = make_image(k, payload);
    Completion c = run(*b, Op::kPut, k, host_region(img));
    REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
  }
  CHECK(b->usage().used_bytes <= kCapacity);
}

}  // namespace

TEST_CASE("shm: several writer and reader processes share one segment") {
  Segment seg;
  ::alarm(120);
  {  // create it first so that all children agree on the geometry
    auto b = open_backend(seg.name);
    REQUIRE(b != nullptr);
  }
  std::vector<pid_t> writers, readers;
  for (std::uint64_t w = 0; w < 3; ++w)
    writers.push_back(spawn([&, w] { return writer(seg.name, 1, w * 400, 400); }));
  for (int r = 0; r < 2; ++r)
    readers.push_back(spawn([&] { return reader(seg.name, 1, 0, 1200, 1500); }));
  for (pid_t p : writers) CHECK(wait_child(p) == kChildOk);
  for (pid_t p : readers) CHECK(wait_child(p) == kChildOk);
  // 3 x 400 objects of ~100 KiB do not fit in 16 MiB: evictions happened, and the newest of
  // each writer is still there for a fresh process.
  auto b = open_backend(seg.name);
  REQUIRE(b != nullptr);
  CHECK(b->usage().used_bytes <= kCapacity);
  CHECK(b->usage().objects > 0);
  std::uint64_t hits = 0;
  CHECK(reader(seg.name, 1, 0, 1200, 200, 0, &hits) == kChildOk);
  CHECK(hits > 0);
  b.reset();
  check_segment(seg.name);
  ::alarm(0);
}

TEST_CASE("shm: kill -9 of writers at random instants leaves no torn object and no stuck lock") {
  Segment seg;
  ::alarm(120);
  { REQUIRE(open_backend(seg.name) != nullptr); }
  pid_t watcher = spawn([&] { return reader(seg.name, 2, 0, 5000, 2500); });
  std::mt19937 rng(12345);
  for (int round = 0; round < 16; ++round) {
    pid_t a = spawn([&] { return writer(seg.name, 2, 0, 0, 0); });
    pid_t b = spawn([&] { return writer(seg.name, 2, 2500, 0, 0); });
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 60));
    ::kill(a, SIGKILL);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    ::kill(b, SIGKILL);
    CHECK(wait_child(a) == 128 + SIGKILL);
    CHECK(wait_child(b) == 128 + SIGKILL);
  }
  CHECK(wait_child(watcher) == kChildOk);
  auto stats = ShmStore::attach(seg.name).value()->stats();
  MESSAGE(fmt::format("{} objects, {} lock-holder deaths repaired, {} dead clients reaped",
                      stats.objects, stats.recoveries, stats.reaped_clients));
  CHECK(stats.reaped_clients + stats.recoveries > 0);
  check_segment(seg.name);
  fill_segment(seg.name);
  ::alarm(0);
}

namespace {
ShmCrashPoint g_die_at;
void die_at(ShmCrashPoint p) {
  if (p == g_die_at) ::raise(SIGKILL);
}
}  // namespace

TEST_CASE("shm: a process killed at each critical instant is recovered from") {
  for (ShmCrashPoint point : {ShmCrashPoint::kPutHoldingLock, ShmCrashPoint::kPutCopying,
                              ShmCrashPoint::kGetCopying, ShmCrashPoint::kEvictHoldingLock}) {
    CAPTURE(static_cast<int>(point));
    Segment seg;
    ::alarm(60);
    auto b = open_backend(seg.name);
    REQUIRE(b != nullptr);
    // Fill the segment completely so that the next put must evict.
    const std::size_t payload = 1024 * 1024 - kObjectHeaderBytes;  // exactly 64 blocks
    for (std::uint64_t i = 0; i < kCapacity / (payload + kObjectHeaderBytes); ++i) {
      auto k = key_of(i, 3);
      auto img = make_image(k, payload);
      REQUIRE(run(*b, Op::kPut, k, host_region(img)).status.is_ok());
    }
    const std::uint64_t recoveries_before = ShmStore::attach(seg.name).value()->stats().recoveries;
    auto victim = key_of(0, 3);   // the least recently used object
    auto fresh = key_of(100, 3);  // what the dying child puts
    pid_t child = spawn([&] {
      auto cb = open_backend(seg.name);
      if (!cb) return kChildSetup;
      g_die_at = point;
      cpu::testing::set_crash_hook(&die_at);
      if (point == ShmCrashPoint::kGetCopying) {
        std::vector<std::byte> buf(payload + kObjectHeaderBytes);
        (void)run(*cb, Op::kGet, victim, host_region(buf));
      } else {
        auto img = make_image(fresh, payload);
        (void)run(*cb, Op::kPut, fresh, host_region(img));
      }
      return kChildOk;  // not reached: the hook kills the child
    });
    REQUIRE(wait_child(child) == 128 + SIGKILL);

    // This process goes on: the lock is free (or recovered) and nothing torn is visible.
    CHECK(run(*b, Op::kContains, fresh).status.code() == Code::kNotFound);
    if (point == ShmCrashPoint::kGetCopying) {
      // The dead reader's pin must not keep the object forever: a remove dooms it, the reap frees.
      CHECK(run(*b, Op::kRemove, victim).status.is_ok());
    }
    auto img = make_image(fresh, payload);
    Completion c = run(*b, Op::kPut, fresh, host_region(img));
    CHECK_MESSAGE(c.status.is_ok(), c.status.to_string());
    std::vector<std::byte> buf(img.size());
    CHECK(run(*b, Op::kGet, fresh, host_region(buf)).status.is_ok());
    CHECK(std::memcmp(buf.data(), img.data(), img.size()) == 0);
    auto stats = ShmStore::attach(seg.name).value()->stats();
    bool held_lock =
        point == ShmCrashPoint::kPutHoldingLock || point == ShmCrashPoint::kEvictHoldingLock;
    CHECK(stats.recoveries == recoveries_before + (held_lock ? 1 : 0));
    b.reset();
    check_segment(seg.name);
    fill_segment(seg.name);
    ::alarm(0);
  }
}

TEST_CASE("shm: a restarted process finds what it stored before") {
  Segment seg;
  ::alarm(60);
  // First life: store 40 objects, then die without closing anything.
  pid_t first = spawn([&] {
    int rc = writer(seg.name, 4, 0, 40);
    if (rc != kChildOk) return rc;
    ::raise(SIGKILL);
    return kChildOk;
  });
  CHECK(wait_child(first) == 128 + SIGKILL);
  // Second life: every object is there, bit-exact (prefault maps the pages, keeping the bytes).
  pid_t second = spawn([&] {
    auto b = open_backend(seg.name, kCapacity, "open");
    if (!b) return kChildSetup;
    std::vector<std::byte> buf(300'000);
    for (std::uint64_t i = 0; i < 40; ++i) {
      auto k = key_of(i, 4);
      Completion c = run(*b, Op::kGet, k, host_region(buf));
      if (!c.status.is_ok()) return kChildError;
      auto want = make_image(k, payload_of(k));
      if (c.bytes != want.size() || std::memcmp(buf.data(), want.data(), want.size()) != 0)
        return kChildCorrupt;
    }
    return kChildOk;
  });
  CHECK(wait_child(second) == kChildOk);
  // A tier that asks for another geometry is refused with the way out in the message.
  auto other = Registry::global().create_backend(
      "cpu", BackendContext{"cpu", 2 * kCapacity, shm_options(seg.name)});
  REQUIRE_FALSE(other.is_ok());
  CHECK(std::string(other.status().message()).find("tierctl shm remove") != std::string::npos);
  check_segment(seg.name);
  // After removal the next open starts empty.
  REQUIRE(ShmStore::remove_segment(seg.name).is_ok());
  auto b = open_backend(seg.name);
  REQUIRE(b != nullptr);
  CHECK(b->usage().objects == 0);
  CHECK(run(*b, Op::kContains, key_of(0, 4)).status.code() == Code::kNotFound);
  ::alarm(0);
}

TEST_CASE("shm: two namespaces side by side never see each other") {
  Segment seg;
  ::alarm(60);
  { REQUIRE(open_backend(seg.name) != nullptr); }
  // Same ids, different namespaces and contents, written and read at the same time.
  auto side = [&](std::uint64_t ns, std::uint64_t seed) {
    return spawn([&, ns, seed] {
      int rc = writer(seg.name, ns, 0, 30, seed);
      if (rc != kChildOk) return rc;
      return reader(seg.name, ns, 0, 30, 300, seed);
    });
  };
  pid_t a = side(10, 1), b = side(20, 2);
  CHECK(wait_child(a) == kChildOk);
  CHECK(wait_child(b) == kChildOk);
  auto store = ShmStore::attach(seg.name);
  REQUIRE(store.is_ok());
  auto found = (*store)->inspect();
  REQUIRE(found.is_ok());
  const std::vector<cpu::ShmObjectInfo>& objects = found->objects;
  std::size_t in_a = 0, in_b = 0;
  for (const auto& o : objects) {
    in_a += o.key.ns.lo == 10;
    in_b += o.key.ns.lo == 20;
  }
  CHECK(in_a == 30);
  CHECK(in_b == 30);
  // A key of namespace 10 never answers for namespace 30, which holds nothing.
  auto be = open_backend(seg.name);
  REQUIRE(be != nullptr);
  CHECK(run(*be, Op::kContains, key_of(0, 30)).status.code() == Code::kNotFound);
  ::alarm(0);
}

TEST_CASE("shm: bytes damaged in the segment are never served, and verify removes them") {
  Segment seg;
  auto b = open_backend(seg.name);
  REQUIRE(b != nullptr);
  auto k = key_of(1, 5), intact = key_of(2, 5);
  auto img = make_image(k, 100'000);
  auto img2 = make_image(intact, 100'000);
  REQUIRE(run(*b, Op::kPut, k, host_region(img)).status.is_ok());
  REQUIRE(run(*b, Op::kPut, intact, host_region(img2)).status.is_ok());
  {  // Flip one payload byte through a mapping of the segment's file.
    int fd = ::open(("/dev/shm/" + seg.name).c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    auto* p = static_cast<std::byte*>(::mmap(nullptr, static_cast<std::size_t>(st.st_size),
                                             PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
    REQUIRE(p != MAP_FAILED);
    void* at = ::memmem(p, static_cast<std::size_t>(st.st_size), img.data(), kObjectHeaderBytes);
    REQUIRE(at != nullptr);
    auto* payload = static_cast<std::byte*>(at) + kObjectHeaderBytes + 5000;
    *payload = ~*payload;
    ::munmap(p, static_cast<std::size_t>(st.st_size));
  }
  std::vector<std::byte> buf(img.size());
  Completion c = run(*b, Op::kGet, k, host_region(buf));
  CHECK(c.status.code() == Code::kChecksumMismatch);
  CHECK(parse_object_header(buf).status().code() == Code::kChecksumMismatch);  // no valid header
  CHECK(b->metrics().checksum_failures.get() == 1);
  CHECK(run(*b, Op::kGet, intact, host_region(buf)).status.is_ok());
  auto store = ShmStore::attach(seg.name);
  REQUIRE(store.is_ok());
  auto report = (*store)->verify();
  REQUIRE(report.is_ok());
  CHECK(report->checked == 2);
  CHECK(report->corrupt == 1);
  CHECK(run(*b, Op::kContains, k).status.code() == Code::kNotFound);
  CHECK(run(*b, Op::kContains, intact).status.is_ok());
}

TEST_CASE("shm: a restarted engine's TierStack finds its prefix warm") {
  Segment seg;
  ::alarm(60);
  const std::string profile = fmt::format(
      R"({{"tiers": [{{"name": "host", "capacity": "16MiB",
           "backend": {{"type": "cpu", "mode": "shm", "segment": "{}", "prefault": "off"}}}}]}})",
      seg.name);
  auto data_of = [](std::uint64_t n) {
    std::vector<std::byte> d(50'000);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::byte>((n * 131 + i) & 0xff);
    return d;
  };
  // One engine life: opens a stack on the profile, saves a prefix of 8 chunks, then crashes.
  auto life = [&](bool save) {
    return spawn([&, save] {
      auto p = parse_profile(Json::parse(profile), Registry::global(), "<t>");
      if (!p) return kChildSetup;
      auto stack = TierStack::open(*p);
      auto codec = Registry::global().create_codec("identity", Json::object());
      if (!stack || !codec) return kChildSetup;
      std::vector<ObjectKey> keys;
      for (std::uint64_t i = 0; i < 8; ++i) keys.push_back(key_of(i, 6));
      if (save) {
        for (std::uint64_t i = 0; i < 8; ++i) {
          auto d = data_of(i);
          Region r = host_region(d);
          Status out;
          SaveItem item{keys[i], RegionList(&r, 1)};
          if (!(*stack)->save(std::span(&item, 1), **codec, std::span(&out, 1)) || !out)
            return kChildError;
        }
        ::raise(SIGKILL);
      }
      auto prefix = (*stack)->lookup_prefix(keys);
      if (!prefix || *prefix != 8) return kChildError;
      for (std::uint64_t i = 0; i < 8; ++i) {
        std::vector<std::byte> got(50'000);
        Region r = host_region(got);
        LoadResult out;
        LoadItem item{keys[i], RegionList(&r, 1)};
        if (!(*stack)->load(std::span(&item, 1), **codec, std::span(&out, 1)) || !out.status)
          return kChildError;
        if (got != data_of(i)) return kChildCorrupt;
      }
      return kChildOk;
    });
  };
  CHECK(wait_child(life(true)) == 128 + SIGKILL);
  CHECK(wait_child(life(false)) == kChildOk);
  ::alarm(0);
}

// put_with / get_with, the pinned mode's way in and out of a segment, with host copies standing in
// for the DMA: the pieces are the object's block runs in image order, a failed fill abandons the
// reservation, and get_with reports what its drain decided.
TEST_CASE("shm: put_with and get_with hand over an object's pieces in image order") {
  Segment seg;
  cpu::ShmConfig cfg;
  cfg.segment = seg.name;
  cfg.capacity = 1u << 20;
  cfg.block_bytes = 4096;
  auto store = ShmStore::open(cfg);
  REQUIRE(store.is_ok());
  ShmStore& s = **store;
  const ShmStore::EvictFn no_evict = [](const ObjectKey&, std::uint64_t) {};
  // Six one-block objects in blocks 0..5; removing 0, 2 and 4 leaves the free list 4, 2, 0, 6, ...
  for (std::uint64_t i = 0; i < 6; ++i) {
    auto img = make_image(key_of(i, 9), 4096 - kObjectHeaderBytes);
    REQUIRE(s.put(key_of(i, 9), img, no_evict).is_ok());
  }
  for (std::uint64_t i : {0, 2, 4}) REQUIRE(s.remove(key_of(i, 9)).is_ok());
  const ObjectKey k = key_of(100, 9);
  const auto img = make_image(k, 5 * 4096 + 193);  // six blocks: 4, 2, 0, then a run of three
  std::size_t pieces_seen = 0;
  auto fill = [&](std::span<const std::span<std::byte>> pieces) {
    pieces_seen = pieces.size();
    std::size_t off = 0;
    for (auto p : pieces) {
      std::memcpy(p.data(), img.data() + off, p.size());
      off += p.size();
    }
    return off == img.size() ? Status::ok() : Status::invalid("pieces do not add up");
  };
  REQUIRE(s.put_with(k, img.size(), fill, no_evict).is_ok());
  CHECK(pieces_seen == 4);
  std::vector<std::byte> out(img.size());
  auto g = s.get(k, out);  // the plain path reads what the pieces wrote
  REQUIRE(g.status.is_ok());
  CHECK(out == img);
  std::vector<std::byte> gathered;
  g = s.get_with(k, img.size(), [&](std::span<const std::span<std::byte>> pieces) {
    for (auto p : pieces) gathered.insert(gathered.end(), p.begin(), p.end());
    return verify_object(gathered, k);
  });
  REQUIRE(g.status.is_ok());
  CHECK(g.bytes == img.size());
  CHECK(gathered == img);
  // Too small a destination is refused before the drain runs, with the size needed.
  bool drained = false;
  g = s.get_with(k, img.size() - 1, [&](std::span<const std::span<std::byte>>) {
    drained = true;
    return Status::ok();
  });
  CHECK(g.status.code() == Code::kInvalidArgument);
  CHECK(g.bytes == img.size());
  CHECK_FALSE(drained);
  // A drain's verdict is the result.
  g = s.get_with(k, img.size(), [](std::span<const std::span<std::byte>>) {
    return Status(Code::kChecksumMismatch, "drain says no");
  });
  CHECK(g.status.code() == Code::kChecksumMismatch);

  // A failed fill: nothing visible, every block and entry back.
  const cpu::ShmStats before = s.stats();
  const ObjectKey bad = key_of(101, 9);
  Status st = s.put_with(bad, 3 * 4096, [](std::span<const std::span<std::byte>>) {
    return Status::invalid("header names another key");
  }, no_evict);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(s.contains(bad).status().code() == Code::kNotFound);
  const cpu::ShmStats after = s.stats();
  CHECK(after.used_bytes == before.used_bytes);
  CHECK(after.objects == before.objects);
  CHECK(after.writing == 0);
  auto again = make_image(bad, 100);
  CHECK(s.put(bad, again, no_evict).is_ok());  // the key is free to store
  auto report = s.verify();
  REQUIRE(report.is_ok());
  CHECK(report->corrupt == 0);
  CHECK(report->problems.empty());
  // The mapping covers the whole segment (what the pinned mode registers).
  CHECK(s.mapping().size() == s.stats().segment_bytes);
}

namespace {

// Puts `count` objects of 64 KiB (namespace 78) from id `first`: eviction pressure on a segment.
void fill_segment(Backend& b, std::uint64_t first, std::uint64_t count) {
  for (std::uint64_t i = 0; i < count; ++i) {
    auto k = key_of(first + i, 78);
    auto img = make_image(k, 64 * 1024);
    Completion c = run(b, Op::kPut, k, host_region(img));
    CHECK_MESSAGE((c.status.is_ok() || c.status.code() == Code::kNoSpace), c.status.to_string());
  }
}

constexpr std::uint64_t kFill = kCapacity / (64 * 1024) + 16;  // more than the segment holds

}  // namespace

// Lookup leases live in the segment: a lease one process takes holds the entry against every
// process's evictions, and it ends when that process dies (reaped by the evicting process).
TEST_CASE("shm: a lease holds an entry against other processes' evictions, ends with its process") {
  Segment seg;
  auto b = open_backend(seg.name);
  REQUIRE(b);
  const ObjectKey k = key_of(1, 77);
  auto img = make_image(k, 64 * 1024);
  REQUIRE(run(*b, Op::kPut, k, host_region(img)).status.is_ok());
  int ready[2], hold[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(hold) == 0);
  pid_t pid = spawn([&] {
    auto c = open_backend(seg.name);
    if (!c) return kChildSetup;
    std::uint8_t held = 0;
    auto id = c->lease(std::span(&k, 1), std::chrono::seconds(600), std::span(&held, 1));
    if (!id || *id == 0 || held != 1) return kChildError;
    char x = 'l';
    if (::write(ready[1], &x, 1) != 1) return kChildError;
    (void)::read(hold[0], &x, 1);  // until the parent kills it
    return kChildOk;
  });
  char x = 0;
  REQUIRE(::read(ready[0], &x, 1) == 1);  // the child holds its lease
  fill_segment(*b, 1000, kFill);
  CHECK(b->metrics().evictions.get() > 0);
  CHECK(run(*b, Op::kContains, k).status.is_ok());  // the oldest object, leased by the child
  ::kill(pid, SIGKILL);
  CHECK(wait_child(pid) == 128 + SIGKILL);
  fill_segment(*b, 2000, kFill);  // the dead child is reaped: its lease ends
  CHECK(run(*b, Op::kContains, k).status.code() == Code::kNotFound);
  for (int fd : {ready[0], ready[1], hold[0], hold[1]}) ::close(fd);
}

// Two leases of one process on one entry: releasing one leaves the entry held by the other.
TEST_CASE("shm: an entry leased twice by one process stays held until both leases end") {
  Segment seg;
  auto b = open_backend(seg.name);
  REQUIRE(b);
  const ObjectKey k = key_of(2, 77);
  auto img = make_image(k, 64 * 1024);
  REQUIRE(run(*b, Op::kPut, k, host_region(img)).status.is_ok());
  std::uint8_t held = 0;
  auto first = b->lease(std::span(&k, 1), std::chrono::seconds(600), std::span(&held, 1));
  auto second = b->lease(std::span(&k, 1), std::chrono::seconds(600), std::span(&held, 1));
  REQUIRE(first.is_ok());
  REQUIRE(second.is_ok());
  REQUIRE(*first != 0);
  REQUIRE(*second != 0);
  b->release(*first);
  fill_segment(*b, 3000, kFill);
  CHECK(run(*b, Op::kContains, k).status.is_ok());
  b->release(*second);
  CHECK(b->metrics().lease_releases.get() == 2);
  fill_segment(*b, 4000, kFill);
  CHECK(run(*b, Op::kContains, k).status.code() == Code::kNotFound);
}

// Two processes put one key at once: the one that reserved first wins, the other gets
// AlreadyExists at once (it does not wait, and does not copy), and nobody sees the object before
// the winner publishes it, although its bytes are copied outside the segment lock: other
// processes put, get and remove meanwhile.
TEST_CASE("shm: a put being copied is invisible, and a put of its key meanwhile is AlreadyExists") {
  Segment seg;
  const ObjectKey k = key_of(1, 91);
  const auto img = make_image(k, 300'000);
  int reserved[2], go[2];
  REQUIRE(::pipe(reserved) == 0);
  REQUIRE(::pipe(go) == 0);
  pid_t writer = spawn([&] {  // reserves the key, then copies only when told to
    cpu::ShmConfig cfg;
    cfg.segment = seg.name;
    cfg.capacity = kCapacity;
    cfg.prefault = cpu::ShmPrefault::kOff;  // a forked child starts no thread
    auto store = ShmStore::open(cfg);
    if (!store) return kChildSetup;
    Status st = (*store)->put_with(
        k, img.size(),
        [&](std::span<const std::span<std::byte>> pieces) {
          char c = 'r';
          if (::write(reserved[1], &c, 1) != 1 || ::read(go[0], &c, 1) != 1)
            return Status::invalid("pipe");
          std::size_t off = 0;
          for (auto p : pieces) {
            std::memcpy(p.data(), img.data() + off, p.size());
            off += p.size();
          }
          return Status::ok();
        },
        [](const ObjectKey&, std::uint64_t) {});
    return st.is_ok() ? kChildOk : kChildError;
  });
  char c = 0;
  REQUIRE(::read(reserved[0], &c, 1) == 1);
  // The writer holds a reservation and no lock: this process works on the segment meanwhile.
  auto b = open_backend(seg.name);
  REQUIRE(b);
  std::vector<std::byte> out(img.size());
  CHECK(run(*b, Op::kGet, k, host_region(out)).status.code() == Code::kNotFound);
  CHECK(run(*b, Op::kContains, k).status.code() == Code::kNotFound);
  CHECK(run(*b, Op::kRemove, k).status.code() == Code::kNotFound);
  auto other = make_image(k, 1000, 7);  // other bytes for the same key
  Completion p = run(*b, Op::kPut, k, host_region(other));
  CHECK(p.status.code() == Code::kAlreadyExists);
  const ObjectKey k2 = key_of(2, 91);
  auto img2 = make_image(k2, 5000);
  CHECK(run(*b, Op::kPut, k2, host_region(img2)).status.is_ok());
  CHECK(run(*b, Op::kGet, k2, host_region(out)).status.is_ok());
  CHECK(b->usage().objects == 1);  // k2; k is reserved, not stored
  REQUIRE(::write(go[1], "g", 1) == 1);
  REQUIRE(wait_child(writer) == kChildOk);
  // Published: the winner's bytes, not the loser's.
  Completion g = run(*b, Op::kGet, k, host_region(out));
  REQUIRE(g.status.is_ok());
  CHECK(g.bytes == img.size());
  CHECK(out == img);
  for (int fd : {reserved[0], reserved[1], go[0], go[1]}) ::close(fd);
  b.reset();
  check_segment(seg.name);
}

namespace {

// KiB of the segment `name` mapped into this process's page tables (/proc/self/smaps: Rss).
std::uint64_t mapped_kib(const std::string& name) {
  std::ifstream smaps("/proc/self/smaps");
  const std::string path = "/dev/shm/" + name;
  std::string line;
  bool ours = false;
  std::uint64_t kib = 0;
  while (std::getline(smaps, line)) {
    if (line.find(':') == std::string::npos || line.find(' ') < line.find(':')) {  // a mapping
      ours = line.size() > path.size() && line.ends_with(" " + path);
      continue;
    }
    if (ours && line.starts_with("Rss:")) kib += std::stoull(line.substr(4));
  }
  return kib;
}

}  // namespace

// The default: one idle-priority thread maps the segment into this process after it opens, so
// puts and gets later pay no first-touch faults (docs/shm.md "Performance"), while the puts and
// gets that come first run beside it and map what they use themselves.
TEST_CASE("shm: prefault background maps the whole segment beside puts and gets; closing stops it") {
  Segment seg;
  ::alarm(150);
  constexpr std::uint64_t kBig = 64ull << 20;
  {  // "off": the arena is not mapped here until used
    auto b = open_backend(seg.name, kBig, "off");
    REQUIRE(b);
    CHECK(mapped_kib(seg.name) < kBig / 1024 / 4);
  }
  auto b = open_backend(seg.name, kBig, "background");
  REQUIRE(b);
  std::vector<std::byte> out(300'000);
  for (std::uint64_t i = 0; i < 64; ++i) {
    auto img = make_image(key_of(i, 95), 200'000, i);
    REQUIRE(run(*b, Op::kPut, key_of(i, 95), host_region(img)).status.is_ok());
    Completion g = run(*b, Op::kGet, key_of(i, 95), host_region(out));
    REQUIRE(g.status.is_ok());
    CHECK(std::equal(img.begin(), img.end(), out.begin()));
  }
  // Idle priority: on a busy machine it may wait for a free core.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (mapped_kib(seg.name) < kBig / 1024 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(mapped_kib(seg.name) >= kBig / 1024);
  b.reset();
  for (int i = 0; i < 4; ++i) {  // closed at once: the mapping thread stops, nothing breaks
    auto c = open_backend(seg.name, kBig, "background");
    REQUIRE(c);
    CHECK(run(*c, Op::kContains, key_of(i, 95)).status.is_ok());
  }
  ::alarm(0);
  check_segment(seg.name);
}
