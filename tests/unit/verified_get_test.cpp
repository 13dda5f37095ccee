// Verified gets of object format version 2 images (docs/object-format.md) through the cpu tier,
// on the host: a byte flipped in a stored image (in chunk 0, in the last partial chunk, in the
// header's payload checksum, which is the chunk list's, or elsewhere in the header) fails the
// get as ChecksumMismatch, counted, with no valid header left in the destination; version 1
// images still read; several owner threads verify at once on the shared verification threads.
// The device-destination variants are in cpu_pinned_gpu_test.cpp.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>

#include "support/shell.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::test::flip_stored_byte;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::run;

namespace {

// Four checksum chunks, the last one partial.
constexpr std::size_t kPayload = 3 * kChecksumChunkBytes + 1234;
constexpr std::size_t kBlock = 16384;

// Image offsets to flip, with what they hit.
struct Flip {
  std::size_t offset;
  const char* where;
};
const Flip kPayloadFlips[] = {
    {kObjectHeaderBytes + 5, "chunk 0"},
    {kObjectHeaderBytes + kChecksumChunkBytes - 1, "chunk 0, last byte"},
    {kObjectHeaderBytes + 3 * kChecksumChunkBytes + 1000, "the last, partial chunk"},
};
const Flip kHeaderFlips[] = {
    {66, "the payload checksum (the chunk list's)"},
    {36, "the object id"},
    {4, "the version"},
};

struct Segment {
  std::string name;
  Segment() {
    static int counter = 0;
    name = fmt::format("libtier-verified-get-{}-{}", ::getpid(), counter++);
  }
  ~Segment() {
    std::error_code ec;
    std::filesystem::remove("/dev/shm/" + name, ec);
  }
};

// A cpu tier: heap mode, or shm mode on `segment`; null when this build has no shm mode.
PluginPtr<Backend> open_tier(const std::string& segment = {}) {
  Json options = segment.empty()
                     ? Json::object()
                     : Json{{"mode", "shm"}, {"segment", segment}, {"block_size", kBlock}};
  auto b = Registry::global().create_backend("cpu", BackendContext{"cpu", 8u << 20, options});
  if (!b) {
    MESSAGE("cpu tier not available: " << b.status().to_string());
    return PluginPtr<Backend>(nullptr, {});
  }
  return std::move(b).value();
}

// Flips the byte at image offset `off` of the stored copy of `good` in the segment's file,
// found by a window of the image around it within one block.
void flip_in_segment(const Segment& seg, const std::vector<std::byte>& good, std::size_t off) {
  flip_stored_byte("/dev/shm/" + seg.name, good, off, kBlock);
}

// A get of `k` into a host buffer that held a valid copy: ChecksumMismatch, counted, and no
// valid header left.
void get_fails(Backend& be, const ObjectKey& k, const std::vector<std::byte>& good) {
  const std::uint64_t failures = be.metrics().checksum_failures.get();
  std::vector<std::byte> dst = good;
  Completion g = run(be, Op::kGet, k, host_region(dst));
  CHECK(g.status.code() == Code::kChecksumMismatch);
  CHECK_FALSE(parse_object_header(dst).is_ok());
  CHECK_FALSE(verify_object(dst, k));
  CHECK(be.metrics().checksum_failures.get() > failures);
}

}  // namespace

TEST_CASE("cpu heap tier: a flipped byte in chunk 0 or the last partial chunk fails the get") {
  auto be = open_tier();
  REQUIRE(be);
  for (const Flip& f : kPayloadFlips) {
    CAPTURE(std::string(f.where));
    const ObjectKey k = key_of(100 + f.offset);
    const auto good = make_image(k, kPayload, 1);
    REQUIRE(parse_object_header(good)->version == kObjectVersion);
    auto rotten = good;  // the heap is private to the tier: the rot is put in
    rotten[f.offset] ^= std::byte{0x08};
    REQUIRE(run(*be, Op::kPut, k, host_region(rotten)).status);
    get_fails(*be, k, good);
  }
}

TEST_CASE("cpu shm tier: a flipped byte in any chunk, the checksum or the header fails the get") {
  std::vector<Flip> flips(std::begin(kPayloadFlips), std::end(kPayloadFlips));
  flips.insert(flips.end(), std::begin(kHeaderFlips), std::end(kHeaderFlips));
  for (const Flip& f : flips) {
    CAPTURE(std::string(f.where));
    Segment seg;
    auto be = open_tier(seg.name);
    if (!be) return;  // no shm mode in this build
    const ObjectKey k = key_of(200 + f.offset);
    auto good = make_image(k, kPayload, 2);
    REQUIRE(run(*be, Op::kPut, k, host_region(good)).status);
    std::vector<std::byte> out(good.size());
    REQUIRE(run(*be, Op::kGet, k, host_region(out)).status);
    CHECK(out == good);
    flip_in_segment(seg, good, f.offset);
    get_fails(*be, k, good);
  }
}

TEST_CASE("cpu tiers still read version 1 images, and fail corrupt ones") {
  Segment seg;
  for (bool shm : {false, true}) {
    CAPTURE(shm);
    auto be = open_tier(shm ? seg.name : std::string());
    if (!be) continue;
    const ObjectKey k = key_of(300);
    auto img = make_image(k, kPayload, 3);
    seal_object(img, 1, 0, k, kObjectVersionWholePayload);
    REQUIRE(parse_object_header(img)->version == 1);
    REQUIRE(run(*be, Op::kPut, k, host_region(img)).status);
    std::vector<std::byte> out(img.size());
    Completion g = run(*be, Op::kGet, k, host_region(out));
    REQUIRE_MESSAGE(g.status, g.status.to_string());
    CHECK(out == img);
    if (shm) continue;
    const ObjectKey bad_key = key_of(301);
    auto bad = make_image(bad_key, kPayload, 3);
    seal_object(bad, 1, 0, bad_key, kObjectVersionWholePayload);
    const auto good = bad;
    bad[kObjectHeaderBytes + kPayload - 1] ^= std::byte{1};
    REQUIRE(run(*be, Op::kPut, bad_key, host_region(bad)).status);
    get_fails(*be, bad_key, good);
  }
}

TEST_CASE("owner threads of several tiers verify at once on the shared verification threads") {
  const unsigned before = verify_threads();
  set_verify_threads(3);
  constexpr int kThreads = 3;
  std::vector<int> ok(kThreads, 0), caught(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto be = open_tier();
      if (!be) return;
      const ObjectKey k = key_of(400 + t), r = key_of(500 + t);
      auto img = make_image(k, kPayload + t * 4096, t);
      auto rotten = make_image(r, kPayload, t);
      rotten[kObjectHeaderBytes + 2 * kChecksumChunkBytes + 7] ^= std::byte{0x10};
      if (!run(*be, Op::kPut, k, host_region(img)).status ||
          !run(*be, Op::kPut, r, host_region(rotten)).status)
        return;
      std::vector<std::byte> out(img.size());
      for (int i = 0; i < 20; ++i) {
        ok[t] += run(*be, Op::kGet, k, host_region(out)).status.is_ok() && out == img;
        caught[t] +=
            run(*be, Op::kGet, r, host_region(out)).status.code() == Code::kChecksumMismatch;
      }
    });
  }
  for (auto& th : threads) th.join();
  set_verify_threads(before);
  for (int t = 0; t < kThreads; ++t) {
    CHECK(ok[t] == 20);
    CHECK(caught[t] == 20);
  }
}
