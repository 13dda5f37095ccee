// The AOS1 sidecar frame: byte layout, CRC-32 as zlib computes it, and every decode failure in
// the reference's fail-closed order.
#include <doctest/doctest.h>

#include <zlib.h>

#include <cstring>
#include <vector>

#include "tier/dsv4/aos1.hpp"

using namespace tier::dsv4;

namespace {

Fingerprint fp(std::uint8_t seed) {
  Fingerprint f;
  for (std::size_t i = 0; i < 16; ++i) f[i] = static_cast<std::byte>(seed + i);
  return f;
}

Aos1Expect expect() { return Aos1Expect{8192, 0x0123456789abcdefull, 100, fp(3), 4, 1}; }

std::vector<std::byte> frame() {
  std::vector<std::byte> f(kAos1HeaderBytes + 100);
  for (std::size_t i = 0; i < 100; ++i) f[kAos1HeaderBytes + i] = static_cast<std::byte>(i * 7);
  Aos1Header h;
  h.boundary_tokens = 8192;
  h.boundary_block_hash = 0x0123456789abcdefull;
  h.fingerprint = fp(3);
  h.tp_size = 4;
  h.tp_rank = 1;
  REQUIRE(finalize_aos1(f, h) == Aos1Error::kNone);
  return f;
}

std::uint64_t le(const std::vector<std::byte>& f, std::size_t off, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::to_integer<std::uint64_t>(f[off + i]) << (8 * i);
  return v;
}

Aos1Error decode(const std::vector<std::byte>& f, const Aos1Expect& x = expect()) {
  return decode_aos1(f, x).error;
}

}  // namespace

TEST_CASE("format constants are fixed: AOS1, version 1, 128 bytes") {
  CHECK(kAos1HeaderBytes == 128);
  CHECK(kAos1Version == 1);
}

TEST_CASE("the header is little-endian, unaligned and zero padded, byte for byte") {
  auto f = frame();
  CHECK(std::memcmp(f.data(), "AOS1", 4) == 0);
  CHECK(le(f, 4, 4) == 1);
  CHECK(le(f, 8, 4) == 0);
  CHECK(le(f, 12, 8) == 8192);
  CHECK(le(f, 20, 8) == 0x0123456789abcdefull);
  CHECK(le(f, 28, 8) == 100);
  uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(f.data() + 128), 100);
  CHECK(le(f, 36, 4) == crc);
  CHECK(f[40] == std::byte{3});
  CHECK(f[55] == std::byte{18});
  CHECK(le(f, 56, 4) == 4);
  CHECK(le(f, 60, 4) == 1);
  for (std::size_t i = 64; i < 128; ++i) CHECK(f[i] == std::byte{0});
  Aos1Decoded d = decode_aos1(f, expect());
  REQUIRE(d.error == Aos1Error::kNone);
  CHECK(d.payload.data() == f.data() + 128);  // zero-copy view
  CHECK(d.payload.size() == 100);
}

TEST_CASE("CRC-32 is zlib's") {
  const char text[] = "123456789";
  CHECK(crc32_of(std::as_bytes(std::span(text, 9))) == 0xCBF43926u);
  CHECK(crc32_of({}) == 0);
}

TEST_CASE("CRC-32 of large inputs, in pieces on the verification threads, is zlib's") {
  for (std::size_t n : {std::size_t{2} << 20, (std::size_t{2} << 20) + 3, std::size_t{26782720}}) {
    CAPTURE(n);
    std::vector<std::byte> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
    const uLong want = crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), n);
    CHECK(crc32_of(data) == static_cast<std::uint32_t>(want));
  }
}

TEST_CASE("CRC-32 of every length and alignment is zlib's") {
  std::vector<std::byte> data(4096 + 64);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 40503u) >> 7);
  for (std::size_t off : {0, 1, 7, 15}) {
    for (std::size_t n = 0; n <= 1100; n += (n < 300 ? 1 : 37)) {
      CAPTURE(off);
      CAPTURE(n);
      const uLong want =
          crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data() + off), n);
      CHECK(crc32_of(std::span(data).subspan(off, n)) == static_cast<std::uint32_t>(want));
    }
  }
  std::vector<std::byte> ones(777, std::byte{0xff}), zeros(777);
  for (auto* v : {&ones, &zeros})
    CHECK(crc32_of(*v) ==
          static_cast<std::uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0),
                                             reinterpret_cast<const Bytef*>(v->data()), v->size())));
}

TEST_CASE("a frame held in pieces is checked like the contiguous frame") {
  auto f = frame();
  // Cuts inside the header, on its end and inside the payload.
  for (std::size_t cut : {std::size_t{1}, std::size_t{40}, kAos1HeaderBytes, kAos1HeaderBytes + 1,
                          f.size() - 1}) {
    CAPTURE(cut);
    std::span<std::byte> pieces[] = {std::span(f).first(cut), std::span(f).subspan(cut)};
    Aos1Header h;
    CHECK(check_aos1(pieces, expect(), h) == Aos1Error::kNone);
    CHECK(h.payload_bytes == 100);
    auto bad = f;
    bad[f.size() - 2] ^= std::byte{1};
    std::span<std::byte> bad_pieces[] = {std::span(bad).first(cut), std::span(bad).subspan(cut)};
    CHECK(check_aos1(bad_pieces, expect(), h) == Aos1Error::kCrc);
    auto x = expect();
    x.tp_rank = 2;
    CHECK(check_aos1(pieces, x, h) == Aos1Error::kTpGeometry);
  }
  std::span<std::byte> short_pieces[] = {std::span(f).first(64), std::span(f).subspan(64, 60)};
  Aos1Header h;
  CHECK(check_aos1(short_pieces, expect(), h) == Aos1Error::kTruncated);
}

TEST_CASE("each header field is checked") {
  auto base = frame();
  auto mutate = [&](std::size_t off, std::uint8_t x) {
    auto f = base;
    f[off] ^= std::byte{x};
    return f;
  };
  CHECK(decode(mutate(0, 1)) == Aos1Error::kBadMagic);
  CHECK(decode(mutate(4, 2)) == Aos1Error::kBadVersion);
  CHECK(decode(mutate(8, 1)) == Aos1Error::kBadFlags);
  CHECK(decode(mutate(64, 1)) == Aos1Error::kReservedNonZero);
  CHECK(decode(mutate(127, 0x80)) == Aos1Error::kReservedNonZero);
  CHECK(decode(mutate(12, 1)) == Aos1Error::kBoundaryTokens);
  CHECK(decode(mutate(20, 1)) == Aos1Error::kBoundaryHash);
  CHECK(decode(mutate(28, 1)) == Aos1Error::kPayloadBytes);
  CHECK(decode(mutate(36, 1)) == Aos1Error::kCrc);
  CHECK(decode(mutate(45, 1)) == Aos1Error::kFingerprint);
  CHECK(decode(mutate(56, 1)) == Aos1Error::kTpGeometry);
  CHECK(decode(mutate(60, 1)) == Aos1Error::kTpGeometry);
  CHECK(decode(mutate(128 + 50, 1)) == Aos1Error::kCrc);
  // Zero boundary or payload in the header are never valid, even if expected.
  auto zero_tokens = base;
  std::memset(zero_tokens.data() + 12, 0, 8);
  CHECK(decode(zero_tokens) == Aos1Error::kBoundaryTokens);
}

TEST_CASE("every expectation must match; a malformed expectation is its own error") {
  auto f = frame();
  Aos1Expect x = expect();
  x.boundary_tokens = 4096;
  CHECK(decode(f, x) == Aos1Error::kBoundaryTokens);
  x = expect();
  x.boundary_block_hash ^= 1;
  CHECK(decode(f, x) == Aos1Error::kBoundaryHash);
  x = expect();
  x.payload_bytes = 99;
  CHECK(decode(f, x) == Aos1Error::kPayloadBytes);
  x = expect();
  x.fingerprint = fp(4);
  CHECK(decode(f, x) == Aos1Error::kFingerprint);
  x = expect();
  x.tp_size = 2;
  CHECK(decode(f, x) == Aos1Error::kTpGeometry);
  x = expect();
  x.tp_rank = 0;
  CHECK(decode(f, x) == Aos1Error::kTpGeometry);
  x = expect();
  x.payload_bytes = 0;
  CHECK(decode(f, x) == Aos1Error::kBadExpectation);
  x = expect();
  x.boundary_tokens = 0;
  CHECK(decode(f, x) == Aos1Error::kBadExpectation);
  x = expect();
  x.tp_rank = 4;
  CHECK(decode(f, x) == Aos1Error::kBadExpectation);
  CHECK(aos1_status(Aos1Error::kBadExpectation).code() == tier::Code::kInvalidArgument);
  CHECK(aos1_status(Aos1Error::kCrc).code() == tier::Code::kChecksumMismatch);
  CHECK(aos1_status(Aos1Error::kCrc).message() == "aos1 crc_mismatch");
}

TEST_CASE("truncated and extra bytes are rejected by exact length") {
  auto f = frame();
  CHECK(decode(std::vector<std::byte>(f.begin(), f.begin() + 127)) == Aos1Error::kTruncated);
  CHECK(decode(std::vector<std::byte>(f.begin(), f.end() - 1)) == Aos1Error::kLength);
  auto extra = f;
  extra.push_back(std::byte{0});
  CHECK(decode(extra) == Aos1Error::kLength);
  CHECK(decode(std::vector<std::byte>(f.begin(), f.begin() + 128)) == Aos1Error::kLength);
}

TEST_CASE("identity and size are checked before the CRC") {
  auto f = frame();
  f[128 + 1] ^= std::byte{1};  // CRC now fails too
  auto boundary = f;
  boundary[12] ^= std::byte{1};
  CHECK(decode(boundary) == Aos1Error::kBoundaryTokens);
  auto hash = f;
  hash[20] ^= std::byte{1};
  CHECK(decode(hash) == Aos1Error::kBoundaryHash);
  // A huge declared size is refused before any CRC or allocation.
  auto size = f;
  std::memset(size.data() + 28, 0xff, 8);
  CHECK(decode(size) == Aos1Error::kPayloadBytes);
  Aos1Expect x = expect();
  x.payload_bytes = 101;  // expected size differs from the stored one
  CHECK(decode(f, x) == Aos1Error::kPayloadBytes);
  // Length is checked before the CRC as well.
  auto longer = f;
  longer.push_back(std::byte{1});
  CHECK(decode(longer) == Aos1Error::kLength);
}

TEST_CASE("finalize computes size and CRC and rejects disagreeing pre-filled values") {
  std::vector<std::byte> f(kAos1HeaderBytes + 10, std::byte{5});
  Aos1Header h;
  h.boundary_tokens = 1;
  h.payload_bytes = 11;
  CHECK(finalize_aos1(f, h) == Aos1Error::kPayloadBytes);
  h.payload_bytes = 10;
  h.payload_crc32 = 1;
  CHECK(finalize_aos1(f, h) == Aos1Error::kCrc);
  h.payload_crc32 = 0;
  h.tp_rank = 1;  // rank >= size 1
  CHECK(finalize_aos1(f, h) == Aos1Error::kBadExpectation);
  h.tp_rank = 0;
  CHECK(finalize_aos1(f, h) == Aos1Error::kNone);
  std::vector<std::byte> empty(kAos1HeaderBytes);
  CHECK(finalize_aos1(empty, h) == Aos1Error::kLength);
  Aos1Header back = read_aos1_header(std::span<const std::byte, kAos1HeaderBytes>(f.data(), 128));
  CHECK(back.payload_bytes == 10);
  CHECK(back.payload_crc32 == crc32_of(std::span(f).subspan(128)));
}
