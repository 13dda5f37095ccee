// The disk tier's layout and recovery: record codecs, restart (clean), removes and evictions that
// persist, flipped bytes never served, full file system as failed saves, the lock, the cache
// reused by a TierStack after a restart, and a stack's images in the memory it was given. Real
// io_uring on real files; exits 77 without them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "support/disk_support.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using namespace tier::test;
using disk::DiskBackend;

namespace {

std::vector<std::byte> image_of(std::uint64_t n, std::size_t payload = 10'000) {
  return make_image(key_of(n), payload, n);
}

}  // namespace

TEST_CASE("record codecs round-trip and reject flipped bytes") {
  disk::Entry e{key_of(9, 3, 2), 77, 123456, 42, 0xdeadbeef};
  std::byte record[disk::kRecordBytes]{};
  disk::encode_entry(record, e);
  auto d = disk::decode_entry(record);
  REQUIRE(d.has_value());
  CHECK(d->key == e.key);
  CHECK(d->seq == 77);
  CHECK(d->image_bytes == 123456);
  CHECK(d->offset_blocks == 42);
  CHECK(d->payload_check == 0xdeadbeef);
  for (std::size_t i = 0; i < disk::kRecordBytes; ++i) {
    std::byte bad[disk::kRecordBytes];
    std::memcpy(bad, record, sizeof bad);
    bad[i] ^= std::byte{0x10};
    CHECK_FALSE(disk::decode_entry(bad).has_value());
  }
  disk::RegionHeader h{5, 3};
  disk::encode_region_header(record, h);
  auto hd = disk::decode_region_header(record);
  REQUIRE(hd.has_value());
  CHECK(hd->seq == 5);
  CHECK(hd->region == 3);
  record[9] ^= std::byte{1};
  CHECK_FALSE(disk::decode_region_header(record).has_value());

  disk::Geometry g{4096, 1 << 20, 8};
  std::vector<std::byte> block(4096);
  disk::encode_superblock(block, g);
  auto gd = disk::decode_superblock(block);
  REQUIRE(gd.has_value());
  CHECK(*gd == g);
  CHECK(disk::Geometry{4096, 1 << 20, 1}.check().find("at least 2") != std::string::npos);
  CHECK_FALSE(disk::Geometry{1000, 1 << 20, 4}.check().empty());
}

TEST_CASE("objects, removes and usage survive a clean restart") {
  TempDir dir;
  auto opts = small_store(dir.store());
  std::uint64_t used = 0;
  {
    auto b = open_disk(opts);
    REQUIRE(b);
    CHECK(b->stats().formatted);
    for (std::uint64_t i = 0; i < 40; ++i)
      REQUIRE(put_image(*b, key_of(i), image_of(i)).status.is_ok());
    for (std::uint64_t i = 0; i < 40; i += 4)
      REQUIRE(run(*b, Op::kRemove, key_of(i)).status.is_ok());
    used = b->usage().used_bytes;
  }
  auto b = open_disk(opts);
  REQUIRE(b);
  CHECK_FALSE(b->stats().formatted);
  CHECK(b->stats().recovered_objects == 30);
  CHECK(b->usage().objects == 30);
  CHECK(b->usage().used_bytes == used);
  for (std::uint64_t i = 0; i < 40; ++i) {
    std::vector<std::byte> got;
    Completion c = get_image(*b, key_of(i), 16384, &got);
    if (i % 4 == 0) {
      CHECK(c.status.code() == Code::kNotFound);
    } else {
      REQUIRE_MESSAGE(c.status.is_ok(), c.status.to_string());
      CHECK(got == image_of(i));
    }
  }
  // Appends continue after the recovered objects without overwriting them.
  for (std::uint64_t i = 100; i < 110; ++i)
    REQUIRE(put_image(*b, key_of(i), image_of(i)).status.is_ok());
  std::vector<std::byte> got;
  REQUIRE(get_image(*b, key_of(1), 16384, &got).status.is_ok());
  CHECK(got == image_of(1));
}

TEST_CASE("eviction is by region, oldest first without gets, bounded, and persists") {
  TempDir dir;
  auto opts = small_store(dir.store(), 4ull << 20, 1ull << 20);  // 4 regions of 1 MiB
  const std::size_t payload = 200'000;                           // 49 blocks: 5 per region
  std::uint64_t n = 60;
  {
    auto b = open_disk(opts);
    REQUIRE(b);
    for (std::uint64_t i = 0; i < n; ++i) {
      REQUIRE(put_image(*b, key_of(i), image_of(i, payload)).status.is_ok());
      CHECK(b->usage().used_bytes <= b->usage().capacity_bytes);
    }
    CHECK(b->metrics().evictions.get() > 0);
    CHECK(run(*b, Op::kContains, key_of(n - 1)).status.is_ok());
    CHECK(run(*b, Op::kContains, key_of(0)).status.code() == Code::kNotFound);
  }
  auto b = open_disk(opts);
  REQUIRE(b);
  const auto held = b->usage().objects;
  CHECK(held >= 15);
  CHECK(held <= 20);
  // Exactly the newest `held` objects are there.
  for (std::uint64_t i = 0; i < n; ++i) {
    Completion c = run(*b, Op::kContains, key_of(i));
    CHECK(c.status.is_ok() == (i >= n - held));
  }
  std::vector<std::byte> got;
  REQUIRE(get_image(*b, key_of(n - 1), 256 * 1024, &got).status.is_ok());
  CHECK(got == image_of(n - 1, payload));
}

TEST_CASE("a get keeps its region from being evicted first") {
  TempDir dir;
  auto b =
      open_disk(small_store(dir.store(), 4ull << 20, 1ull << 20));  // 4 regions, 5 objects each
  REQUIRE(b);
  const std::size_t payload = 200'000;
  for (std::uint64_t i = 0; i < 20; ++i)  // regions A (0-4), B (5-9), C (10-14), D (15-19)
    REQUIRE(put_image(*b, key_of(i), image_of(i, payload)).status.is_ok());
  REQUIRE(get_image(*b, key_of(2), 256 * 1024).status.is_ok());  // touches A
  CHECK(b->metrics().evictions.get() == 0);
  REQUIRE(put_image(*b, key_of(20), image_of(20, payload)).status.is_ok());  // evicts one region
  CHECK(b->metrics().evictions.get() == 5);
  CHECK(run(*b, Op::kContains, key_of(0)).status.is_ok());
  CHECK(run(*b, Op::kContains, key_of(5)).status.code() == Code::kNotFound);
  CHECK(run(*b, Op::kContains, key_of(10)).status.is_ok());
}

TEST_CASE("flipped bytes are never served") {
  TempDir dir;
  auto opts = small_store(dir.store());
  {
    auto b = open_disk(opts);
    REQUIRE(b);
    for (std::uint64_t i = 0; i < 8; ++i)
      REQUIRE(put_image(*b, key_of(i), image_of(i)).status.is_ok());
  }
  // Objects are appended from block 0 of the first region, 3 blocks each (10 096 bytes).
  flip_byte(dir.store() + "/data", 0 * 3 * 4096 + 5000);  // payload of object 0
  flip_byte(dir.store() + "/data", 1 * 3 * 4096 + 20);    // header of object 1
  // The entry of object 2: record 3 of region 0's directory (after the 4 KiB superblock).
  flip_byte(dir.store() + "/index", 4096 + 3 * 64 + 30);
  auto b = open_disk(opts);
  REQUIRE(b);
  CHECK(b->stats().recovered_objects == 7);
  std::vector<std::byte> got;
  CHECK(get_image(*b, key_of(0), 16384, &got).status.code() == Code::kChecksumMismatch);
  CHECK(get_image(*b, key_of(1), 16384, &got).status.code() == Code::kChecksumMismatch);
  CHECK(get_image(*b, key_of(2), 16384, &got).status.code() == Code::kNotFound);
  CHECK(b->metrics().checksum_failures.get() == 2);
  for (std::uint64_t i = 3; i < 8; ++i) {
    REQUIRE(get_image(*b, key_of(i), 16384, &got).status.is_ok());
    CHECK(got == image_of(i));
  }
}

TEST_CASE("a full file system fails saves with NoSpace and the tier keeps serving") {
  TempDir dir;
  auto opts = small_store(dir.store(), 8ull << 20, 1ull << 20);
  auto b = open_disk(opts);
  REQUIRE(b);
  // The data file is sparse: cap how far it may grow (the kernel then fails writes with EFBIG,
  // as a full file system fails them with ENOSPC).
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  rlimit lim = old;
  lim.rlim_cur = 2ull << 20;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  std::size_t ok = 0, full = 0;
  for (std::uint64_t i = 0; i < 40; ++i) {
    Completion c = put_image(*b, key_of(i), image_of(i, 100'000));
    if (c.status.is_ok())
      ++ok;
    else if (c.status.code() == Code::kNoSpace)
      ++full;
    else
      FAIL_CHECK(c.status.to_string());
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  CHECK(ok >= 10);
  CHECK(full > 0);
  CHECK(b->stats().no_space == full);
  CHECK(b->metrics().of(Op::kPut).errors.get() == full);
  CHECK(b->in_flight() == 0);
  std::vector<std::byte> got;
  REQUIRE(get_image(*b, key_of(0), 128 * 1024, &got).status.is_ok());
  CHECK(got == image_of(0, 100'000));
  // Space again: saves work again.
  CHECK(put_image(*b, key_of(1000), image_of(1000)).status.is_ok());
}

TEST_CASE("a short read is resubmitted and a failed one is an IoError, not a stall") {
  TempDir dir;
  auto b = open_disk(small_store(dir.store()));
  REQUIRE(b);
  for (std::uint64_t i = 0; i < 4; ++i)
    REQUIRE(put_image(*b, key_of(i), image_of(i)).status.is_ok());
  // Damage from outside: the data file now ends inside object 0 (blocks 0-2), before the others.
  REQUIRE(::truncate((dir.store() + "/data").c_str(), 4096) == 0);
  std::vector<std::byte> got;
  Completion c = get_image(*b, key_of(0), 16384, &got);
  CHECK(c.status.code() == Code::kIoError);
  CHECK(b->stats().resubmits >= 1);  // the short read continued, then hit the end
  CHECK(get_image(*b, key_of(2), 16384, &got).status.code() == Code::kIoError);
  CHECK(b->stats().io_errors == 2);
  CHECK(b->in_flight() == 0);
  // The tier keeps working: new objects are written (extending the file) and read back.
  REQUIRE(put_image(*b, key_of(50), image_of(50)).status.is_ok());
  REQUIRE(get_image(*b, key_of(50), 16384, &got).status.is_ok());
  CHECK(got == image_of(50));
}

TEST_CASE("one process at a time; a changed geometry reformats") {
  TempDir dir;
  auto opts = small_store(dir.store());
  {
    auto b = open_disk(opts);
    REQUIRE(b);
    REQUIRE(put_image(*b, key_of(1), image_of(1)).status.is_ok());
    auto again = opts;
    again.lock_timeout_ms = 50;
    auto second = DiskBackend::open("again", again);
    CHECK(second.status().code() == Code::kBadState);
  }
  opts.capacity *= 2;
  auto b = open_disk(opts);
  REQUIRE(b);
  CHECK(b->stats().formatted);
  CHECK(b->usage().objects == 0);
}

TEST_CASE("misaligned and too small buffers are refused") {
  TempDir dir;
  auto b = open_disk(small_store(dir.store()));
  REQUIRE(b);
  auto img = image_of(3);
  REQUIRE(put_image(*b, key_of(3), img).status.is_ok());
  Completion c = get_image(*b, key_of(3), 4096);
  CHECK(c.status.code() == Code::kInvalidArgument);
  CHECK(c.bytes == 12288);
  AlignedImage a = aligned_copy(image_of(4));
  Completion m =
      run(*b, Op::kPut, key_of(4), Region{a.data.get() + 512, 8192, MemoryKind::kHost, -1});
  CHECK(m.status.code() == Code::kInvalidArgument);
}

namespace {

std::unique_ptr<TierStack> open_stack(const std::string& store) {
  // A CPU tier too small for the working set, above the disk tier.
  std::string profile = R"({"tiers": [
      {"name": "cpu", "capacity": "64KiB", "backend": {"type": "cpu"}},
      {"name": "disk", "capacity": "8MiB",
       "backend": {"type": "disk", "path": ")" +
                        store + R"(", "region_size": "1MiB"}}]})";
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(profile), Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}

std::vector<std::byte> payload_of(std::uint64_t n) {
  std::vector<std::byte> d(20'000);
  for (std::size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<std::byte>((n * 131 + i * 7) & 0xff);
  return d;
}

// Replays `rounds` passes over a working set of `n` chunk keys the way an engine does (lookup,
// load the hits, save the misses); returns the hit rate of the last pass.
double replay(TierStack& stack, const Codec& codec, std::uint64_t n) {
  std::vector<ObjectKey> keys;
  for (std::uint64_t i = 0; i < n; ++i) keys.push_back(key_of(i, 77));
  auto hits = stack.lookup_prefix(keys);
  REQUIRE(hits.is_ok());
  std::size_t loaded = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::vector<std::byte> buf(20'000);
    Region r = host_region(buf);
    if (i < *hits) {
      LoadResult out;
      REQUIRE(stack
                  .load(std::span<const LoadItem>({LoadItem{keys[i], RegionList(&r, 1)}}), codec,
                        std::span(&out, 1))
                  .is_ok());
      if (out.status.is_ok() && buf == payload_of(i)) ++loaded;
      continue;
    }
    auto d = payload_of(i);
    Region s = host_region(d);
    Status st;
    REQUIRE(stack
                .save(std::span<const SaveItem>({SaveItem{keys[i], RegionList(&s, 1)}}), codec,
                      std::span(&st, 1))
                .is_ok());
    CHECK_MESSAGE(st.is_ok(), st.to_string());
  }
  REQUIRE(stack.flush(std::chrono::milliseconds(10'000)).is_ok());
  return static_cast<double>(loaded) / static_cast<double>(n);
}

}  // namespace

TEST_CASE("after a restart the disk tier serves the same hits (TierStack)") {
  TempDir a, b;
  auto codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  const std::uint64_t n = 100;  // 2 MiB of images: fits the disk tier, not the CPU tier
  double without_restart, with_restart;
  {
    auto stack = open_stack(a.store());
    CHECK(replay(*stack, *codec, n) == 0.0);  // cold
    without_restart = replay(*stack, *codec, n);
  }
  {
    auto stack = open_stack(b.store());
    CHECK(replay(*stack, *codec, n) == 0.0);
  }
  {
    auto stack = open_stack(b.store());  // a new process would see the same
    std::vector<ObjectKey> keys;
    for (std::uint64_t i = 0; i < n; ++i) keys.push_back(key_of(i, 77));
    auto hits = stack->lookup_prefix(keys);
    REQUIRE(hits.is_ok());
    CHECK(*hits == n);
    with_restart = replay(*stack, *codec, n);
    CHECK(stack->tier(1).metrics().of(Op::kGet).ok.get() > 0);
  }
  CHECK(without_restart == 1.0);
  CHECK(with_restart == without_restart);
}

namespace {

// An ImageMemory over a heap arena of `pages` pages: bump allocation, nullptr once full (a full
// page-locked arena). Counts the ranges out and notes any range given back that it never gave.
class ArenaMemory final : public ImageMemory {
 public:
  explicit ArenaMemory(std::size_t pages)
      : arena_(static_cast<std::byte*>(std::aligned_alloc(4096, (pages + 1) * 4096))),
        size_(pages * 4096) {}
  ~ArenaMemory() override { std::free(arena_); }
  std::byte* allocate(std::size_t bytes) noexcept override {
    std::lock_guard lock(mu_);
    ++asked;
    if (bytes % 4096 != 0 || used_ + bytes > size_) return nullptr;
    std::byte* p = arena_ + used_;
    used_ += bytes;
    ++out;
    return p;
  }
  void free(std::byte* p, std::size_t bytes) noexcept override {
    std::lock_guard lock(mu_);
    if (p < arena_ || p + bytes > arena_ + used_) foreign = true;
    --out;
  }
  std::atomic<int> asked{0}, out{0};
  std::atomic<bool> foreign{false};

 private:
  std::mutex mu_;
  std::byte* arena_;
  std::size_t size_, used_ = 0;
};

}  // namespace

TEST_CASE("a stack's images come from the memory it is given, the heap when that has none left") {
  TempDir d;
  auto codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  std::string profile = R"({"tiers": [{"name": "disk", "capacity": "8MiB",
      "backend": {"type": "disk", "path": ")" +
                        d.store() + R"(", "region_size": "1MiB"}}]})";
  auto p = parse_profile(Json::parse(profile), Registry::global(), "<t>");
  REQUIRE_MESSAGE(p, p.status().to_string());
  auto stack = std::move(TierStack::open(*p)).value();
  auto arena = std::make_shared<ArenaMemory>(64);  // 256 KiB: several 20 KB images at once
  stack->set_image_memory(arena);
  // Saves encode into the stack's images (the disk tier gathers nothing) and loads read into
  // them: every byte arrives through the arena's pages.
  const auto round_trip = [&](std::uint64_t first) {
    for (std::uint64_t i = first; i < first + 8; ++i) {
      auto data = payload_of(i);
      Region s = host_region(data);
      Status st;
      REQUIRE(stack->save(std::span<const SaveItem>({SaveItem{key_of(i), RegionList(&s, 1)}}),
                          *codec, std::span(&st, 1)));
      REQUIRE_MESSAGE(st, st.to_string());
    }
    std::vector<std::vector<std::byte>> got(8, std::vector<std::byte>(20'000));
    std::vector<Region> r;
    std::vector<LoadItem> items;
    for (auto& g : got) r.push_back(host_region(g));
    for (std::uint64_t i = 0; i < 8; ++i)
      items.push_back({key_of(first + i), RegionList(&r[i], 1)});
    std::vector<LoadResult> out(8);
    REQUIRE(stack->load(items, *codec, out));
    for (std::uint64_t i = 0; i < 8; ++i) {
      CHECK_MESSAGE(out[i].status, out[i].status.to_string());
      CHECK(got[i] == payload_of(first + i));
    }
  };
  round_trip(0);
  CHECK(arena->asked.load() > 0);
  CHECK(arena->out.load() > 0);  // the pool keeps them for the next requests
  // A memory with no room: every buffer from the heap, the same bytes. The first memory's free
  // buffers are dropped at once.
  auto full = std::make_shared<ArenaMemory>(0);
  stack->set_image_memory(full);
  CHECK(arena->out.load() == 0);
  round_trip(100);
  CHECK(full->asked.load() > 0);
  CHECK(full->out.load() == 0);
  stack->set_image_memory(arena);
  round_trip(200);
  stack.reset();  // every range given back, to the memory it came from
  CHECK(arena->out.load() == 0);
  CHECK_FALSE(arena->foreign.load());
  CHECK_FALSE(full->foreign.load());
}

int main(int argc, char** argv) { return run_disk_tests(argc, argv); }
