// Frames and hashes as the reference writes them, built independently of libtier's encoders:
// an AOS1 sidecar assembled byte by byte from the reference's layout (section 2.3 of
// ../shared/reference/dsv4-page-slot.md), decoded field by field and altered one field at a time
// to check the fail-closed order; and golden vectors for the chained xxh64 boundary hash.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tier/dsv4/aos1.hpp"
#include "tier/dsv4/slot_codec.hpp"

using namespace tier::dsv4;

namespace {

constexpr std::uint64_t kTokens = 8192;
constexpr std::uint64_t kHash = 0x0123456789abcdefull;
constexpr std::size_t kPayload = 100;

Fingerprint fingerprint() {
  Fingerprint f;
  for (std::size_t i = 0; i < 16; ++i) f[i] = static_cast<std::byte>(0xa0 + i);
  return f;
}

void le(std::vector<std::byte>& f, std::size_t off, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) f[off + i] = static_cast<std::byte>(v >> (8 * i));
}

// The reference's frame: struct "<4sIIQQQI16sII" (64 bytes, no padding), 64 zero bytes, then
// the payload; the CRC is zlib's crc32 of the payload (here zlib itself, not libtier's CRC).
std::vector<std::byte> reference_frame() {
  std::vector<std::byte> f(kAos1HeaderBytes + kPayload, std::byte{0});
  for (std::size_t i = 0; i < kPayload; ++i)
    f[kAos1HeaderBytes + i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
  const auto* payload = reinterpret_cast<const Bytef*>(f.data() + kAos1HeaderBytes);
  const auto crc = static_cast<std::uint32_t>(crc32(0L, payload, kPayload));
  std::memcpy(f.data(), "AOS1", 4);  // magic
  le(f, 4, 1, 4);                    // version
  le(f, 8, 0, 4);                    // flags
  le(f, 12, kTokens, 8);             // boundary_tokens (unaligned u64)
  le(f, 20, kHash, 8);               // boundary_block_hash
  le(f, 28, kPayload, 8);            // payload_bytes
  le(f, 36, crc, 4);                 // payload_crc32
  const Fingerprint fp = fingerprint();
  std::memcpy(f.data() + 40, fp.data(), 16);  // fingerprint
  le(f, 56, 4, 4);                            // tp_size
  le(f, 60, 1, 4);                            // tp_rank
  return f;                                   // [64, 128) reserved, zero
}

Aos1Expect expectations() { return Aos1Expect{kTokens, kHash, kPayload, fingerprint(), 4, 1}; }

std::string hex(const std::byte* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out += kHex[std::to_integer<unsigned>(p[i]) >> 4];
    out += kHex[std::to_integer<unsigned>(p[i]) & 0xf];
  }
  return out;
}

// One alteration per decode check, listed in the reference's fail-closed order (section 2.3:
// magic, version, flags, reserved; boundary tokens, hash, payload size, fingerprint, TP geometry;
// exact length; CRC). Each makes exactly its own check fail.
struct Alteration {
  const char* field;
  Aos1Error error;
  void (*apply)(std::vector<std::byte>&);
};
const std::vector<Alteration>& alterations() {
  static const std::vector<Alteration> all = {
      {"magic", Aos1Error::kBadMagic, [](auto& f) { f[3] = std::byte{'2'}; }},
      {"version", Aos1Error::kBadVersion, [](auto& f) { le(f, 4, 2, 4); }},
      {"flags", Aos1Error::kBadFlags, [](auto& f) { le(f, 8, 1, 4); }},
      {"reserved", Aos1Error::kReservedNonZero, [](auto& f) { f[127] = std::byte{1}; }},
      {"boundary_tokens", Aos1Error::kBoundaryTokens, [](auto& f) { le(f, 12, kTokens + 1, 8); }},
      {"boundary_block_hash", Aos1Error::kBoundaryHash, [](auto& f) { le(f, 20, kHash ^ 1, 8); }},
      {"payload_bytes", Aos1Error::kPayloadBytes, [](auto& f) { le(f, 28, kPayload + 1, 8); }},
      {"fingerprint", Aos1Error::kFingerprint, [](auto& f) { f[40 + 15] ^= std::byte{1}; }},
      {"tp_size", Aos1Error::kTpGeometry, [](auto& f) { le(f, 56, 8, 4); }},
      {"tp_rank", Aos1Error::kTpGeometry, [](auto& f) { le(f, 60, 2, 4); }},
      {"length", Aos1Error::kLength, [](auto& f) { f.push_back(std::byte{0}); }},
      {"payload_crc32", Aos1Error::kCrc, [](auto& f) { f[kAos1HeaderBytes + 5] ^= std::byte{8}; }},
  };
  return all;
}

}  // namespace

TEST_CASE("an AOS1 frame built byte by byte from the reference's layout decodes field by field") {
  const auto f = reference_frame();
  // The same 64 header bytes as Python's struct.pack("<4sIIQQQI16sII", b"AOS1", 1, 0, 8192,
  // 0x0123456789abcdef, 100, zlib.crc32(payload), bytes(range(0xa0, 0xb0)), 4, 1) with
  // payload = bytes((i * 7 + 3) & 0xff for i in range(100)) (Debian 12 python3, zlib.crc32 gives
  // 0xaa316b09), i.e. the reference's own encoder.
  CHECK(hex(f.data(), 64) ==
        "414f533101000000000000000020000000000000efcdab89674523016400000000000000096b31aa"
        "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf0400000001000000");
  const Aos1Header h = read_aos1_header(std::span(f).first<kAos1HeaderBytes>());
  CHECK(h.version == 1);
  CHECK(h.flags == 0);
  CHECK(h.boundary_tokens == kTokens);
  CHECK(h.boundary_block_hash == kHash);
  CHECK(h.payload_bytes == kPayload);
  CHECK(h.payload_crc32 == 0xaa316b09u);
  CHECK(h.fingerprint == fingerprint());
  CHECK(h.tp_size == 4);
  CHECK(h.tp_rank == 1);
  const Aos1Decoded d = decode_aos1(f, expectations());
  REQUIRE_MESSAGE(d.error == Aos1Error::kNone, aos1_error_name(d.error));
  CHECK(d.header.payload_crc32 == 0xaa316b09u);
  REQUIRE(d.payload.size() == kPayload);
  CHECK(d.payload.data() == f.data() + kAos1HeaderBytes);  // a view, not a copy
  for (std::size_t i = 0; i < kPayload; ++i)
    CHECK(d.payload[i] == static_cast<std::byte>((i * 7 + 3) & 0xff));
}

TEST_CASE("a reference frame altered one field at a time fails on that field") {
  for (const Alteration& a : alterations()) {
    auto f = reference_frame();
    a.apply(f);
    CAPTURE(a.field);
    CHECK(aos1_error_name(decode_aos1(f, expectations()).error) == aos1_error_name(a.error));
  }
}

TEST_CASE(
    "a reference frame altered in two fields fails on the earlier one in the reference order") {
  const auto& all = alterations();
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      auto f = reference_frame();
      all[j].apply(f);
      all[i].apply(f);
      CAPTURE(all[i].field);
      CAPTURE(all[j].field);
      CHECK(aos1_error_name(decode_aos1(f, expectations()).error) == aos1_error_name(all[i].error));
    }
  }
  // A frame shorter than the header fails before anything else is read.
  auto f = reference_frame();
  f.resize(kAos1HeaderBytes - 1);
  CHECK(decode_aos1(f, expectations()).error == Aos1Error::kTruncated);
}

// Golden vectors computed outside libtier with the reference's formula (section 1.2:
// xxh64 over prefix.to_bytes(8, "little") when there is a prefix, then the block's tokens as
// int64 little-endian), using Debian 12's python3-xxhash 3.2.0:
//   import xxhash, struct
//   def h(tokens, prefix=-1):
//       x = xxhash.xxh64()
//       if prefix != -1: x.update(prefix.to_bytes(8, "little"))
//       x.update(struct.pack("<%dq" % len(tokens), *tokens)); return x.intdigest()
//   h([1,2,3,4]) == 0x73f859a04f669e6d; h([5,6,7,8], 0x73f859a04f669e6d) == 0x087884241753df3e
//   h([4000000000,7,99999,0]) == 0x987766efa36d594f; h([1,2,3,4], that) == 0x6db9aa6eb8376493
// The first block also checks with Debian's xxhsum 0.8.1 (`xxhsum -H64` over the 32 bytes of
// 1..4 as i64 LE prints 73f859a04f669e6d).
TEST_CASE("the chained xxh64 boundary hash matches golden vectors computed independently") {
  std::vector<std::uint32_t> t(10);
  for (std::uint32_t i = 0; i < 10; ++i) t[i] = i + 1;
  CHECK(chained_block_hash(std::span(t).first(4), 4) == 0x73f859a04f669e6dull);
  CHECK(chained_block_hash(std::span(t).first(8), 4) == 0x087884241753df3eull);
  CHECK(chained_block_hash(t, 4) == 0x087884241753df3eull);  // a partial block does not count
  // A token above 2^31 is a positive int64 (the engine's tokens are unsigned 32-bit).
  const std::vector<std::uint32_t> u = {4000000000u, 7, 99999, 0, 1, 2, 3, 4};
  CHECK(chained_block_hash(std::span(u).first(4), 4) == 0x987766efa36d594full);
  CHECK(chained_block_hash(u, 4) == 0x6db9aa6eb8376493ull);
}
