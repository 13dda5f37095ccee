// One TierStack called from several threads at once (issue 29): transfers run in parallel, the
// cache keeps its semantics. The proof that a transfer holds no lock of the stack or of the cpu
// tier needs no clock: a load is stopped inside the tier's copy (its codec's payload check, which
// the tier calls between verifying the stored bytes and writing them) until the test thread has
// saved, loaded, evicted and removed around it; a stack that held a lock through a transfer would
// never let the test thread in (the test would hang, then fail on its Meson timeout). Meson suite
// `threads`: also run under ThreadSanitizer.
#include <doctest/doctest.h>
#include <sched.h>

#include <atomic>
#include <cstring>
#include <latch>
#include <thread>
#include <vector>

#include "support/fault_backend.hpp"
#include "support/test_util.hpp"
#include "tier/object.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::test::key_of;

namespace {

std::unique_ptr<TierStack> open_stack(const std::string& profile) {
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(profile), Registry::global(), "<threads>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}

PluginPtr<Codec> identity() {
  return std::move(Registry::global().create_codec("identity", Json::object())).value();
}

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> d(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : d) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return d;
}

Status save(TierStack& s, const Codec& c, const ObjectKey& k, std::span<std::byte> bytes) {
  Region r = host_region(bytes);
  Status out;
  REQUIRE(s.save(std::span<const SaveItem>({SaveItem{k, RegionList(&r, 1)}}), c,
                 std::span(&out, 1)).is_ok());
  return out;
}

LoadResult load(TierStack& s, const Codec& c, const ObjectKey& k, std::span<std::byte> into) {
  Region r = host_region(into);
  LoadResult out;
  REQUIRE(s.load(std::span<const LoadItem>({LoadItem{k, RegionList(&r, 1)}}), c,
                 std::span(&out, 1)).is_ok());
  return out;
}

// The identity codec whose payload check (called by the tier inside its copy of a direct
// payload, after the stored bytes verified and before the first byte is written) waits until
// the test lets it go.
class HeldCodec final : public Codec, public PayloadCheck {
 public:
  explicit HeldCodec(std::ptrdiff_t loads = 1) : entered(loads) {}  // `loads` to enter
  std::latch entered, go{1};

  std::string_view name() const noexcept override { return "held-identity"; }
  std::uint32_t format_id() const noexcept override { return kIdentityLayoutId; }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override {
    return total_bytes(src);
  }
  Result<std::size_t> encode(RegionList, std::span<std::byte>) const noexcept override {
    return Status(Code::kNotSupported, "load only");
  }
  Status decode(std::span<const std::byte>, RegionList) const noexcept override {
    return Status(Code::kNotSupported, "direct payloads only");
  }
  Result<DirectPayload> direct(RegionList) const noexcept override {
    return DirectPayload{0, this};
  }
  Status check(std::span<const std::span<std::byte>>) const noexcept override {
    const_cast<HeldCodec*>(this)->entered.count_down();
    const_cast<HeldCodec*>(this)->go.wait();
    return Status::ok();
  }
};

constexpr const char* kCpu =
    R"({"tiers": [{"name": "cpu", "capacity": "16MiB", "backend": {"type": "cpu"}}]})";

}  // namespace

TEST_CASE("threads: eight threads save and load their own objects through one stack") {
  auto stack = open_stack(kCpu);
  auto codec = identity();
  constexpr int kThreads = 8, kObjects = 24;
  std::atomic<int> wrong{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kObjects; ++i) {
        const std::uint64_t n = static_cast<std::uint64_t>(t * 1000 + i);
        auto src = pattern(8192 + 97 * static_cast<std::size_t>(i), n);
        if (!save(*stack, *codec, key_of(n), src)) ++wrong;
        std::vector<std::byte> got(src.size());
        auto r = load(*stack, *codec, key_of(n), got);
        if (!r.status || r.tier != 0 || got != src) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
  const StackCounters& c = stack->counters();
  CHECK(c.saves.get() == kThreads * kObjects);
  CHECK(c.loads.get() == kThreads * kObjects);
  CHECK(c.load_misses.get() == 0);
  // Gathered puts and scattered gets: the tier moved every byte once.
  CHECK(c.staging_copy_bytes.get() == 0);
  CHECK(stack->tier(0).usage().objects == kThreads * kObjects);
}

TEST_CASE("threads: a load copying out of the cpu tier stops no other save, load or eviction") {
  // Room for 4 objects of 256 KiB: the test thread's saves evict the held load's object.
  auto stack = open_stack(
      R"({"tiers": [{"name": "cpu", "capacity": "1100KiB", "backend": {"type": "cpu"}}]})");
  auto codec = identity();
  HeldCodec held;
  constexpr std::size_t kBytes = 256 << 10;
  auto first = pattern(kBytes, 1);
  REQUIRE(save(*stack, *codec, key_of(1), first));

  std::vector<std::byte> got(kBytes, std::byte{0});
  LoadResult held_result;
  std::thread loader([&] { held_result = load(*stack, held, key_of(1), got); });
  held.entered.wait();  // the loader is inside the tier's copy of object 1

  // Saves and loads of other objects go through, enough to evict object 1 (LRU) meanwhile.
  for (std::uint64_t n = 2; n < 8; ++n) {
    auto src = pattern(kBytes, n);
    CHECK(save(*stack, *codec, key_of(n), src));
    std::vector<std::byte> back(kBytes);
    auto r = load(*stack, *codec, key_of(n), back);
    CHECK(r.status.is_ok());
    CHECK(back == src);
  }
  CHECK(stack->locate(key_of(1)).value_or(0) == -1);  // evicted while being read
  CHECK(stack->tier(0).metrics().evictions.get() >= 1);
  CHECK(stack->remove(key_of(7)).is_ok());
  CHECK(stack->lookup_prefix(std::vector<ObjectKey>{key_of(6)}).value_or(0) == 1);
  CHECK(got == std::vector<std::byte>(kBytes, std::byte{0}));  // nothing written yet

  held.go.count_down();
  loader.join();
  // The held copy read the bytes it verified: its object's storage outlived the eviction.
  CHECK(held_result.status.is_ok());
  CHECK(held_result.tier == 0);
  CHECK(got == first);
}

// Threads inside the stack's transfers need their CPUs whether or not they hash at the moment: with
// as many loads under way as the process has CPUs, a verification run wakes no worker to compete
// with them (it would, counting only the threads inside a verification run at that moment).
TEST_CASE("threads: a stack's transfers on every CPU keep the verification workers asleep") {
  cpu_set_t affinity;  // the CPUs the pool counts: this process's
  REQUIRE(::sched_getaffinity(0, sizeof affinity, &affinity) == 0);
  const auto cpus = static_cast<unsigned>(CPU_COUNT(&affinity));
  if (cpus < 2 || cpus > 64) return;  // one CPU: the caller is alone anyway; > 64: too many threads
  const unsigned before = verify_threads();
  set_verify_threads(2);  // the caller and one worker
  auto stack = open_stack(kCpu);
  auto codec = identity();
  auto threads_seen = tier::test::verify_threads_seen;
  CHECK(threads_seen() == 2);  // nobody else at work: the worker takes chunks too

  HeldCodec held(cpus);
  std::vector<std::vector<std::byte>> src, got;
  for (unsigned i = 0; i < cpus; ++i) {
    src.push_back(pattern(4096, 100 + i));
    got.emplace_back(4096);
    REQUIRE(save(*stack, *codec, key_of(100 + i), src.back()));
  }
  std::vector<LoadResult> results(cpus);
  std::vector<std::thread> loaders;
  for (unsigned i = 0; i < cpus; ++i)
    loaders.emplace_back([&, i] { results[i] = load(*stack, held, key_of(100 + i), got[i]); });
  held.entered.wait();         // every CPU has a thread inside a load
  CHECK(threads_seen() == 1);  // so this run stays on its caller
  held.go.count_down();
  for (auto& th : loaders) th.join();
  for (unsigned i = 0; i < cpus; ++i) {
    CHECK(results[i].status.is_ok());
    CHECK(got[i] == src[i]);
  }
  CHECK(threads_seen() == 2);  // the loads are over: the worker is back
  set_verify_threads(before);
}

TEST_CASE("threads: saves of one key from several threads at once store one of them whole") {
  auto stack = open_stack(kCpu);
  auto codec = identity();
  constexpr int kThreads = 6, kKeys = 16;
  constexpr std::size_t kBytes = 48 << 10;
  std::vector<std::vector<std::byte>> contents;
  for (int t = 0; t < kThreads; ++t) contents.push_back(pattern(kBytes, 100 + t));
  std::atomic<int> failed{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int k = 0; k < kKeys; ++k)
        if (!save(*stack, *codec, key_of(500 + k), contents[t])) ++failed;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failed == 0);  // put-if-absent: Ok, stored or present already
  for (int k = 0; k < kKeys; ++k) {
    std::vector<std::byte> got(kBytes);
    REQUIRE(load(*stack, *codec, key_of(500 + k), got).status.is_ok());
    CHECK(std::find(contents.begin(), contents.end(), got) != contents.end());
  }
  CHECK(stack->tier(0).metrics().of(Op::kPut).ok.get() == kKeys);
  CHECK(stack->tier(0).metrics().of(Op::kPut).misses.get() == (kThreads - 1) * kKeys);
}

TEST_CASE("threads: eviction, demotion and promotion under concurrent saves and loads") {
  // A small cpu tier over a larger one, both written: saves write through and evict (demoting
  // to the slow tier), loads of evicted objects hit the slow tier and promote.
  auto stack = open_stack(R"({"tiers": [
      {"name": "fast", "capacity": "256KiB", "backend": {"type": "cpu"}},
      {"name": "slow", "capacity": "16MiB", "backend": {"type": "cpu"}}]})");
  auto codec = identity();
  constexpr int kThreads = 4, kObjects = 40;
  constexpr std::size_t kBytes = 16 << 10;
  std::atomic<int> wrong{0}, served{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kObjects; ++i) {
        const std::uint64_t n = static_cast<std::uint64_t>(t * 1000 + i);
        auto src = pattern(kBytes, n);
        if (!save(*stack, *codec, key_of(n), src)) ++wrong;
      }
      for (int i = 0; i < kObjects; ++i) {
        const std::uint64_t n = static_cast<std::uint64_t>(t * 1000 + i);
        std::vector<std::byte> got(kBytes);
        auto r = load(*stack, *codec, key_of(n), got);
        if (r.status.is_ok()) {
          ++served;
          if (got != pattern(kBytes, n)) ++wrong;  // a hit is always the saved bytes
        } else if (!(r.status == Code::kNotFound)) {
          ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
  REQUIRE(stack->flush(std::chrono::seconds(10)).is_ok());
  const TierMetrics& fast = stack->tier(0).metrics();
  CHECK(fast.evictions.get() > 0);
  CHECK(fast.demotions.get() > 0);
  CHECK(stack->tier(1).metrics().promotions.get() > 0);
  // Every object was written through or its drop counted: none vanished silently.
  const StackCounters& c = stack->counters();
  CHECK(served + c.load_misses.get() == kThreads * kObjects);
  CHECK(c.load_misses.get() <= c.writethrough_dropped.get() + c.demotions_dropped.get());
  CHECK(stack->tier(0).usage().used_bytes <= stack->tier(0).usage().capacity_bytes);
}

TEST_CASE("threads: leased keys survive other threads' saves that fill the tier") {
  auto stack = open_stack(
      R"({"tiers": [{"name": "cpu", "capacity": "400KiB", "backend": {"type": "cpu"}}]})");
  auto codec = identity();
  constexpr std::size_t kBytes = 32 << 10;
  std::vector<ObjectKey> leased;
  for (std::uint64_t n = 0; n < 3; ++n) {
    auto src = pattern(kBytes, n);
    REQUIRE(save(*stack, *codec, key_of(n), src));
    leased.push_back(key_of(n));
  }
  std::vector<std::uint8_t> held(leased.size());
  auto id = stack->lease(leased, std::chrono::minutes(5), held);
  REQUIRE(id.is_ok());
  CHECK(std::count(held.begin(), held.end(), 1) == 3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        auto src = pattern(kBytes, 100 + t * 100 + i);
        (void)save(*stack, *codec, key_of(100 + t * 100 + i), src);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(stack->tier(0).metrics().evictions.get() > 0);
  CHECK(stack->lookup_prefix(leased).value_or(0) == leased.size());
  stack->release(*id);
  CHECK(stack->active_leases() == 0);
}

TEST_CASE("threads: a tier that is not concurrent is called by one thread at a time") {
  // The faulty backend wraps a cpu tier with queues of its own, so it declares no concurrency:
  // the stack enters it one thread at a time, and every thread's completions reach it.
  tier::test::register_faulty_backend();
  tier::test::fault_control().reset();
  auto stack = open_stack(
      R"({"tiers": [{"name": "gated", "capacity": "16MiB", "backend": {"type": "faulty"}}]})");
  REQUIRE_FALSE(stack->tier(0).capabilities().concurrent);
  auto codec = identity();
  constexpr int kThreads = 4, kObjects = 30;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kObjects; ++i) {
        const std::uint64_t n = static_cast<std::uint64_t>(t * 1000 + i);
        auto src = pattern(4096, n);
        if (!save(*stack, *codec, key_of(n), src)) ++wrong;
        std::vector<std::byte> got(src.size());
        if (!load(*stack, *codec, key_of(n), got).status.is_ok() || got != src) ++wrong;
        if (stack->lookup_prefix(std::vector<ObjectKey>{key_of(n)}).value_or(0) != 1) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
  CHECK(tier::test::fault_control().count(Op::kPut) == kThreads * kObjects);
}
