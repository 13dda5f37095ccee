// The cpu tier's heap mode: where it places a stored image. Its payload starts on a 64-byte line
// whatever the image's size, also in storage reused from a removed image (the checksum of every
// get reads whole lines; heap_mode.cpp says why), and the bytes read back are the bytes stored.
// And the cpu backend around it: the puts and gets of one submit move at once on the verification
// threads, complete in the submit's order, and report evictions on the submitting thread only,
// also while another thread's puts take the room made for them. Meson suite `threads`: also run
// under ThreadSanitizer.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cpu_backend.hpp"
#include "heap_mode.hpp"
#include "support/test_util.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;

TEST_CASE("heap mode: every stored payload starts on a 64-byte line; copies with either stores") {
  cpu::HeapMode mode(8u << 20);
  const cpu::CpuMode::EvictFn no_evictions = [](const ObjectKey&, std::span<const std::byte>,
                                                std::uint64_t) { FAIL("nothing is evicted"); };
  for (int round = 0; round < 2; ++round) {  // the second reuses the first's storage
    for (std::size_t payload : {1u, 63u, 100u, 4096u, 65536u, 65568u, 200'001u}) {
      CAPTURE(payload);
      const ObjectKey k = key_of(payload);
      const auto img = make_image(k, payload, round);
      // The first round's copies use cached stores, the second's non-temporal ones.
      const Stores stores = round == 0 ? Stores::kCached : Stores::kStreamed;
      REQUIRE(mode.put(k, img, stores, no_evictions).status.is_ok());
      auto o = mode.get_with(k, img.size(), [&](std::span<const cpu::Piece> pieces) {
        REQUIRE(pieces.size() == 1);
        CHECK(reinterpret_cast<std::uintptr_t>(pieces[0].data() + kObjectHeaderBytes) % 64 == 0);
        CHECK(std::equal(pieces[0].begin(), pieces[0].end(), img.begin(), img.end()));
        return Status::ok();
      });
      CHECK(o.status.is_ok());
      CHECK(o.bytes == img.size());
      std::vector<std::byte> out(img.size() + 1, std::byte{0x5a});
      REQUIRE(mode.get(k, out, stores).status.is_ok());
      CHECK(std::equal(img.begin(), img.end(), out.begin()));
      CHECK(out.back() == std::byte{0x5a});  // nothing past the image
    }
    for (std::size_t payload : {1u, 63u, 100u, 4096u, 65536u, 65568u, 200'001u})
      REQUIRE(mode.remove(key_of(payload)).is_ok());
  }
  CHECK(mode.usage().objects == 0);
}

TEST_CASE("heap mode: a put that may not evict is deferred; make_room_for evicts for new keys") {
  const auto img = [](std::uint64_t n) { return make_image(key_of(n), 1000, n); };
  const std::uint64_t image = img(0).size();
  cpu::HeapMode mode(3 * image);  // three objects
  std::vector<ObjectKey> evicted;
  const cpu::CpuMode::EvictFn record = [&](const ObjectKey& k, std::span<const std::byte>,
                                           std::uint64_t) { evicted.push_back(k); };
  const cpu::CpuMode::EvictFn none;
  for (std::uint64_t n = 1; n <= 3; ++n)
    REQUIRE(mode.put(key_of(n), img(n), Stores::kCached, none).status.is_ok());  // room: fine
  auto o = mode.put(key_of(4), img(4), Stores::kCached, none);
  CHECK(o.deferred);
  CHECK(o.status.code() == Code::kNoSpace);
  CHECK(mode.contains(key_of(4)).status().code() == Code::kNotFound);  // nothing done
  CHECK(mode.usage().objects == 3);
  // A stored key needs no room, and its put finds it stored without evicting.
  CHECK(mode.put(key_of(2), img(2), Stores::kCached, none).status.code() == Code::kAlreadyExists);
  // Room for keys 4 and 5 (3 stored: counts nothing): the two least recently used go (1, then 3:
  // the put of 2 refreshed it).
  const ObjectKey keys[] = {key_of(3), key_of(4), key_of(5)};
  const std::uint64_t bytes[] = {image, image, image};
  mode.make_room_for(keys, bytes, record);
  REQUIRE(evicted.size() == 2);
  CHECK(evicted[0] == key_of(1));
  CHECK(evicted[1] == key_of(3));
  CHECK(mode.put(key_of(4), img(4), Stores::kCached, none).status.is_ok());
  CHECK(mode.put(key_of(5), img(5), Stores::kCached, none).status.is_ok());
  CHECK(mode.usage().used_bytes == 3 * image);
}

namespace {

// The real heap mode, observed: which threads its puts and gets run on and whether each put may
// evict. Each put and get first sleeps 2 ms, so that a free verification thread joins a window;
// the put of `slow` 30 ms, so that it finishes after later puts of its window.
class Observed final : public cpu::CpuMode {
 public:
  explicit Observed(std::uint64_t capacity) : heap_(capacity) {}

  struct Put {
    std::thread::id thread;
    bool may_evict;
  };
  ObjectKey slow;
  std::chrono::milliseconds pause{2};  // before each put and get
  std::mutex mu;
  std::vector<Put> puts;
  std::size_t deferred = 0;  // puts that came back deferred
  std::set<std::thread::id> get_threads;

  Outcome put(const ObjectKey& key, std::span<const std::byte> image, Stores stores,
              const EvictFn& on_evict) override {
    note_put(key, on_evict);
    return deferrals(heap_.put(key, image, stores, on_evict));
  }
  Outcome put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                   const EvictFn& on_evict) override {
    note_put(key, on_evict);
    return deferrals(heap_.put_with(key, image_bytes, fill, on_evict));
  }
  void make_room_for(std::span<const ObjectKey> keys, std::span<const std::uint64_t> image_bytes,
                     const EvictFn& on_evict) override {
    heap_.make_room_for(keys, image_bytes, on_evict);
  }
  void refresh(std::span<const ObjectKey> keys) override { heap_.refresh(keys); }
  Outcome get(const ObjectKey& key, std::span<std::byte> out, Stores stores) override {
    note_get();
    return heap_.get(key, out, stores);
  }
  Outcome get_with(const ObjectKey& key, std::uint64_t capacity, const PiecesFn& drain) override {
    note_get();
    return heap_.get_with(key, capacity, drain);
  }
  Result<std::uint64_t> contains(const ObjectKey& key) override { return heap_.contains(key); }
  Status remove(const ObjectKey& key) override { return heap_.remove(key); }
  Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                        std::span<std::uint8_t> held, Counter& expiries) override {
    return heap_.lease(keys, ttl, held, expiries);
  }
  LeaseEnd release_lease(LeaseId id, Counter& expiries) override {
    return heap_.release_lease(id, expiries);
  }
  Result<std::vector<ObjectKey>> list_keys(const Key128& ns) override {
    return heap_.list_keys(ns);
  }
  Usage usage() const noexcept override { return heap_.usage(); }
  bool shared() const noexcept override { return false; }
  std::string describe(std::string_view name) const override { return heap_.describe(name); }
  cpu::DeviceTransfer* device() noexcept override { return nullptr; }
  bool concurrent() const noexcept override { return true; }

 private:
  Outcome deferrals(Outcome o) {
    if (o.deferred) {
      std::lock_guard lock(mu);
      ++deferred;
    }
    return o;
  }
  void note_put(const ObjectKey& key, const EvictFn& on_evict) {
    std::this_thread::sleep_for(key == slow ? std::chrono::milliseconds(30) : pause);
    std::lock_guard lock(mu);
    puts.push_back(Put{std::this_thread::get_id(), static_cast<bool>(on_evict)});
  }
  void note_get() {
    std::this_thread::sleep_for(pause);
    std::lock_guard lock(mu);
    get_threads.insert(std::this_thread::get_id());
  }

  cpu::HeapMode heap_;
};

// Records the threads eviction reports come on (any number of them at once).
struct ThreadsOfEvictions : EvictionHandler {
  std::mutex mu;
  std::vector<ObjectKey> keys;
  std::set<std::thread::id> threads;
  void on_evict(const ObjectKey& k, std::span<const std::byte>) noexcept override {
    std::lock_guard lock(mu);
    keys.push_back(k);
    threads.insert(std::this_thread::get_id());
  }
};

// Submits `reqs` in one call and returns their completions in the order poll() gave them.
std::vector<Completion> submit_all(Backend& b, std::span<const IoRequest> reqs) {
  auto taken = b.submit(reqs);
  REQUIRE(taken.is_ok());
  REQUIRE(*taken == reqs.size());
  std::vector<Completion> out(reqs.size());
  auto r = b.poll(out, out.size(), std::chrono::seconds(10));
  REQUIRE(r.is_ok());
  REQUIRE(*r == reqs.size());
  return out;
}

}  // namespace

TEST_CASE("cpu tier: a submit's puts and gets move at once, in order, evicting on the caller") {
  const unsigned before = verify_threads();
  set_verify_threads(2);                                // the caller and one worker
  constexpr std::size_t kN = 16, kPayload = 32 * 1024;  // 512 KiB a window: moved at once
  const std::size_t image = kObjectHeaderBytes + kPayload;
  auto owned = std::make_unique<Observed>(24 * image);  // room for 24 of them
  Observed& mode = *owned;
  mode.slow = key_of(100);  // the first put finishes after the others
  cpu::CpuBackend b("cpu", std::move(owned));
  ThreadsOfEvictions evictions;
  b.set_eviction_handler(&evictions);

  std::vector<std::vector<std::byte>> imgs;
  std::vector<IoRequest> puts, gets;
  std::vector<std::vector<std::byte>> outs(2 * kN, std::vector<std::byte>(image));
  for (std::size_t i = 0; i < 2 * kN; ++i) {
    imgs.push_back(make_image(key_of(100 + i), kPayload, i));
    puts.push_back(IoRequest{Op::kPut, key_of(100 + i),
                             Region{imgs[i].data(), image, MemoryKind::kHost, -1}, 7 * i});
    gets.push_back(IoRequest{Op::kGet, key_of(100 + i),
                             Region{outs[i].data(), image, MemoryKind::kHost, -1}, 7 * i + 1});
  }
  // The first window: no eviction; every put on a verification thread without an EvictFn.
  auto done = submit_all(b, std::span(puts).first(kN));
  for (std::size_t i = 0; i < kN; ++i) {
    CHECK(done[i].user_data == puts[i].user_data);  // the submit's order
    CHECK(done[i].status.is_ok());
    CHECK(done[i].bytes == image);
  }
  {
    std::lock_guard lock(mode.mu);
    CHECK(mode.puts.size() == kN);
    std::set<std::thread::id> threads;
    for (const auto& p : mode.puts) {
      CHECK_FALSE(p.may_evict);
      threads.insert(p.thread);
    }
    if (std::thread::hardware_concurrency() >= 2) CHECK(threads.size() == 2);
    mode.puts.clear();
  }
  // The second window needs the room of 8 of the first: evicted on this thread, before it.
  done = submit_all(b, std::span(puts).subspan(kN));
  for (std::size_t i = 0; i < kN; ++i) {
    CHECK(done[i].user_data == puts[kN + i].user_data);
    CHECK(done[i].status.is_ok());
  }
  CHECK(b.metrics().evictions.get() == 8);
  CHECK(evictions.keys.size() == 8);
  CHECK(evictions.threads == std::set{std::this_thread::get_id()});
  // The first window's first 8: its recency is the submit's order, whichever thread finished first.
  REQUIRE(evictions.keys.size() == 8);
  for (std::size_t i = 0; i < 8; ++i) CHECK(evictions.keys[i] == key_of(100 + i));
  CHECK(b.usage().used_bytes == 24 * image);
  // The gets of the 24 stored objects in one submit: exact, in order, on both threads.
  std::vector<IoRequest> stored;
  for (const IoRequest& g : gets)
    if (std::find(evictions.keys.begin(), evictions.keys.end(), g.key) == evictions.keys.end())
      stored.push_back(g);
  REQUIRE(stored.size() == 24);
  done = submit_all(b, stored);
  for (std::size_t i = 0; i < stored.size(); ++i) {
    CHECK(done[i].user_data == stored[i].user_data);
    REQUIRE(done[i].status.is_ok());
    const std::size_t at = (stored[i].user_data - 1) / 7;
    CHECK(outs[at] == imgs[at]);
  }
  if (std::thread::hardware_concurrency() >= 2) CHECK(mode.get_threads.size() == 2);
  set_verify_threads(before);
}

TEST_CASE("cpu tier: two puts of one key in one submit stay in order") {
  constexpr std::size_t kN = 16, kPayload = 32 * 1024;
  const std::size_t image = kObjectHeaderBytes + kPayload;
  cpu::CpuBackend b("cpu", std::make_unique<cpu::HeapMode>(64 * image));
  std::vector<std::vector<std::byte>> imgs;
  std::vector<IoRequest> puts;
  for (std::size_t i = 0; i < kN; ++i) {
    const std::uint64_t n = i == kN - 1 ? 200 : 200 + i;  // the last repeats the first's key
    imgs.push_back(make_image(key_of(n), kPayload, i));
    puts.push_back(
        IoRequest{Op::kPut, key_of(n), Region{imgs[i].data(), image, MemoryKind::kHost, -1}, i});
  }
  auto done = submit_all(b, puts);
  CHECK(done.front().status.is_ok());
  CHECK(done.back().status.code() == Code::kAlreadyExists);
  std::vector<std::byte> out(image);
  CHECK(tier::test::run(b, Op::kGet, key_of(200), Region{out.data(), image, MemoryKind::kHost, -1})
            .status.is_ok());
  CHECK(out == imgs.front());  // the first put's bytes
}

TEST_CASE("cpu tier: windows moved at once while another thread's puts take their room") {
  // One thread submits windows of 16 puts of 32 KiB (moved at once: the room for them made first,
  // on that thread); another puts single objects of the same size into the same full tier as fast
  // as it can, taking that room meanwhile. The window's puts that find no room come back deferred
  // and are made again, evicting, on the submitting thread. Nothing is refused, the capacity holds,
  // every object still stored reads back exact, and no eviction is reported on a worker.
  const unsigned before = verify_threads();
  set_verify_threads(2);
  constexpr std::size_t kPayload = 32 * 1024, kWindows = 12, kN = 16;
  const std::size_t image = kObjectHeaderBytes + kPayload;
  auto owned = std::make_unique<Observed>(20 * image);
  Observed& mode = *owned;
  mode.pause = std::chrono::milliseconds(0);
  cpu::CpuBackend b("cpu", std::move(owned));
  ThreadsOfEvictions evictions;
  b.set_eviction_handler(&evictions);
  std::vector<std::vector<std::byte>> imgs;
  for (std::size_t i = 0; i < kWindows * kN + 400; ++i)
    imgs.push_back(make_image(key_of(1000 + i), kPayload, i));
  // Completions surface in whichever thread's poll() reaps them: both record what they reap.
  std::mutex done_mu;
  std::map<std::uint64_t, Status> done;
  auto wait_for = [&](std::uint64_t first, std::size_t count) {
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
         std::chrono::steady_clock::now() < deadline;) {
      {
        std::lock_guard lock(done_mu);
        std::size_t in = 0;
        for (std::uint64_t id = first; id < first + count; ++id) in += done.count(id);
        if (in == count) return true;
      }
      Completion out[kN];
      auto r = b.poll(out, 0, std::chrono::microseconds(0));
      if (!r) return false;
      std::lock_guard lock(done_mu);
      for (std::size_t k = 0; k < *r; ++k) done.emplace(out[k].user_data, out[k].status);
    }
    return false;
  };
  std::atomic<bool> windows_done{false};
  std::atomic<int> wrong{0};
  std::thread::id submitter, single;
  std::thread singles([&] {
    single = std::this_thread::get_id();
    for (std::size_t i = kWindows * kN; i < imgs.size() && !windows_done; ++i) {
      const IoRequest put{Op::kPut, key_of(1000 + i),
                          Region{imgs[i].data(), image, MemoryKind::kHost, -1}, i};
      auto taken = b.submit(std::span(&put, 1));
      if (!taken || *taken != 1 || !wait_for(i, 1)) ++wrong;
    }
  });
  std::thread windows([&] {
    submitter = std::this_thread::get_id();
    for (std::size_t w = 0; w < kWindows; ++w) {
      std::vector<IoRequest> puts;
      for (std::size_t i = w * kN; i < (w + 1) * kN; ++i)
        puts.push_back(IoRequest{Op::kPut, key_of(1000 + i),
                                 Region{imgs[i].data(), image, MemoryKind::kHost, -1}, i});
      auto taken = b.submit(puts);
      if (!taken || *taken != kN || !wait_for(w * kN, kN)) ++wrong;
    }
    windows_done = true;
  });
  windows.join();
  singles.join();
  CHECK(wrong == 0);
  for (const auto& [id, status] : done) CHECK_MESSAGE(status.is_ok(), status.to_string());
  CHECK(b.usage().used_bytes <= 20 * image);
  CHECK(b.usage().objects == 20);
  {
    std::lock_guard lock(evictions.mu);
    for (const std::thread::id& t : evictions.threads) CHECK((t == submitter || t == single));
  }
  std::vector<std::byte> out(image);
  std::size_t stored = 0;
  for (std::size_t i = 0; i < imgs.size(); ++i) {
    Completion g = tier::test::run(b, Op::kGet, key_of(1000 + i),
                                   Region{out.data(), image, MemoryKind::kHost, -1});
    if (!g.status.is_ok()) continue;
    ++stored;
    CHECK(out == imgs[i]);
  }
  CHECK(stored == 20);
  std::lock_guard lock(mode.mu);
  MESSAGE(mode.deferred << " window puts deferred and made again on the submitting thread");
  set_verify_threads(before);
}
