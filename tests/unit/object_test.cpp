#include "tier/object.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "support/test_util.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;

TEST_CASE("a sealed image verifies and parses back") {
  auto k = key_of(3, 9, 2);
  auto img = make_image(k, 1000);
  CHECK(verify_object(img, k).is_ok());
  auto h = parse_object_header(img);
  REQUIRE(h.is_ok());
  CHECK(h->key == k);
  CHECK(h->payload_bytes == 1000);
  CHECK(h->format_id == 1);
  CHECK(h->stage_id == 0);
}

TEST_CASE("every flipped byte is detected") {
  auto k = key_of(4);
  auto good = make_image(k, 300);
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x01};
    Status s = verify_object(bad, k);
    CHECK_MESSAGE(s.code() == Code::kChecksumMismatch, "byte " << i);
  }
}

TEST_CASE("wrong key, truncation and extra bytes are mismatches") {
  auto k = key_of(5);
  auto img = make_image(k, 256);
  CHECK(verify_object(img, key_of(6)).code() == Code::kChecksumMismatch);
  CHECK(verify_object(img, key_of(5, 1, 1)).code() == Code::kChecksumMismatch);  // other rank
  CHECK(verify_object(std::span(img).first(img.size() - 1), k).code() == Code::kChecksumMismatch);
  auto longer = img;
  longer.push_back(std::byte{0});
  CHECK(verify_object(longer, k).code() == Code::kChecksumMismatch);
  CHECK(verify_object(std::span(img).first(40), k).code() == Code::kChecksumMismatch);
}

TEST_CASE("copy_verified copies good images and never hands out bad ones") {
  for (std::size_t size : {10ul, 70'000ul, 600'000ul}) {
    auto k = key_of(size);
    auto img = make_image(k, size);
    std::vector<std::byte> dst(img.size() + 64);
    REQUIRE(copy_verified(dst, img, k).is_ok());
    CHECK(std::memcmp(dst.data(), img.data(), img.size()) == 0);

    auto bad = img;
    bad[kObjectHeaderBytes + size / 2] ^= std::byte{0x80};
    std::vector<std::byte> out(img.size());
    CHECK(copy_verified(out, bad, k).code() == Code::kChecksumMismatch);
    CHECK_FALSE(parse_object_header(out).is_ok());  // no valid header left behind
    std::vector<std::byte> small(img.size() - 1);
    CHECK(copy_verified(small, img, k).code() == Code::kInvalidArgument);
    CHECK(copy_verified(out, img, key_of(size + 1)).code() == Code::kChecksumMismatch);
  }
}

TEST_CASE("scrub makes an image unparseable") {
  auto k = key_of(8);
  auto img = make_image(k, 64);
  scrub_object(img);
  CHECK(parse_object_header(img).status().code() == Code::kChecksumMismatch);
}

// ---- Version 2 (chunked payload checksum) and version 1, against docs/object-format.md ----

namespace {

std::vector<std::byte> from_hex(std::string_view hex) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i < hex.size();) {
    if (hex[i] == ' ' || hex[i] == '\n') {
      ++i;
      continue;
    }
    out.push_back(static_cast<std::byte>(std::stoul(std::string(hex.substr(i, 2)), nullptr, 16)));
    i += 2;
  }
  return out;
}

// The golden vectors' objects, written by this implementation.
std::vector<std::byte> sealed(std::span<const std::byte> payload, std::uint32_t layout,
                              std::uint32_t stage, const ObjectKey& key, std::uint16_t version) {
  std::vector<std::byte> img(kObjectHeaderBytes + payload.size());
  if (!payload.empty())  // memcpy's source must not be null, even for 0 bytes
    std::memcpy(img.data() + kObjectHeaderBytes, payload.data(), payload.size());
  seal_object(img, layout, stage, key, version);
  return img;
}

std::vector<std::byte> ascii(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()),
          reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

// Vector D's payload: byte i = ((i * 2654435761) mod 2^32) >> 24.
std::vector<std::byte> vector_d_payload() {
  std::vector<std::byte> p(2 * kChecksumChunkBytes + 100);
  for (std::size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<std::byte>(static_cast<std::uint32_t>(i * 2654435761u) >> 24);
  return p;
}

const ObjectKey kKeyA{Key128{1, 2}, Key128{3, 4}, 5};
const ObjectKey kKeyB{Key128{0x1111111111111111, 0x2222222222222222},
                      Key128{0x3333333333333333, 0x4444444444444444}, 7};

// The ways a stored image is read back verified: verify_object, copy_verified (with either
// stores), and verify_payload over the image cut into pieces at `cut` (a chunk across two pieces).
Status every_reader(std::span<const std::byte> img, const ObjectKey& k, std::size_t cut) {
  Status v = verify_object(img, k);
  for (Stores stores : {Stores::kCached, Stores::kStreamed}) {
    std::vector<std::byte> out(img.size());
    Status c = copy_verified(out, img, k, stores);
    if (c) {
      CHECK(std::memcmp(out.data(), img.data(), img.size()) == 0);
    } else {
      CHECK_FALSE(parse_object_header(out).is_ok());
    }
    CHECK(v.code() == c.code());
  }
  Status p = Status(Code::kChecksumMismatch, "header");
  if (auto h = parse_object_header(img); h && h->key == k) {
    cut = std::min(cut, img.size());
    const std::span<const std::byte> pieces[] = {img.first(cut), img.subspan(cut)};
    p = verify_payload(pieces, *h);
  }
  CHECK(v.code() == p.code());
  return v;
}

}  // namespace

TEST_CASE("golden vectors: the implementation writes and reads exactly docs/object-format.md") {
  const auto a = from_hex(R"(
    4c 54 4f 31 02 00 60 00 01 00 00 00 00 00 00 00
    01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00
    03 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00
    05 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    c2 94 d3 38 05 80 06 2d 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 5b d2 0b 9b 3f 69 99 ad)");
  CHECK(sealed({}, 1, 0, kKeyA, 2) == a);
  CHECK(payload_checksum(std::span<const std::byte>{}) == 0x2d06800538d394c2ull);
  CHECK(every_reader(a, kKeyA, 50).is_ok());

  const auto b = from_hex(R"(
    4c 54 4f 31 02 00 60 00 01 00 00 00 00 00 00 00
    11 11 11 11 11 11 11 11 22 22 22 22 22 22 22 22
    33 33 33 33 33 33 33 33 44 44 44 44 44 44 44 44
    07 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00
    c3 7e 5f 82 c4 1a 3f d0 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 f2 f0 47 17 7a 96 6b 57
    6c 69 62 74 69 65 72)");
  CHECK(sealed(ascii("libtier"), 1, 0, kKeyB, 2) == b);
  CHECK(sealed(ascii("libtier"), 1, 0, kKeyB, kObjectVersion) == b);  // writers emit version 2
  const std::uint64_t c0 = 0xd2c4091d5ac53178ull;
  CHECK(chunk_list_checksum(std::span(&c0, 1)) == 0xd03f1ac4825f7ec3ull);
  CHECK(every_reader(b, kKeyB, 100).is_ok());

  const auto c = from_hex(R"(
    4c 54 4f 31 01 00 60 00 01 00 00 00 00 00 00 00
    11 11 11 11 11 11 11 11 22 22 22 22 22 22 22 22
    33 33 33 33 33 33 33 33 44 44 44 44 44 44 44 44
    07 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00
    78 31 c5 5a 1d 09 c4 d2 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 be cb b4 bc b0 2e 95 90
    6c 69 62 74 69 65 72)");
  CHECK(sealed(ascii("libtier"), 1, 0, kKeyB, 1) == c);
  CHECK(every_reader(c, kKeyB, 97).is_ok());
  auto hc = parse_object_header(c);
  REQUIRE(hc);
  CHECK(hc->version == 1);
  CHECK(hc->payload_checksum == c0);

  const auto d_header = from_hex(R"(
    4c 54 4f 31 02 00 60 00 01 00 00 00 02 00 00 00
    01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00
    03 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 64 00 02 00 00 00 00 00
    95 24 15 6f 89 37 63 cd 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 8c d1 21 47 4c f6 7e e7)");
  const ObjectKey kd{Key128{1, 2}, Key128{3, 4}, 0};
  const auto payload = vector_d_payload();
  const auto d = sealed(payload, 1, 2, kd, 2);
  CHECK(std::equal(d_header.begin(), d_header.end(), d.begin()));
  CHECK(checksum_chunk_count(payload.size()) == 3);
  const std::uint64_t chunks[] = {0x20605b76ceddc43bull, 0xe830a264c3d30f39ull,
                                  0xe1a7d09e9e549603ull};
  CHECK(chunk_list_checksum(chunks) == 0xcd6337896f152495ull);
  CHECK(payload_checksum(payload) == 0xcd6337896f152495ull);
  CHECK(every_reader(d, kd, kObjectHeaderBytes + kChecksumChunkBytes - 7).is_ok());
}

TEST_CASE("version 2: a flipped byte in any chunk, the checksum or the header fails") {
  const ObjectKey k = key_of(77);
  const std::size_t payload = 3 * kChecksumChunkBytes + 1234;  // four chunks, the last partial
  const auto good = make_image(k, payload, 3);
  REQUIRE(parse_object_header(good)->version == 2);
  REQUIRE(every_reader(good, k, 4096).is_ok());
  const std::size_t last = kObjectHeaderBytes + 3 * kChecksumChunkBytes;
  const std::size_t offsets[] = {
      kObjectHeaderBytes,                            // chunk 0, first byte
      kObjectHeaderBytes + 1000,                     // chunk 0
      kObjectHeaderBytes + kChecksumChunkBytes - 1,  // chunk 0, last byte
      last,                                          // the last (partial) chunk, first byte
      good.size() - 1,                               // the last byte of the image
      64,
      67,
      71,  // the payload checksum (the chunk list's)
      4,   // the version
      56,  // the payload length
      20,
      88,  // the key; the header checksum
  };
  for (std::size_t off : offsets) {
    CAPTURE(off);
    auto bad = good;
    bad[off] ^= std::byte{0x04};
    CHECK(every_reader(bad, k, last - 5).code() == Code::kChecksumMismatch);
  }
  // Two chunks swapped: every chunk hashes as before, the list's order does not.
  auto swapped = good;
  std::swap_ranges(swapped.begin() + kObjectHeaderBytes,
                   swapped.begin() + kObjectHeaderBytes + kChecksumChunkBytes,
                   swapped.begin() + kObjectHeaderBytes + kChecksumChunkBytes);
  CHECK(every_reader(swapped, k, 0).code() == Code::kChecksumMismatch);
}

TEST_CASE("version 1 images are still read and verified as before") {
  for (std::size_t size : {0ul, 300ul, 70'000ul, 600'000ul}) {
    CAPTURE(size);
    const ObjectKey k = key_of(size + 5);
    auto img = make_image(k, size, 1);
    seal_object(img, 1, 0, k, kObjectVersionWholePayload);
    auto h = parse_object_header(img);
    REQUIRE(h);
    CHECK(h->version == 1);
    CHECK(h->payload_checksum ==
          payload_checksum(std::span(img).subspan(kObjectHeaderBytes), kObjectVersionWholePayload));
    CHECK(every_reader(img, k, 7000).is_ok());
    if (size == 0) continue;
    auto bad = img;
    bad[kObjectHeaderBytes + size - 1] ^= std::byte{0x20};
    CHECK(every_reader(bad, k, 7000).code() == Code::kChecksumMismatch);
  }
}

TEST_CASE("every thread count gives the same checksums and verdicts") {
  const ObjectKey k = key_of(91);
  // Large enough for several rounds of 512 chunks (32 MiB each), with a partial last chunk.
  const std::size_t payload = 33u * 1024 * 1024 + 17;
  auto img = make_image(k, 100, 0);
  img.resize(kObjectHeaderBytes + payload);
  for (std::size_t i = 0; i < payload; i += 4096) img[kObjectHeaderBytes + i] = std::byte(i >> 12);
  const unsigned before = verify_threads();
  std::uint64_t first = 0;
  for (unsigned t : {1u, 2u, 3u, 8u}) {
    CAPTURE(t);
    set_verify_threads(t);
    CHECK(verify_threads() == t);
    seal_object(img, 1, 0, k);
    auto h = parse_object_header(img);
    REQUIRE(h);
    if (first == 0) first = h->payload_checksum;
    CHECK(h->payload_checksum == first);
    CHECK(every_reader(img, k, kObjectHeaderBytes + 32u * 1024 * 1024 + 3).is_ok());
    auto bad = img;
    bad[bad.size() - 2] ^= std::byte{1};
    CHECK(every_reader(bad, k, 1000).code() == Code::kChecksumMismatch);
  }
  set_verify_threads(before);
}

TEST_CASE("verify_payload: pieces that do not add up to the header's length are a mismatch") {
  const ObjectKey k = key_of(92);
  const auto img = make_image(k, 5000);
  auto h = parse_object_header(img);
  REQUIRE(h);
  const std::span<const std::byte> short_pieces[] = {std::span(img).first(img.size() - 1)};
  CHECK(verify_payload(short_pieces, *h).code() == Code::kChecksumMismatch);
  // Many small pieces, some empty.
  std::vector<std::span<const std::byte>> many;
  for (std::size_t off = 0; off < img.size(); off += 333) {
    many.push_back(std::span(img).subspan(off, std::min<std::size_t>(333, img.size() - off)));
    many.push_back({});
  }
  CHECK(verify_payload(many, *h).is_ok());
}

TEST_CASE("payload_checksum of regions equals the checksum of their concatenation") {
  constexpr std::size_t kChunk = kChecksumChunkBytes;
  // A payload of 5 chunks and a partial one, with bytes that differ from chunk to chunk.
  std::vector<std::byte> payload(5 * kChunk + 1234);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte((i * 131 + i / 7) & 0xff);
  const std::uint64_t whole_v1 = payload_checksum(payload, kObjectVersionWholePayload);
  const std::uint64_t whole_v2 = payload_checksum(payload, 2);
  // Region boundaries: inside chunks, exactly on chunk boundaries, regions shorter than a chunk,
  // empty regions, and a region of several chunks that starts inside one.
  const std::vector<std::vector<std::size_t>> cuts = {
      {},
      {kChunk},
      {kChunk, 2 * kChunk, 3 * kChunk, 4 * kChunk, 5 * kChunk},
      {1},
      {kChunk - 1, kChunk + 1},
      {100, 200, 300, kChunk, kChunk, 3 * kChunk + 5},
      {kChunk / 2, kChunk / 2 + 3 * kChunk},
      {5 * kChunk, 5 * kChunk + 1233},
  };
  const unsigned before = verify_threads();
  for (unsigned t : {1u, 3u}) {
    set_verify_threads(t);
    for (const auto& c : cuts) {
      std::vector<Region> regions;
      std::size_t from = 0;
      for (std::size_t at : c) {
        regions.push_back(host_region(std::span(payload).subspan(from, at - from)));
        from = at;
      }
      regions.push_back(host_region(std::span(payload).subspan(from)));
      CAPTURE(t);
      CAPTURE(regions.size());
      CHECK(payload_checksum(regions, 2) == whole_v2);
      CHECK(payload_checksum(regions) == whole_v2);
      CHECK(payload_checksum(regions, kObjectVersionWholePayload) == whole_v1);
    }
  }
  set_verify_threads(before);
  // A payload shorter than a chunk, and an empty one.
  std::vector<std::byte> small(100, std::byte{7});
  const Region halves[] = {host_region(std::span(small).first(40)),
                           host_region(std::span(small).subspan(40))};
  CHECK(payload_checksum(halves) == payload_checksum(small));
  CHECK(payload_checksum(RegionList{}) == payload_checksum(std::span<const std::byte>{}));
}

TEST_CASE("scatter_verified checks everything before it writes a byte") {
  const std::size_t size = 70'000;
  auto k = key_of(21);
  auto img = make_image(k, size);
  // The stored image in three pieces, the first shorter than a header.
  const std::span<std::byte> pieces[] = {
      std::span(img).first(40), std::span(img).subspan(40, 30'000), std::span(img).subspan(30'040)};
  auto expect = [&](std::uint32_t layout, std::uint64_t bytes) {
    std::vector<std::byte> h(kObjectHeaderBytes);
    write_object_header(h, ObjectHeader{layout, 0, k, bytes, 0});
    return h;
  };
  std::vector<std::byte> a(1000, std::byte{0xEE}), b(size - 1000, std::byte{0xEE});
  const Region dst[] = {host_region(a), host_region(b)};
  auto untouched = [&] {
    return a == std::vector<std::byte>(a.size(), std::byte{0xEE}) &&
           b == std::vector<std::byte>(b.size(), std::byte{0xEE});
  };

  auto bad = img;
  bad[kObjectHeaderBytes + size - 1] ^= std::byte{0x01};
  const std::span<std::byte> bad_pieces[] = {std::span(bad)};
  auto head = expect(1, size);
  CHECK(scatter_verified(bad_pieces, head, dst, k).code() == Code::kChecksumMismatch);
  CHECK(untouched());
  CHECK(scatter_verified(pieces, head, dst, key_of(22)).code() == Code::kChecksumMismatch);
  CHECK(untouched());
  auto other_layout = expect(7, size);
  CHECK(scatter_verified(pieces, other_layout, dst, k).code() == Code::kInvalidArgument);
  CHECK(untouched());
  CHECK(scatter_verified(pieces, head, std::span(dst).first(1), k).code() ==
        Code::kInvalidArgument);
  CHECK(untouched());
  std::vector<std::byte> no_header(kObjectHeaderBytes);
  CHECK(scatter_verified(pieces, no_header, dst, k).code() == Code::kInvalidArgument);
  CHECK(untouched());

  REQUIRE(scatter_verified(pieces, head, dst, k).is_ok());
  CHECK(std::memcmp(head.data(), img.data(), kObjectHeaderBytes) == 0);
  CHECK(std::memcmp(a.data(), img.data() + kObjectHeaderBytes, a.size()) == 0);
  CHECK(std::memcmp(b.data(), img.data() + kObjectHeaderBytes + a.size(), b.size()) == 0);
}

// A codec's framing (Codec::direct): `skip` payload bytes go nowhere, and the check sees the whole
// stored payload, in its pieces, before anything is written.
TEST_CASE("scatter_verified skips the framing and runs the caller's check first") {
  const std::size_t size = 70'000, skip = 128;
  auto k = key_of(23);
  auto img = make_image(k, size);
  const std::span<std::byte> pieces[] = {std::span(img).first(100), std::span(img).subspan(100)};
  std::vector<std::byte> head(kObjectHeaderBytes);
  write_object_header(head, ObjectHeader{1, 0, k, size, 0});
  struct Check final : PayloadCheck {
    mutable std::size_t seen = 0;
    mutable std::byte first{};
    bool refuse = false;
    Status check(std::span<const std::span<std::byte>> payload) const noexcept override {
      seen = 0;
      for (const auto& p : payload) seen += p.size();
      first = payload.front().front();
      return refuse ? Status(Code::kChecksumMismatch, "frame refused") : Status::ok();
    }
  } check;
  std::vector<std::byte> a(size - skip, std::byte{0xEE});
  const Region dst[] = {host_region(a)};
  check.refuse = true;
  CHECK(scatter_verified(pieces, head, dst, k, skip, &check).code() == Code::kChecksumMismatch);
  CHECK(check.seen == size);
  CHECK(check.first == img[kObjectHeaderBytes]);
  CHECK(a == std::vector<std::byte>(a.size(), std::byte{0xEE}));
  // Without the framing the sizes do not add up.
  CHECK(scatter_verified(pieces, head, dst, k, 0, nullptr).code() == Code::kInvalidArgument);
  check.refuse = false;
  REQUIRE(scatter_verified(pieces, head, dst, k, skip, &check).is_ok());
  CHECK(std::memcmp(a.data(), img.data() + kObjectHeaderBytes + skip, a.size()) == 0);
}

TEST_CASE("scatter_verified: version 1 images, and version 2 chunks across stored pieces") {
  const ObjectKey k = key_of(23);
  const std::size_t size = 3 * kChecksumChunkBytes + 999;
  for (std::uint16_t version : {kObjectVersionWholePayload, kObjectVersion}) {
    CAPTURE(version);
    auto img = make_image(k, size);
    seal_object(img, 1, 0, k, version);
    // Stored pieces cut inside the header, inside chunks and on a chunk boundary.
    const std::span<std::byte> pieces[] = {
        std::span(img).first(50), std::span(img).subspan(50, kChecksumChunkBytes),
        std::span(img).subspan(50 + kChecksumChunkBytes, kChecksumChunkBytes + 46),
        std::span(img).subspan(96 + 2 * kChecksumChunkBytes)};
    std::vector<std::byte> head(kObjectHeaderBytes);
    write_object_header(head, ObjectHeader{1, 0, k, size, 0});
    std::vector<std::byte> a(kChecksumChunkBytes + 7), b(size - a.size());
    const Region dst[] = {host_region(a), host_region(b)};
    REQUIRE(scatter_verified(pieces, head, dst, k).is_ok());
    CHECK(std::memcmp(head.data(), img.data(), kObjectHeaderBytes) == 0);
    CHECK(std::memcmp(a.data(), img.data() + kObjectHeaderBytes, a.size()) == 0);
    CHECK(std::memcmp(b.data(), img.data() + kObjectHeaderBytes + a.size(), b.size()) == 0);
    // A flipped byte in the third chunk: nothing is written.
    img[kObjectHeaderBytes + 2 * kChecksumChunkBytes + 5] ^= std::byte{1};
    std::fill(a.begin(), a.end(), std::byte{0x5A});
    write_object_header(head, ObjectHeader{1, 0, k, size, 0});
    const auto expected_head = head;
    CHECK(scatter_verified(pieces, head, dst, k).code() == Code::kChecksumMismatch);
    CHECK(head == expected_head);
    CHECK(a == std::vector<std::byte>(a.size(), std::byte{0x5A}));
  }
}

// A payload of several chunks is copied on the verification threads, window by window of chunk
// positions: every byte lands in its region whatever the cuts of the pieces and regions, the
// framing included, with either stores; a flipped byte leaves every region as it was.
TEST_CASE("scatter_verified: a payload of many chunks across windows, pieces and regions") {
  const unsigned before = verify_threads();
  set_verify_threads(4);
  const ObjectKey k = key_of(24);
  // Two windows of chunks on the verification threads, and a payload of one chunk and a bit that
  // the caller copies alone (below the pool's threshold).
  for (std::size_t size : {520 * kChecksumChunkBytes + 123, kChecksumChunkBytes + 5000})
    for (Stores stores : {Stores::kCached, Stores::kStreamed}) {
      CAPTURE(size);
      CAPTURE(static_cast<int>(stores));
      const std::size_t skip = kChecksumChunkBytes + 17;
      auto img = make_image(k, size);
      std::vector<std::span<std::byte>> pieces;
      for (std::size_t at = 0, cut = 61; at < img.size(); at += cut, cut = cut * 7 % 1'000'003 + 1)
        pieces.push_back(std::span(img).subspan(at, std::min(cut, img.size() - at)));
      std::vector<std::vector<std::byte>> bufs;
      for (std::size_t left = size - skip, n = 3; left > 0; n = n * 13 % 300'007) {
        bufs.emplace_back(std::min(n, left), std::byte{0xEE});
        left -= bufs.back().size();
        bufs.emplace_back();  // an empty region between every two
      }
      std::vector<Region> dst;
      for (auto& b : bufs) dst.push_back(host_region(b));
      std::vector<std::byte> head(kObjectHeaderBytes);
      write_object_header(head, ObjectHeader{1, 0, k, size, 0});
      const auto expected_head = head;
      auto bad = img;
      bad[kObjectHeaderBytes + size - 1] ^= std::byte{1};
      const std::span<std::byte> bad_pieces[] = {std::span(bad)};
      CHECK(scatter_verified(bad_pieces, head, dst, k, skip, nullptr, stores).code() ==
            Code::kChecksumMismatch);
      CHECK(head == expected_head);
      CHECK(std::all_of(bufs.begin(), bufs.end(), [](const std::vector<std::byte>& b) {
        return std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0xEE}; });
      }));
      REQUIRE(scatter_verified(pieces, head, dst, k, skip, nullptr, stores).is_ok());
      CHECK(std::memcmp(head.data(), img.data(), kObjectHeaderBytes) == 0);
      std::size_t at = kObjectHeaderBytes + skip;
      for (const auto& b : bufs) {
        if (b.empty()) continue;  // an empty vector's data() may be null, which memcmp must not see
        CHECK(std::memcmp(b.data(), img.data() + at, b.size()) == 0);
        at += b.size();
      }
      CHECK(at == img.size());
    }
  set_verify_threads(before);
}

// seal_into, the tier's side of a sealed gather put: byte for byte the image seal_object makes,
// whatever the payload's regions, the storage's pieces, the size (short, one chunk and a bit on
// the caller, many chunks on the verification threads, streamed stores), the stores asked for
// and the version.
TEST_CASE("seal_into writes the image seal_object makes, from regions into pieces") {
  const unsigned before = verify_threads();
  set_verify_threads(4);
  const ObjectKey k = key_of(25);
  for (std::uint16_t version : {kObjectVersion, kObjectVersionWholePayload}) {
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{240}, std::size_t{241},
                             kChecksumChunkBytes, kChecksumChunkBytes + 5000,
                             5 * kChecksumChunkBytes + 123, 520 * kChecksumChunkBytes + 7}) {
      for (auto [scattered, stores] :
           {std::pair{false, Stores::kCached}, std::pair{true, Stores::kCached},
            std::pair{true, Stores::kStreamed}}) {
        CAPTURE(version);
        CAPTURE(size);
        CAPTURE(scattered);
        CAPTURE(static_cast<int>(stores));
        auto want = make_image(k, size);
        if (version != kObjectVersion) seal_object(want, 1, 0, k, version);
        std::vector<Region> src;  // the payload as one region, or as odd ones with empty ones
        if (!scattered) {
          src.push_back(Region{want.data() + kObjectHeaderBytes, size, MemoryKind::kHost, -1});
        } else {
          for (std::size_t at = 0, n = 3; at < size; n = n * 13 % 300'007 + 1) {
            const std::size_t take = std::min(n, size - at);
            src.push_back(
                Region{want.data() + kObjectHeaderBytes + at, take, MemoryKind::kHost, -1});
            src.push_back(Region{nullptr, 0, MemoryKind::kHost, -1});
            at += take;
          }
        }
        std::vector<std::byte> out(want.size(), std::byte{0xEE});
        std::vector<std::span<std::byte>> pieces;
        if (!scattered) {
          pieces.push_back(std::span(out));
        } else {
          for (std::size_t at = 0, cut = 61; at < out.size();
               at += cut, cut = cut * 7 % 1'000'003 + 1)
            pieces.push_back(std::span(out).subspan(at, std::min(cut, out.size() - at)));
        }
        std::vector<std::byte> head(kObjectHeaderBytes);  // its payload checksum is not read
        write_object_header(head, ObjectHeader{1, 0, k, size, 0xBAD, version});
        REQUIRE(seal_into(pieces, head, src, stores).is_ok());
        CHECK(out == want);
        CHECK(verify_object(out, k).is_ok());
      }
    }
  }
  set_verify_threads(before);
}

TEST_CASE("seal_into refuses headers and sizes that do not describe the image") {
  const ObjectKey k = key_of(26);
  auto payload = tier::test::random_bytes(1000, 7);
  const Region src[] = {
      Region{reinterpret_cast<std::byte*>(payload.data()), payload.size(), MemoryKind::kHost, -1}};
  std::vector<std::byte> out(kObjectHeaderBytes + payload.size());
  const std::span<std::byte> pieces[] = {std::span(out)};
  std::vector<std::byte> head(kObjectHeaderBytes);
  write_object_header(head, ObjectHeader{1, 0, k, payload.size(), 0});
  CHECK(seal_into(pieces, std::span(head).first(95), src).code() == Code::kInvalidArgument);
  std::vector<std::byte> other(kObjectHeaderBytes);  // declares another payload size
  write_object_header(other, ObjectHeader{1, 0, k, payload.size() + 1, 0});
  CHECK(seal_into(pieces, other, src).code() == Code::kInvalidArgument);
  auto garbage = head;
  garbage[20] ^= std::byte{1};  // the header checksum no longer matches
  CHECK(seal_into(pieces, garbage, src).code() == Code::kInvalidArgument);
  const std::span<std::byte> short_pieces[] = {std::span(out).first(out.size() - 1)};
  CHECK(seal_into(short_pieces, head, src).code() == Code::kInvalidArgument);
  REQUIRE(seal_into(pieces, head, src).is_ok());
  CHECK(verify_object(out, k).is_ok());
}

// Verification on a thread that shares the host with other processes (the shm tier's gets) takes
// its share of the CPUs: with as many processes as CPUs, the caller alone.
TEST_CASE("VerifyCpuShare: a thread's verification keeps to its share of the CPUs") {
  if (std::thread::hardware_concurrency() < 2) return;  // one CPU: the caller is alone anyway
  const unsigned before = verify_threads();
  set_verify_threads(2);  // the caller and one worker
  auto run = tier::test::verify_threads_seen;
  CHECK(run() == 2);  // no share: the worker takes chunks too
  {
    VerifyCpuShare share(256);
    CHECK(run() == 1);
    {
      VerifyCpuShare inner(1);  // the innermost holds
      CHECK(run() == 2);
    }
    CHECK(run() == 1);
  }
  CHECK(run() == 2);
  set_verify_threads(before);
}

// The tiers' copy: every size around the streaming thresholds (Stores), every alignment of either
// side, with either stores.
TEST_CASE("copy_bytes copies exactly the bytes asked, whatever the size, alignment and stores") {
  std::vector<std::byte> src(600 * 1024 + 64), dst(src.size() + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + (i >> 9));
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{127}, std::size_t{4095}, std::size_t{4096},
        std::size_t{4096 + 33}, std::size_t{65536 + 7}, std::size_t{256 * 1024 - 1},
        std::size_t{256 * 1024}, std::size_t{256 * 1024 + 129}, std::size_t{600 * 1024}}) {
    for (std::size_t so : {0, 1, 31}) {
      for (std::size_t d : {0, 5, 32}) {
        for (Stores stores : {Stores::kCached, Stores::kStreamed}) {
          CAPTURE(n);
          CAPTURE(so);
          CAPTURE(d);
          CAPTURE(static_cast<int>(stores));
          std::fill(dst.begin(), dst.end(), std::byte{0xee});
          copy_bytes(dst.data() + d, src.data() + so, n, stores);
          CHECK(std::equal(src.begin() + so, src.begin() + so + n, dst.begin() + d));
          CHECK(std::all_of(dst.begin(), dst.begin() + d,
                            [](std::byte b) { return b == std::byte{0xee}; }));
          CHECK(std::all_of(dst.begin() + d + n, dst.end(),
                            [](std::byte b) { return b == std::byte{0xee}; }));
        }
      }
    }
  }
}

// A batch streams from a quarter of the last-level cache on, a cache taken as 1 MiB to 1 GiB
// whatever sysfs says: below 256 KiB never, from 256 MiB always, and once streamed, streamed for
// every larger batch.
TEST_CASE("stores_for_batch: small batches cached, large ones streamed") {
  CHECK(stores_for_batch(0) == Stores::kCached);
  CHECK(stores_for_batch(256 * 1024 - 1) == Stores::kCached);
  CHECK(stores_for_batch(std::uint64_t{256} << 20) == Stores::kStreamed);
  CHECK(stores_for_batch(UINT64_MAX) == Stores::kStreamed);
  std::uint64_t from = 256 * 1024;
  while (stores_for_batch(from) == Stores::kCached) from *= 2;
  for (std::uint64_t n = from; n < (std::uint64_t{1} << 30); n += n / 3)
    CHECK(stores_for_batch(n) == Stores::kStreamed);
}
