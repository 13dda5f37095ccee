// DSV4 PAGE and SLOT codecs on host memory: image order, odd sizes, every validation rule, and
// PAGE/SLOT regions that share one backing allocation.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tier/dsv4/page_codec.hpp"
#include "tier/dsv4/slot_codec.hpp"

using namespace tier::dsv4;
using tier::Code;

namespace {

constexpr std::uint64_t kBlocks = 4, kSlots = 3;
constexpr std::uint64_t kPage0 = 193, kPage1 = 127, kSlot0 = 181, kSlot1 = 109;

void fill(std::vector<std::byte>& v, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
}

// Two backing allocations, each holding a PAGE region at the bottom and a SLOT region at the top
// (the reference's deliberately odd sizes).
struct Engine {
  std::vector<std::byte> a = std::vector<std::byte>(kBlocks * kPage0 + kSlots * kSlot0);
  std::vector<std::byte> b = std::vector<std::byte>(kBlocks * kPage1 + kSlots * kSlot1);
  std::vector<BoundRegion> page() {
    return {{"r0", a.data(), kBlocks * kPage0, kPage0, false},
            {"r1", b.data(), kBlocks * kPage1, kPage1, false}};
  }
  std::vector<BoundRegion> slot() {
    return {{"r0", a.data() + kBlocks * kPage0, kSlots * kSlot0, kSlot0, true},
            {"r1", b.data() + kBlocks * kPage1, kSlots * kSlot1, kSlot1, true}};
  }
};

SlotIdentity identity() {
  SlotIdentity id;
  for (std::size_t i = 0; i < 16; ++i) id.fingerprint[i] = static_cast<std::byte>(i * 17);
  id.tp_size = 2;
  id.tp_rank = 1;
  return id;
}

}  // namespace

TEST_CASE("PAGE image is block-major, region-minor, in caller order, without padding") {
  Engine e;
  fill(e.a, 1);
  fill(e.b, 2);
  auto codec = PageCodec::create(e.page(), kBlocks);
  REQUIRE(codec.is_ok());
  CHECK((*codec)->bytes_per_block() == kPage0 + kPage1);
  std::vector<std::uint32_t> ids = {3, 0, 2};
  auto src = (*codec)->describe(ids);
  REQUIRE(src.is_ok());
  auto size = (*codec)->encoded_size(*src);
  REQUIRE(size.is_ok());
  CHECK(*size == 3 * (kPage0 + kPage1));
  std::vector<std::byte> image(*size);
  auto n = (*codec)->encode(*src, image);
  REQUIRE(n.is_ok());
  CHECK(*n == image.size());
  std::size_t off = 0;
  for (std::uint32_t id : ids) {
    CHECK(std::memcmp(image.data() + off, e.a.data() + id * kPage0, kPage0) == 0);
    off += kPage0;
    CHECK(std::memcmp(image.data() + off, e.b.data() + id * kPage1, kPage1) == 0);
    off += kPage1;
  }

  // Round trip into other blocks, reordered: bit-exact, and nothing else changes.
  Engine dst;
  fill(dst.a, 7);
  fill(dst.b, 8);
  auto before_a = dst.a, before_b = dst.b;
  auto dcodec = PageCodec::create(dst.page(), kBlocks);
  REQUIRE(dcodec.is_ok());
  std::vector<std::uint32_t> dst_ids = {1, 3, 0};
  auto dregions = (*dcodec)->describe(dst_ids);
  REQUIRE(dregions.is_ok());
  REQUIRE((*dcodec)->decode(image, *dregions).is_ok());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CHECK(std::memcmp(dst.a.data() + dst_ids[i] * kPage0, e.a.data() + ids[i] * kPage0, kPage0) == 0);
    CHECK(std::memcmp(dst.b.data() + dst_ids[i] * kPage1, e.b.data() + ids[i] * kPage1, kPage1) == 0);
  }
  CHECK(std::memcmp(dst.a.data() + 2 * kPage0, before_a.data() + 2 * kPage0, kPage0) == 0);
  // The SLOT spans of the shared allocations were not touched.
  CHECK(std::memcmp(dst.a.data() + kBlocks * kPage0, before_a.data() + kBlocks * kPage0,
                    kSlots * kSlot0) == 0);
  CHECK(std::memcmp(dst.b.data() + kBlocks * kPage1, before_b.data() + kBlocks * kPage1,
                    kSlots * kSlot1) == 0);
}

TEST_CASE("PAGE registration rejects what the reference rejects") {
  Engine e;
  auto regions = e.page();
  CHECK(PageCodec::create({}, kBlocks).status() == Code::kInvalidArgument);
  CHECK(PageCodec::create(regions, 0).status() == Code::kInvalidArgument);
  auto r = regions;
  r[0].reverse_indexed = true;
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);
  r = regions;
  r[1].unit_bytes = 0;
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);
  r = regions;
  r[1].base = nullptr;
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);
  r = regions;
  r[0].total_bytes = kBlocks * kPage0 - 1;  // total < count * unit
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);
  r = regions;
  r[1].role = "r0";
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);
  r = regions;
  r[1].base = r[0].base + 10;  // overlapping regions
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);
  r = regions;
  r[0].kind = tier::MemoryKind::kDevice;
  r[1].kind = tier::MemoryKind::kDevice;
  CHECK(PageCodec::create(r, kBlocks).status() == Code::kInvalidArgument);  // no device executor
}

TEST_CASE("PAGE calls are validated before any byte moves") {
  Engine e;
  fill(e.a, 3);
  auto snapshot = e.a;
  auto codec = PageCodec::create(e.page(), kBlocks);
  REQUIRE(codec.is_ok());
  const PageCodec& c = **codec;
  CHECK(c.describe(std::vector<std::uint32_t>{}).status() == Code::kInvalidArgument);
  CHECK(c.describe(std::vector<std::uint32_t>{4}).status() == Code::kInvalidArgument);
  CHECK(c.describe(std::vector<std::uint32_t>{1, 2, 1}).status() == Code::kInvalidArgument);
  std::vector<std::vector<std::uint32_t>> groups = {{0, 1}, {2, 1}};
  CHECK(c.describe_groups(groups).status() == Code::kInvalidArgument);  // repeated across groups

  auto good = c.describe(std::vector<std::uint32_t>{0, 1});
  REQUIRE(good.is_ok());
  std::vector<std::byte> image(2 * c.bytes_per_block());
  // Destination too small.
  std::vector<std::byte> small(image.size() - 1);
  CHECK(c.encode(*good, small).status() == Code::kInvalidArgument);
  // Externally built lists are re-validated: a span off a unit boundary, of the wrong size, from
  // another region, outside the region, or two regions naming different blocks.
  auto bad = *good;
  bad[0].data += 1;
  CHECK(c.encode(bad, image).status() == Code::kInvalidArgument);
  bad = *good;
  bad[1].size -= 1;
  CHECK(c.encode(bad, image).status() == Code::kInvalidArgument);
  bad = *good;
  std::swap(bad[0], bad[1]);
  CHECK(c.encode(bad, image).status() == Code::kInvalidArgument);
  bad = *good;
  bad[0].data = e.a.data() + kBlocks * kPage0;  // first SLOT byte: beyond the PAGE blocks
  CHECK(c.encode(bad, image).status() == Code::kInvalidArgument);
  bad = *good;
  bad[1] = (*good)[3];
  CHECK(c.encode(bad, image).status() == Code::kInvalidArgument);
  bad = *good;
  bad[2] = (*good)[0];
  bad[3] = (*good)[1];  // block 0 twice
  CHECK(c.decode(image, bad).code() == Code::kInvalidArgument);
  bad = *good;
  bad.pop_back();
  CHECK(c.encode(bad, image).status() == Code::kInvalidArgument);
  // A payload of the wrong size is not the image of these blocks.
  CHECK(c.decode(std::span(image).first(image.size() - 1), *good).code() ==
        Code::kChecksumMismatch);
  CHECK(e.a == snapshot);
  auto plan = c.plan(*good);
  REQUIRE(plan.is_ok());
  CHECK(plan->plan().spans.size() == 4);
  CHECK(plan->plan().image_bytes == image.size());
  CHECK(plan->blocks() == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE("SLOT codec frames one group as AOS1 and restores it into another group") {
  Engine e;
  fill(e.a, 11);
  fill(e.b, 12);
  auto slot = SlotCodec::create(e.slot(), kSlots, identity());
  REQUIRE(slot.is_ok());
  const SlotCodec& s = **slot;
  CHECK(s.slot_bytes() == kSlot0 + kSlot1);
  // Group g is reverse indexed: group 0 sits at the very top of each allocation.
  auto g0 = s.describe(0);
  REQUIRE(g0.is_ok());
  CHECK((*g0)[0].data == e.a.data() + e.a.size() - kSlot0);
  CHECK((*g0)[1].data == e.b.data() + e.b.size() - kSlot1);
  auto src = s.describe(2);
  REQUIRE(src.is_ok());
  const Boundary boundary{512, 0xfeedbeefull};
  const SlotBoundaryCodec codec = s.at(boundary);
  std::vector<std::byte> frame(*codec.encoded_size(*src));
  CHECK(frame.size() == kAos1HeaderBytes + kSlot0 + kSlot1);
  auto n = codec.encode(*src, frame);
  REQUIRE(n.is_ok());
  Aos1Decoded d = decode_aos1(frame, codec.expectations());
  REQUIRE(d.error == Aos1Error::kNone);
  CHECK(d.header.boundary_tokens == 512);
  CHECK(d.header.tp_rank == 1);
  CHECK(std::memcmp(frame.data() + kAos1HeaderBytes, (*src)[0].data, kSlot0) == 0);
  CHECK(std::memcmp(frame.data() + kAos1HeaderBytes + kSlot0, (*src)[1].data, kSlot1) == 0);

  // Restore into group 1; PAGE blocks and the other groups stay untouched.
  auto before_a = e.a, before_b = e.b;
  auto dst = s.describe(1);
  REQUIRE(dst.is_ok());
  REQUIRE(codec.decode(frame, *dst).is_ok());
  CHECK(std::memcmp((*dst)[0].data, (*src)[0].data, kSlot0) == 0);
  CHECK(std::memcmp((*dst)[1].data, (*src)[1].data, kSlot1) == 0);
  CHECK(std::memcmp(e.a.data(), before_a.data(), kBlocks * kPage0) == 0);
  CHECK(std::memcmp(e.b.data(), before_b.data(), kBlocks * kPage1) == 0);
  CHECK(std::memcmp((*g0)[0].data, before_a.data() + e.a.size() - kSlot0, kSlot0) == 0);

  // Another boundary's codec refuses the frame without writing.
  fill(e.a, 13);
  before_a = e.a;
  CHECK(s.at({512, 0xfeedbeeeull}).decode(frame, *dst).message() == "aos1 boundary_hash_mismatch");
  CHECK(s.at({511, 0xfeedbeefull}).decode(frame, *dst).message() ==
        "aos1 boundary_tokens_mismatch");
  CHECK(e.a == before_a);
}

TEST_CASE("SLOT registration and calls are validated") {
  Engine e;
  auto regions = e.slot();
  auto r = regions;
  r[0].reverse_indexed = false;  // SLOT must be reverse indexed
  CHECK(SlotCodec::create(r, kSlots, identity()).status() == Code::kInvalidArgument);
  SlotIdentity bad_tp = identity();
  bad_tp.tp_rank = 2;
  CHECK(SlotCodec::create(regions, kSlots, bad_tp).status() == Code::kInvalidArgument);
  auto slot = SlotCodec::create(regions, kSlots, identity());
  REQUIRE(slot.is_ok());
  CHECK((*slot)->describe(3).status() == Code::kInvalidArgument);
  auto g0 = (*slot)->describe(0);
  auto g1 = (*slot)->describe(1);
  REQUIRE(g0.is_ok());
  REQUIRE(g1.is_ok());
  std::vector<tier::Region> mixed = {(*g0)[0], (*g1)[1]};
  std::vector<std::byte> frame(kAos1HeaderBytes + kSlot0 + kSlot1);
  CHECK((*slot)->at({1, 1}).encode(mixed, frame).status() == Code::kInvalidArgument);
  CHECK((*slot)->at({0, 1}).encode(*g0, frame).status() == Code::kInvalidArgument);
  // PAGE spans are not SLOT spans, even inside the same allocation.
  Engine e2;
  auto page = PageCodec::create(e.page(), kBlocks);
  REQUIRE(page.is_ok());
  auto blocks = (*page)->describe(std::vector<std::uint32_t>{3});
  REQUIRE(blocks.is_ok());
  CHECK((*slot)->plan(*blocks).status() == Code::kInvalidArgument);
  CHECK((*page)->plan(*g0).status() == Code::kInvalidArgument);
}
