// The cpu tier's pinned mode ("pinned": true) on a real device, heap and shm modes: puts from
// device memory, gets into device, pinned and pageable memory, bit-exact for odd sizes (images
// of 193 and 127 bytes, payloads of 193 and 127 bytes) and 1 MiB; corrupt stored bytes are a
// checksum failure and never data (the device destination's header is zeroed), for object format
// version 2 in each of chunk 0, the last partial chunk, the payload checksum and the header, and
// version 1 images still read; a device image
// whose header does not name the key is refused; LRU and exact capacity as in the heap mode,
// through arena compaction. Exits 77 (Meson: SKIP) on a machine without a GPU.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gpu.hpp"
#include "support/shell.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

using namespace tier;
using namespace tier::gpu;
using tier::test::flip_stored_byte;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::run;

namespace {

// Payload sizes: images of 193 and 127 bytes, payloads of 193 and 127 bytes, and 1 MiB.
const std::size_t kPayloads[] = {193 - kObjectHeaderBytes, 127 - kObjectHeaderBytes, 193, 127,
                                 1u << 20};

Stream& stream() {
  static Stream s = std::move(Stream::create(0)).value();
  return s;
}

DeviceBuffer upload(const std::vector<std::byte>& bytes) {
  auto d = DeviceBuffer::allocate(0, bytes.size());
  REQUIRE(d);
  REQUIRE(
      copy_async(d->region(), host_region(const_cast<std::vector<std::byte>&>(bytes)), stream()));
  REQUIRE(stream().synchronize());
  return std::move(d).value();
}

std::vector<std::byte> download(const DeviceBuffer& d, std::size_t n) {
  std::vector<std::byte> v(n);
  REQUIRE(copy_async(host_region(v), d.region().slice(0, n), stream()));
  REQUIRE(stream().synchronize());
  return v;
}

PluginPtr<Backend> open_tier(std::uint64_t capacity, Json options = Json::object()) {
  options["pinned"] = true;
  auto b = Registry::global().create_backend("cpu", BackendContext{"pinned", capacity, options});
  REQUIRE_MESSAGE(b, b.status().to_string());
  return std::move(b).value();
}

// A shm segment name unique to this run; removed at the end of the test case.
struct Segment {
  std::string name = fmt::format("libtier-pinned-{}", ::getpid());
  ~Segment() {
    std::error_code ec;
    std::filesystem::remove("/dev/shm/" + name, ec);
  }
  Json options(std::uint64_t block_size = 16384) const {
    return Json{{"mode", "shm"}, {"segment", name}, {"block_size", block_size}};
  }
};

// Every put/get path for one image: device put, then device, pinned and pageable gets; then a
// host put of another key read back into device memory.
void round_trips(Backend& be, std::uint64_t base) {
  CHECK((be.capabilities().memory_kinds & kind_bit(MemoryKind::kDevice)) != 0);
  for (std::size_t i = 0; i < std::size(kPayloads); ++i) {
    const std::size_t payload = kPayloads[i];
    CAPTURE(payload);
    const ObjectKey k = key_of(base + i);
    const auto img = make_image(k, payload, 7);
    DeviceBuffer src = upload(img);
    Completion p = run(be, Op::kPut, k, src.region());
    REQUIRE_MESSAGE(p.status, p.status.to_string());
    CHECK(p.bytes == img.size());

    // Into device memory larger than the image: the image lands at the front, bit-exact.
    auto dst = DeviceBuffer::allocate(0, img.size() + 64);
    REQUIRE(dst);
    Completion g = run(be, Op::kGet, k, dst->region());
    REQUIRE_MESSAGE(g.status, g.status.to_string());
    CHECK(g.bytes == img.size());
    CHECK(download(*dst, img.size()) == img);

    auto pinned = PinnedBuffer::allocate(img.size());
    REQUIRE(pinned);
    g = run(be, Op::kGet, k, pinned->region());
    REQUIRE_MESSAGE(g.status, g.status.to_string());
    CHECK(std::memcmp(pinned->data(), img.data(), img.size()) == 0);

    std::vector<std::byte> host(img.size());
    g = run(be, Op::kGet, k, host_region(host));
    REQUIRE_MESSAGE(g.status, g.status.to_string());
    CHECK(host == img);

    // A host put read back into device memory.
    const ObjectKey hk = key_of(base + 100 + i);
    auto himg = make_image(hk, payload, 9);
    REQUIRE(run(be, Op::kPut, hk, host_region(himg)).status);
    g = run(be, Op::kGet, hk, dst->region());
    REQUIRE_MESSAGE(g.status, g.status.to_string());
    CHECK(download(*dst, himg.size()) == himg);

    // Put-if-absent from device memory too; a too-small device buffer gets the size needed.
    CHECK(run(be, Op::kPut, k, src.region()).status.code() == Code::kAlreadyExists);
    g = run(be, Op::kGet, k, dst->region().slice(0, img.size() - 1));
    CHECK(g.status.code() == Code::kInvalidArgument);
    CHECK(g.bytes == img.size());
  }
}

// Gets of `k`, whose stored payload is corrupt, into device and host memory: ChecksumMismatch,
// and neither destination is left holding a valid header (the device one held a good copy of the
// same object before).
void corrupt_gets_fail(Backend& be, const ObjectKey& k, const std::vector<std::byte>& good) {
  const std::uint64_t failures = be.metrics().checksum_failures.get();
  DeviceBuffer dst = upload(good);
  Completion g = run(be, Op::kGet, k, dst.region());
  CHECK(g.status.code() == Code::kChecksumMismatch);
  auto after = download(dst, good.size());
  CHECK(std::all_of(after.begin(), after.begin() + kObjectHeaderBytes,
                    [](std::byte b) { return b == std::byte{0}; }));
  CHECK_FALSE(verify_object(after, k));

  std::vector<std::byte> host = good;
  g = run(be, Op::kGet, k, host_region(host));
  CHECK(g.status.code() == Code::kChecksumMismatch);
  CHECK_FALSE(verify_object(host, k));
  CHECK(be.metrics().checksum_failures.get() >= failures + 2);
}

}  // namespace

TEST_CASE("pinned heap tier: device, pinned and pageable round trips, bit-exact") {
  auto be = open_tier(16u << 20);
  round_trips(*be, 1000);
  CHECK(be->describe().find("pinned") != std::string::npos);
}

TEST_CASE("pinned shm tier: device, pinned and pageable round trips, bit-exact") {
  Segment seg;
  auto be = open_tier(16u << 20, seg.options());
  round_trips(*be, 2000);
  // A second process-local tier on the same segment (its own registration) reads them too.
  auto other = open_tier(16u << 20, seg.options());
  const ObjectKey k = key_of(2000 + 4);
  auto img = make_image(k, 1u << 20, 7);
  auto dst = DeviceBuffer::allocate(0, img.size());
  REQUIRE(dst);
  Completion g = run(*other, Op::kGet, k, dst->region());
  REQUIRE_MESSAGE(g.status, g.status.to_string());
  CHECK(download(*dst, img.size()) == img);
}

TEST_CASE("pinned shm tier: an object in scattered blocks moves piece by piece") {
  Segment seg;
  auto be = open_tier(1u << 20, seg.options(4096));
  // Blocks 0..5 hold six one-block objects; removing 0, 2 and 4 leaves the free list 4, 2, 0, 6..
  for (std::uint64_t i = 0; i < 6; ++i) {
    auto img = make_image(key_of(3000 + i), 4000);
    REQUIRE(run(*be, Op::kPut, key_of(3000 + i), host_region(img)).status);
  }
  for (std::uint64_t i : {0, 2, 4}) REQUIRE(run(*be, Op::kRemove, key_of(3000 + i)).status);
  const ObjectKey k = key_of(3100);
  auto img = make_image(k, 5 * 4096 + 193, 3);  // six blocks: 4, 2, 0, then a run of three
  DeviceBuffer src = upload(img);
  REQUIRE(run(*be, Op::kPut, k, src.region()).status);
  auto dst = DeviceBuffer::allocate(0, img.size());
  REQUIRE(dst);
  REQUIRE(run(*be, Op::kGet, k, dst->region()).status);
  CHECK(download(*dst, img.size()) == img);
  std::vector<std::byte> host(img.size());
  REQUIRE(run(*be, Op::kGet, k, host_region(host)).status);
  CHECK(host == img);
}

TEST_CASE("a device image whose header does not name the key is refused, nothing stored") {
  for (bool shm : {false, true}) {
    CAPTURE(shm);
    Segment seg;
    auto be = open_tier(4u << 20, shm ? seg.options() : Json::object());
    const ObjectKey k = key_of(40), other = key_of(41);
    DeviceBuffer wrong = upload(make_image(other, 193));
    Completion p = run(*be, Op::kPut, k, wrong.region());
    CHECK(p.status.code() == Code::kInvalidArgument);
    std::vector<std::byte> garbage(4096, std::byte{0x5A});
    DeviceBuffer junk = upload(garbage);
    CHECK(run(*be, Op::kPut, k, junk.region()).status.code() == Code::kInvalidArgument);
    CHECK(run(*be, Op::kContains, k).status.code() == Code::kNotFound);
    CHECK(be->usage().objects == 0);
    CHECK(be->usage().used_bytes == 0);
    // The key can be stored properly afterwards.
    DeviceBuffer right = upload(make_image(k, 193));
    CHECK(run(*be, Op::kPut, k, right.region()).status);
  }
}

TEST_CASE("pinned heap tier: a corrupt stored payload is a checksum failure, never data") {
  auto be = open_tier(4u << 20);
  for (std::size_t payload : {std::size_t{193}, std::size_t{1} << 20}) {
    CAPTURE(payload);
    const ObjectKey k = key_of(50 + payload);
    const auto good = make_image(k, payload);
    // The arena is private to the tier, so the rot is put in: a well-framed image whose payload
    // lost a bit after sealing is stored exactly like a stored byte that flipped later.
    auto rotten = good;
    rotten[kObjectHeaderBytes + payload / 2] ^= std::byte{0x10};
    DeviceBuffer src = upload(rotten);
    REQUIRE(run(*be, Op::kPut, k, src.region()).status);
    corrupt_gets_fail(*be, k, good);
  }
}

// Flips one byte of the stored image of `good` in the segment file, through a separate mapping:
// the byte at image offset `off`, found by a window of the image around it that lies within one
// block (images start at a block boundary, so block boundaries are multiples of `block`).
void flip_in_segment(const Segment& seg, const std::vector<std::byte>& good, std::size_t off,
                     std::size_t block) {
  flip_stored_byte("/dev/shm/" + seg.name, good, off, block);
}

TEST_CASE("pinned shm tier: a flipped byte in the segment is a checksum failure, never data") {
  Segment seg;
  auto be = open_tier(4u << 20, seg.options());
  const ObjectKey k = key_of(60);
  const auto good = make_image(k, 1u << 20, 5);
  DeviceBuffer src = upload(good);
  REQUIRE(run(*be, Op::kPut, k, src.region()).status);
  flip_in_segment(seg, good, kObjectHeaderBytes + 1100, 16384);  // a separate mapping
  corrupt_gets_fail(*be, k, good);
}

// Object format version 2 (docs/object-format.md): the payload is verified in 64 KiB chunks while
// the DMA runs. A byte flipped in chunk 0, in the last (partial) chunk, in the header's payload
// checksum (the chunk list's) or elsewhere in the header fails the get into device memory as
// ChecksumMismatch, and the destination keeps no valid header.
TEST_CASE("pinned shm tier, device destination: a flipped byte in any chunk or the header fails") {
  const std::size_t payload = 3 * kChecksumChunkBytes + 1234;
  const std::size_t offsets[] = {
      kObjectHeaderBytes + 5,                               // chunk 0
      kObjectHeaderBytes + 3 * kChecksumChunkBytes + 1000,  // the last, partial chunk
      66,                                                   // the payload checksum
      36,                                                   // the key, in the header
  };
  for (std::size_t i = 0; i < std::size(offsets); ++i) {
    CAPTURE(offsets[i]);
    Segment seg;
    auto be = open_tier(4u << 20, seg.options());
    const ObjectKey k = key_of(500 + i);
    const auto good = make_image(k, payload, 11);
    REQUIRE(parse_object_header(good)->version == kObjectVersion);
    DeviceBuffer src = upload(good);
    REQUIRE(run(*be, Op::kPut, k, src.region()).status);
    auto dst = DeviceBuffer::allocate(0, good.size());
    REQUIRE(dst);
    REQUIRE(run(*be, Op::kGet, k, dst->region()).status);  // good before the flip
    flip_in_segment(seg, good, offsets[i], 16384);
    corrupt_gets_fail(*be, k, good);
  }
}

TEST_CASE(
    "pinned heap tier, device destination: a flipped byte in chunk 0 or the last chunk "
    "fails") {
  auto be = open_tier(4u << 20);
  const std::size_t payload = 3 * kChecksumChunkBytes + 1234;
  for (std::size_t off : {kObjectHeaderBytes + 5, kObjectHeaderBytes + payload - 1}) {
    CAPTURE(off);
    const ObjectKey k = key_of(600 + off);
    const auto good = make_image(k, payload, 13);
    auto rotten = good;  // the arena is private to the tier: the rot is put in
    rotten[off] ^= std::byte{0x02};
    DeviceBuffer src = upload(rotten);
    REQUIRE(run(*be, Op::kPut, k, src.region()).status);
    corrupt_gets_fail(*be, k, good);
  }
}

// A scattered get into device regions: `expect` is the header buffer (the layout the caller
// accepts), `tail` the device regions. Returns the completion.
Completion scattered_get(Backend& be, const ObjectKey& k, std::span<std::byte> expect,
                         std::vector<Region> tail) {
  IoRequest req{Op::kGet, k, host_region(expect), 7, tail};
  auto r = be.submit(std::span(&req, 1));
  REQUIRE(r);
  REQUIRE(*r == 1);
  Completion c;
  auto n = be.poll(std::span(&c, 1), 1, std::chrono::microseconds(10'000'000));
  REQUIRE(n);
  REQUIRE(*n == 1);
  return c;
}

// Three device regions of one buffer covering `payload` bytes, with gaps between them, each
// region's bytes pre-filled with 0xee.
struct ScatterTarget {
  DeviceBuffer buf;
  std::vector<Region> regions;
  std::vector<std::size_t> at;  // offsets of the regions in buf
  explicit ScatterTarget(std::size_t payload) {
    const std::size_t a = payload / 3 + 5, b = payload / 3 - 7, c = payload - a - b;
    auto d = DeviceBuffer::allocate(0, payload + 3 * 4096);
    REQUIRE(d);
    buf = std::move(d).value();
    REQUIRE(fill_async(buf.region(), 0xee, stream().handle()));
    REQUIRE(stream().synchronize());
    std::size_t off = 0;
    for (std::size_t n : {a, b, c}) {
      at.push_back(off);
      regions.push_back(buf.region().slice(off, n));
      off += n + 4096;
    }
  }
  // The regions' bytes, concatenated.
  std::vector<std::byte> payload() {
    std::vector<std::byte> all = download(buf, buf.size()), out;
    for (std::size_t i = 0; i < regions.size(); ++i)
      out.insert(out.end(), all.begin() + at[i], all.begin() + at[i] + regions[i].size);
    return out;
  }
};

std::array<std::byte, kObjectHeaderBytes> expected_header(std::uint32_t layout,
                                                          const ObjectKey& k) {
  std::array<std::byte, kObjectHeaderBytes> h{};
  write_object_header(h, ObjectHeader{layout, 0, k, 0, 0});
  return h;
}

// Gets keys key_of(first + i) of `images` into fresh targets in one submit, polls every
// completion and checks them: `rotten` fails with ChecksumMismatch and writes nothing, every
// other lands bit-exact with its stored header.
void get_all_one_rotten(Backend& be, std::uint64_t first,
                        const std::vector<std::vector<std::byte>>& images, std::uint64_t rotten) {
  const std::uint64_t count = images.size();
  std::vector<ScatterTarget> targets;
  std::vector<std::array<std::byte, kObjectHeaderBytes>> headers;
  targets.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    targets.emplace_back(images[i].size() - kObjectHeaderBytes);
    headers.push_back(expected_header(1, key_of(first + i)));
  }
  const auto untouched = targets[rotten].payload();
  std::vector<IoRequest> reqs;
  for (std::uint64_t i = 0; i < count; ++i)
    reqs.push_back(
        IoRequest{Op::kGet, key_of(first + i), host_region(headers[i]), i, targets[i].regions});
  auto sub = be.submit(reqs);
  REQUIRE(sub);
  REQUIRE(*sub == count);
  std::vector<Completion> done;
  while (done.size() < count) {
    std::vector<Completion> c(count);
    auto n = be.poll(c, 1, std::chrono::microseconds(10'000'000));
    REQUIRE(n);
    REQUIRE(*n > 0);
    done.insert(done.end(), c.begin(), c.begin() + static_cast<std::ptrdiff_t>(*n));
  }
  for (const Completion& c : done) {
    CAPTURE(c.user_data);
    if (c.user_data == rotten) {
      CHECK(c.status.code() == Code::kChecksumMismatch);
      CHECK(targets[rotten].payload() == untouched);
    } else {
      REQUIRE_MESSAGE(c.status, c.status.to_string());
      CHECK(targets[c.user_data].payload() ==
            std::vector<std::byte>(images[c.user_data].begin() + kObjectHeaderBytes,
                                   images[c.user_data].end()));
      CHECK(std::memcmp(headers[c.user_data].data(), images[c.user_data].data(),
                        kObjectHeaderBytes) == 0);
    }
  }
}

TEST_CASE("pinned tiers: scattered gets into device regions, verified before a byte is written") {
  for (bool shm : {false, true}) {
    CAPTURE(shm);
    Segment seg;
    auto be = open_tier(8u << 20, shm ? seg.options() : Json::object());
    CHECK(be->capabilities().scatter_gets);
    const std::size_t payload = 3 * kChecksumChunkBytes + 1234;
    // Several gets in flight at once (the heap mode completes them in poll), then a put.
    std::vector<std::vector<std::byte>> images;
    for (std::uint64_t i = 0; i < 4; ++i) {
      images.push_back(make_image(key_of(800 + i), payload, i));
      REQUIRE(run(*be, Op::kPut, key_of(800 + i), host_region(images.back())).status);
    }
    std::vector<ScatterTarget> targets;
    std::vector<std::array<std::byte, kObjectHeaderBytes>> headers;
    for (std::uint64_t i = 0; i < 4; ++i) {
      targets.emplace_back(payload);
      headers.push_back(expected_header(1, key_of(800 + i)));
    }
    std::vector<IoRequest> reqs;
    for (std::uint64_t i = 0; i < 4; ++i)
      reqs.push_back(IoRequest{Op::kGet, key_of(800 + i), host_region(headers[i]), 100 + i,
                               targets[i].regions});
    auto sub = be->submit(reqs);
    REQUIRE(sub);
    CHECK(*sub == 4);
    const ObjectKey extra = key_of(899);
    auto extra_img = make_image(extra, 4096, 3);
    CHECK(run(*be, Op::kPut, extra, host_region(extra_img)).status);  // waits for the copies
    std::vector<Completion> done;
    while (done.size() < 5) {  // the four gets and run()'s put were reaped above or here
      Completion c[8];
      auto n = be->poll(c, 0, std::chrono::microseconds(0));
      REQUIRE(n);
      if (*n == 0) break;
      done.insert(done.end(), c, c + *n);
    }
    // run() reaped the put's completion and may have dropped gets' completions it saw first:
    // check the bytes, which is what the gets promised.
    for (std::uint64_t i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(targets[i].payload() ==
            std::vector<std::byte>(images[i].begin() + kObjectHeaderBytes, images[i].end()));
    }
    for (const Completion& c : done) CHECK_MESSAGE(c.status, c.status.to_string());

    // One at a time: the stored header comes back in the header buffer.
    ScatterTarget t(payload);
    auto h = expected_header(1, key_of(801));
    Completion c = scattered_get(*be, key_of(801), h, t.regions);
    REQUIRE_MESSAGE(c.status, c.status.to_string());
    CHECK(c.bytes == images[1].size());
    CHECK(std::memcmp(h.data(), images[1].data(), kObjectHeaderBytes) == 0);
    CHECK(t.payload() ==
          std::vector<std::byte>(images[1].begin() + kObjectHeaderBytes, images[1].end()));

    // Another layout, or regions of another size: InvalidArgument, nothing written.
    ScatterTarget u(payload);
    const auto untouched = u.payload();
    auto other = expected_header(2, key_of(802));
    CHECK(scattered_get(*be, key_of(802), other, u.regions).status.code() ==
          Code::kInvalidArgument);
    auto same = expected_header(1, key_of(802));
    std::vector<Region> shorter = u.regions;
    shorter.back() = shorter.back().slice(0, shorter.back().size - 1);
    CHECK(scattered_get(*be, key_of(802), same, shorter).status.code() == Code::kInvalidArgument);
    CHECK(u.payload() == untouched);
    // Host and device regions in one tail: refused at submit.
    std::vector<std::byte> host(16);
    std::vector<Region> mixed = u.regions;
    mixed.push_back(host_region(host));
    CHECK(scattered_get(*be, key_of(802), same, mixed).status.code() == Code::kInvalidArgument);
  }
}

TEST_CASE("pinned heap tier: a scattered get of a corrupt payload writes nothing") {
  auto be = open_tier(4u << 20);
  const std::size_t payload = 3 * kChecksumChunkBytes + 1234;
  for (std::size_t off : {kObjectHeaderBytes + 5, kObjectHeaderBytes + payload - 1, std::size_t{40}}) {
    CAPTURE(off);
    const ObjectKey k = key_of(900 + off);
    auto rotten = make_image(k, payload, 13);
    rotten[off] ^= std::byte{0x02};  // the arena is private to the tier: the rot is put in
    DeviceBuffer src = upload(rotten);
    (void)run(*be, Op::kPut, k, src.region());  // a rotten header is refused here already
    ScatterTarget t(payload);
    const auto untouched = t.payload();
    auto h = expected_header(1, k);
    const Code got = scattered_get(*be, k, h, t.regions).status.code();
    CHECK((got == Code::kChecksumMismatch || got == Code::kNotFound));
    CHECK(t.payload() == untouched);
  }
}

TEST_CASE("pinned heap tier: a batch of scattered gets larger than the GPU's staging ring, one "
          "of them corrupt") {
  // 24 payloads of 5 MiB, every fourth of 17 MiB and 5 bytes (DMA'd in two parts, its last tenth
  // last, each checked as it lands; 192 MiB in all, three times the 64 MiB ring) in one submit:
  // the DMAs wait on the device for the ring ranges of earlier gets. The rotten one fails alone
  // and writes nothing.
  // (The shm mode waits for each get inside its hold: its ring use is the sequential case.)
  {
    auto be = open_tier(256u << 20);
    auto payload_of = [](std::uint64_t i) { return i % 4 == 3 ? (17u << 20) + 5 : 5u << 20; };
    const std::uint64_t rotten = 19;  // a two-part one, rotten in its last part
    std::vector<std::vector<std::byte>> images;
    for (std::uint64_t i = 0; i < 24; ++i) {
      images.push_back(make_image(key_of(1000 + i), payload_of(i), 40 + i));
      auto stored = images.back();
      if (i == rotten) stored[kObjectHeaderBytes + payload_of(i) - 9] ^= std::byte{0x40};
      REQUIRE(run(*be, Op::kPut, key_of(1000 + i), host_region(stored)).status);
    }
    get_all_one_rotten(*be, 1000, images, rotten);
  }
}

TEST_CASE("pinned heap tier: small scattered gets in one submit move in batches, one corrupt") {
  // 40 payloads of 100,000 bytes stored back to back (batches of up to 16 objects: one DMA per
  // run of adjacent images, one verification and one copy launch), every fifth with an odd length
  // (its neighbour's payload is then not 8-byte aligned in the run: a run of its own). The rotten
  // one fails alone and writes nothing; every other lands bit-exact with its stored header.
  auto be = open_tier(64u << 20);
  constexpr std::uint64_t kCount = 40, kRotten = 23;
  auto payload_of = [](std::uint64_t i) { return i % 5 == 4 ? 100'003u : 100'000u; };
  std::vector<std::vector<std::byte>> images;
  for (std::uint64_t i = 0; i < kCount; ++i) {
    images.push_back(make_image(key_of(1200 + i), payload_of(i), 70 + i));
    auto stored = images.back();
    if (i == kRotten) stored[kObjectHeaderBytes + 77'777] ^= std::byte{0x04};
    REQUIRE(run(*be, Op::kPut, key_of(1200 + i), host_region(stored)).status);
  }
  get_all_one_rotten(*be, 1200, images, kRotten);
}

TEST_CASE(
    "pinned heap tier: 1 MiB scattered gets of one submit, gathered into 4 and 8 MiB "
    "batches") {
  // 21 payloads of 1 MiB in one submit (Backend::submit's windows of 16 requests): inside the
  // submit the open batch goes once it holds 4 MiB when it is the first, or when what the submit
  // still brings (its later windows included) is 4 MiB or less, and 8 MiB between; it stays open
  // across a window's end: batches of 4, 8, 5 and 4 MiB. The rotten one, in the middle of the 8
  // MiB batch, fails alone and writes nothing.
  auto be = open_tier(32u << 20);
  constexpr std::uint64_t kCount = 21, kRotten = 9;
  std::vector<std::vector<std::byte>> images;
  for (std::uint64_t i = 0; i < kCount; ++i) {
    images.push_back(make_image(key_of(1300 + i), 1u << 20, 90 + i));
    auto stored = images.back();
    if (i == kRotten) stored[kObjectHeaderBytes + 500'000] ^= std::byte{0x10};
    REQUIRE(run(*be, Op::kPut, key_of(1300 + i), host_region(stored)).status);
  }
  get_all_one_rotten(*be, 1300, images, kRotten);
}

TEST_CASE("pinned heap tier: scattered gets the GPU does not verify (version 1, larger than the "
          "ring) are checked on the host") {
  auto be = open_tier(200u << 20);
  for (std::size_t payload : {std::size_t{3} * kChecksumChunkBytes + 77, std::size_t{65} << 20}) {
    for (bool v1 : {true, false}) {
      if (!v1 && payload < (64u << 20)) continue;  // version 2 that fits: the GPU's case above
      CAPTURE(payload);
      CAPTURE(v1);
      const ObjectKey k = key_of(1100 + payload % 1000 + v1);
      auto img = make_image(k, payload, 5);
      if (v1) seal_object(img, 1, 0, k, kObjectVersionWholePayload);
      REQUIRE(run(*be, Op::kPut, k, host_region(img)).status);
      ScatterTarget t(payload);
      auto h = expected_header(1, k);
      Completion c = scattered_get(*be, k, h, t.regions);
      REQUIRE_MESSAGE(c.status, c.status.to_string());
      CHECK(t.payload() == std::vector<std::byte>(img.begin() + kObjectHeaderBytes, img.end()));
      REQUIRE(run(*be, Op::kRemove, k, Region{}).status);
      img[kObjectHeaderBytes + payload / 2] ^= std::byte{0x01};
      REQUIRE(run(*be, Op::kPut, k, host_region(img)).status);
      ScatterTarget u(payload);
      const auto untouched = u.payload();
      CHECK(scattered_get(*be, k, h, u.regions).status.code() == Code::kChecksumMismatch);
      CHECK(u.payload() == untouched);
    }
  }
}

TEST_CASE("pinned tiers still read version 1 images into device memory") {
  for (bool shm : {false, true}) {
    CAPTURE(shm);
    Segment seg;
    auto be = open_tier(4u << 20, shm ? seg.options() : Json::object());
    const ObjectKey k = key_of(700);
    auto img = make_image(k, 3 * kChecksumChunkBytes + 77, 2);
    seal_object(img, 1, 0, k, kObjectVersionWholePayload);
    REQUIRE(run(*be, Op::kPut, k, host_region(img)).status);
    auto dst = DeviceBuffer::allocate(0, img.size());
    REQUIRE(dst);
    Completion g = run(*be, Op::kGet, k, dst->region());
    REQUIRE_MESSAGE(g.status, g.status.to_string());
    CHECK(download(*dst, img.size()) == img);
  }
}

TEST_CASE("pinned heap tier: exact capacity, LRU eviction and compaction as in the heap mode") {
  test::EvictionRecorder rec;
  // Three images of 193 payload bytes fill the capacity exactly.
  const std::size_t image = kObjectHeaderBytes + 193;
  auto be = open_tier(3 * image);
  be->set_eviction_handler(&rec);
  std::vector<std::vector<std::byte>> imgs;
  std::vector<DeviceBuffer> srcs;
  for (std::uint64_t i = 0; i < 3; ++i) {
    imgs.push_back(make_image(key_of(70 + i), 193));
    srcs.push_back(upload(imgs.back()));
    REQUIRE(run(*be, Op::kPut, key_of(70 + i), srcs.back().region()).status);
  }
  CHECK(be->usage().used_bytes == 3 * image);
  CHECK(rec.keys.empty());
  auto dst = DeviceBuffer::allocate(0, image);
  REQUIRE(dst);
  REQUIRE(run(*be, Op::kGet, key_of(70), dst->region()).status);  // 70 is now most recent
  auto img73 = make_image(key_of(73), 193);
  DeviceBuffer src73 = upload(img73);
  REQUIRE(run(*be, Op::kPut, key_of(73), src73.region()).status);
  REQUIRE(rec.keys.size() == 1);
  CHECK(rec.keys[0] == key_of(71));  // the least recently used, with its bytes
  CHECK(rec.images[0] == imgs[1]);
  CHECK(be->usage().used_bytes == 3 * image);

  // Scattered free bytes: in a tier of 1000 bytes, images of 300, 200 and 300 bytes, then the
  // first and the last removed: 800 free bytes as [0, 300) and [500, 1000). An 800-byte image
  // fits only once the 200 live bytes move to the front; nothing is evicted for it.
  auto big = open_tier(1000);
  big->set_eviction_handler(&rec);
  rec.keys.clear();
  std::vector<std::vector<std::byte>> v;
  for (std::uint64_t i = 0; i < 3; ++i) {
    v.push_back(make_image(key_of(80 + i), (i == 1 ? 200 : 300) - kObjectHeaderBytes));
    REQUIRE(run(*big, Op::kPut, key_of(80 + i), host_region(v.back())).status);
  }
  REQUIRE(run(*big, Op::kRemove, key_of(80)).status);
  REQUIRE(run(*big, Op::kRemove, key_of(82)).status);
  auto large = make_image(key_of(90), 800 - kObjectHeaderBytes, 4);
  DeviceBuffer srcl = upload(large);
  REQUIRE(run(*big, Op::kPut, key_of(90), srcl.region()).status);
  CHECK(rec.keys.empty());  // placed by compaction, nothing evicted
  CHECK(big->usage().used_bytes == 1000);
  CHECK(big->describe().find("1 compactions") != std::string::npos);
  // Both objects survived the move bit-exact.
  std::vector<std::byte> out(800);
  REQUIRE(run(*big, Op::kGet, key_of(90), host_region(out)).status);
  CHECK(out == large);
  auto d81 = DeviceBuffer::allocate(0, 200);
  REQUIRE(d81);
  REQUIRE(run(*big, Op::kGet, key_of(81), d81->region()).status);
  CHECK(download(*d81, 200) == v[1]);
}
