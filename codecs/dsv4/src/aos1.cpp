#include "tier/dsv4/aos1.hpp"

#include "tier/object.hpp"
#include "tier/endian.hpp"

#include <immintrin.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include <fmt/format.h>

namespace tier::dsv4 {
namespace {

constexpr std::byte kMagic[4] = {std::byte{'A'}, std::byte{'O'}, std::byte{'S'}, std::byte{'1'}};


}  // namespace

std::string_view aos1_error_name(Aos1Error e) noexcept {
  switch (e) {
    case Aos1Error::kNone: return "none";
    case Aos1Error::kTruncated: return "truncated";
    case Aos1Error::kBadMagic: return "bad_magic";
    case Aos1Error::kBadVersion: return "bad_version";
    case Aos1Error::kBadFlags: return "bad_flags";
    case Aos1Error::kReservedNonZero: return "reserved_nonzero";
    case Aos1Error::kBadExpectation: return "bad_expectation";
    case Aos1Error::kBoundaryTokens: return "boundary_tokens_mismatch";
    case Aos1Error::kBoundaryHash: return "boundary_hash_mismatch";
    case Aos1Error::kPayloadBytes: return "payload_bytes_mismatch";
    case Aos1Error::kFingerprint: return "fingerprint_mismatch";
    case Aos1Error::kTpGeometry: return "tp_geometry_mismatch";
    case Aos1Error::kLength: return "length_mismatch";
    case Aos1Error::kCrc: return "crc_mismatch";
  }
  return "unknown";
}

Status aos1_status(Aos1Error e) {
  if (e == Aos1Error::kNone) return Status::ok();
  if (e == Aos1Error::kBadExpectation) return Status::invalid("aos1 bad_expectation");
  return Status(Code::kChecksumMismatch, fmt::format("aos1 {}", aos1_error_name(e)));
}

namespace {

// CRC-32 (zlib's: reflected polynomial 0x04C11DB7, register and result inverted) by carry-less
// multiplication, for CPUs with PCLMULQDQ: four 128-bit lanes fold 64 bytes per round, then into
// one lane, then 16-byte blocks; the last 16 bytes and the tail (< 16 bytes) go through zlib.
//
// In the reflected representation a 64-bit word loaded from the message holds x^63 in bit 0, and
// PCLMULQDQ of two such words yields their product times x in the same 128-bit convention. A lane
// X = L*x^64 + H that stands D bits before the block Y it folds into contributes X*x^D, which is
// congruent (mod P) to clmul(L, x^(64+D-1) mod P) + clmul(H, x^(D-1) mod P): 96 bits at most, so
// the fold X' = those two products ^ Y keeps the message's CRC. The register's initial value
// 0xFFFFFFFF is the same as inverting the first four message bytes with a zero register.
struct ClmulKeys {
  std::uint64_t fold512_lo, fold512_hi, fold128_lo, fold128_hi;
};

// x^n mod P as a 32-bit polynomial (bit i = coefficient of x^i).
std::uint32_t xpow_mod(unsigned n) noexcept {
  std::uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (std::uint64_t{1} << 32)) r ^= 0x104C11DB7ull;
  }
  return static_cast<std::uint32_t>(r);
}

// A polynomial of degree < 32 in the reflected 64-bit convention (x^63 in bit 0).
std::uint64_t reflect64(std::uint32_t poly) noexcept {
  std::uint64_t v = 0;
  for (unsigned i = 0; i < 32; ++i)
    if (poly >> i & 1u) v |= std::uint64_t{1} << (63 - i);
  return v;
}

const ClmulKeys& clmul_keys() noexcept {
  static const ClmulKeys k{reflect64(xpow_mod(64 + 512 - 1)), reflect64(xpow_mod(512 - 1)),
                           reflect64(xpow_mod(64 + 128 - 1)), reflect64(xpow_mod(128 - 1))};
  return k;
}

__attribute__((target("pclmul,sse2"))) inline __m128i fold(__m128i x, __m128i k, __m128i y) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00),
                                     _mm_clmulepi64_si128(x, k, 0x11)),
                       y);
}

// zlib's crc32 of p[0, n), n >= 64.
__attribute__((target("pclmul,sse2"))) std::uint32_t crc32_clmul(const std::byte* p,
                                                                 std::size_t n) noexcept {
  const ClmulKeys& keys = clmul_keys();
  auto load = [](const std::byte* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  const __m128i k512 = _mm_set_epi64x(static_cast<long long>(keys.fold512_hi),
                                      static_cast<long long>(keys.fold512_lo));
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(keys.fold128_hi),
                                      static_cast<long long>(keys.fold128_lo));
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(-1));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, k512, load(p));
    x1 = fold(x1, k512, load(p + 16));
    x2 = fold(x2, k512, load(p + 32));
    x3 = fold(x3, k512, load(p + 48));
  }
  x1 = fold(x0, k128, x1);
  x2 = fold(x1, k128, x2);
  x3 = fold(x2, k128, x3);
  for (; n >= 16; p += 16, n -= 16) x3 = fold(x3, k128, load(p));
  // What is left is x3's 16 bytes then the tail, with a zero register: zlib's crc32 started from
  // 0xFFFFFFFF works on the register ~0xFFFFFFFF = 0 and returns its inverse, which is the CRC.
  alignas(16) unsigned char last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), x3);
  uLong crc = crc32_z(0xFFFFFFFFul, last, 16);
  return static_cast<std::uint32_t>(crc32_z(crc, reinterpret_cast<const Bytef*>(p), n));
}

uLong crc_of(const std::byte* p, std::size_t n) noexcept {
  static const bool clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2");
  if (clmul && n >= 64) return crc32_clmul(p, n);
  return crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(p), n);
}

}  // namespace

std::uint32_t crc32_of(std::span<const std::byte> data) noexcept {
  // A SLOT frame is tens of MiB: its CRC is computed in 1 MiB pieces on the verification threads
  // and the pieces' CRCs combined (crc32_combine), byte for byte zlib's crc32 of the whole.
  static constexpr std::size_t kPiece = std::size_t{1} << 20;
  if (data.size() < 2 * kPiece) return static_cast<std::uint32_t>(crc_of(data.data(), data.size()));
  struct Job {
    std::span<const std::byte> data;
    std::vector<uLong> crcs;
  };
  Job job{data, {}};
  try {
    job.crcs.resize((data.size() + kPiece - 1) / kPiece);
  } catch (const std::bad_alloc&) {
    return static_cast<std::uint32_t>(crc_of(data.data(), data.size()));
  }
  for_each_on_verify_threads(
      job.crcs.size(),
      [](void* ctx, std::size_t i) noexcept {
        auto& j = *static_cast<Job*>(ctx);
        const std::size_t off = i * kPiece;
        j.crcs[i] = crc_of(j.data.data() + off, std::min(kPiece, j.data.size() - off));
      },
      &job);
  uLong crc = job.crcs[0];
  for (std::size_t i = 1; i < job.crcs.size(); ++i) {
    const std::size_t n = std::min(kPiece, data.size() - i * kPiece);
    crc = crc32_combine(crc, job.crcs[i], static_cast<z_off_t>(n));
  }
  return static_cast<std::uint32_t>(crc & 0xffffffffu);
}

void write_aos1_header(std::span<std::byte, kAos1HeaderBytes> out, const Aos1Header& h) noexcept {
  std::byte* p = out.data();
  std::memset(p, 0, kAos1HeaderBytes);
  std::memcpy(p, kMagic, 4);
  put_le<std::uint32_t>(p + 4, h.version);
  put_le<std::uint32_t>(p + 8, h.flags);
  put_le<std::uint64_t>(p + 12, h.boundary_tokens);
  put_le<std::uint64_t>(p + 20, h.boundary_block_hash);
  put_le<std::uint64_t>(p + 28, h.payload_bytes);
  put_le<std::uint32_t>(p + 36, h.payload_crc32);
  std::memcpy(p + 40, h.fingerprint.data(), 16);
  put_le<std::uint32_t>(p + 56, h.tp_size);
  put_le<std::uint32_t>(p + 60, h.tp_rank);
}

Aos1Header read_aos1_header(std::span<const std::byte, kAos1HeaderBytes> in) noexcept {
  const std::byte* p = in.data();
  Aos1Header h;
  h.version = get_le<std::uint32_t>(p + 4);
  h.flags = get_le<std::uint32_t>(p + 8);
  h.boundary_tokens = get_le<std::uint64_t>(p + 12);
  h.boundary_block_hash = get_le<std::uint64_t>(p + 20);
  h.payload_bytes = get_le<std::uint64_t>(p + 28);
  h.payload_crc32 = get_le<std::uint32_t>(p + 36);
  std::memcpy(h.fingerprint.data(), p + 40, 16);
  h.tp_size = get_le<std::uint32_t>(p + 56);
  h.tp_rank = get_le<std::uint32_t>(p + 60);
  return h;
}

Aos1Error finalize_aos1(std::span<std::byte> frame, Aos1Header h) noexcept {
  if (frame.size() <= kAos1HeaderBytes) return Aos1Error::kLength;
  auto payload = frame.subspan(kAos1HeaderBytes);
  if (h.payload_bytes != 0 && h.payload_bytes != payload.size()) return Aos1Error::kPayloadBytes;
  std::uint32_t crc = crc32_of(payload);
  if (h.payload_crc32 != 0 && h.payload_crc32 != crc) return Aos1Error::kCrc;
  if (h.version != kAos1Version) return Aos1Error::kBadVersion;
  if (h.flags != 0) return Aos1Error::kBadFlags;
  if (h.boundary_tokens == 0 || h.tp_size == 0 || h.tp_rank >= h.tp_size)
    return Aos1Error::kBadExpectation;
  h.payload_bytes = payload.size();
  h.payload_crc32 = crc;
  write_aos1_header(frame.first<kAos1HeaderBytes>(), h);
  return Aos1Error::kNone;
}

Aos1Error check_aos1_fields(std::span<const std::span<std::byte>> frame, const Aos1Expect& x,
                            Aos1Header& h) noexcept {
  std::size_t total = 0;
  for (const auto& p : frame) total += p.size();
  // (1) length, (2) one snapshot of the header: later checks never re-read the source.
  if (total < kAos1HeaderBytes) return Aos1Error::kTruncated;
  std::array<std::byte, kAos1HeaderBytes> snap;
  copy_head(frame, snap);
  // (3) identity of the format.
  if (std::memcmp(snap.data(), kMagic, 4) != 0) return Aos1Error::kBadMagic;
  h = read_aos1_header(std::span<const std::byte, kAos1HeaderBytes>(snap));
  if (h.version != kAos1Version) return Aos1Error::kBadVersion;
  if (h.flags != 0) return Aos1Error::kBadFlags;
  if (std::any_of(snap.begin() + 64, snap.end(), [](std::byte b) { return b != std::byte{0}; }))
    return Aos1Error::kReservedNonZero;
  // (4) the expectations.
  if (x.boundary_tokens == 0 || x.payload_bytes == 0 || x.tp_size == 0 || x.tp_rank >= x.tp_size)
    return Aos1Error::kBadExpectation;
  // (5) identity of the object, before any size-driven work.
  if (h.boundary_tokens == 0 || h.boundary_tokens != x.boundary_tokens)
    return Aos1Error::kBoundaryTokens;
  if (h.boundary_block_hash != x.boundary_block_hash) return Aos1Error::kBoundaryHash;
  if (h.payload_bytes == 0 || h.payload_bytes != x.payload_bytes) return Aos1Error::kPayloadBytes;
  if (h.fingerprint != x.fingerprint) return Aos1Error::kFingerprint;
  if (h.tp_size == 0 || h.tp_rank >= h.tp_size || h.tp_size != x.tp_size || h.tp_rank != x.tp_rank)
    return Aos1Error::kTpGeometry;
  // (6) exact total length.
  if (total - kAos1HeaderBytes != x.payload_bytes) return Aos1Error::kLength;
  return Aos1Error::kNone;
}

Aos1Error check_aos1(std::span<const std::span<std::byte>> frame, const Aos1Expect& x,
                     Aos1Header& h) noexcept {
  if (const Aos1Error e = check_aos1_fields(frame, x, h); e != Aos1Error::kNone) return e;
  // (7) CRC, piece by piece (crc32_combine).
  uLong crc = crc32_z(0L, Z_NULL, 0);
  std::size_t off = 0;
  for (const auto& p : frame) {
    const std::size_t skip = off < kAos1HeaderBytes ? std::min(kAos1HeaderBytes - off, p.size()) : 0;
    off += p.size();
    if (skip == p.size()) continue;
    const std::size_t n = p.size() - skip;
    crc = crc32_combine(crc, crc32_of(std::span<const std::byte>(p.data() + skip, n)),
                        static_cast<z_off_t>(n));
  }
  if (static_cast<std::uint32_t>(crc & 0xffffffffu) != h.payload_crc32) return Aos1Error::kCrc;
  return Aos1Error::kNone;
}

Aos1Decoded decode_aos1(std::span<const std::byte> frame, const Aos1Expect& x) noexcept {
  Aos1Decoded d;
  const std::span<std::byte> whole(const_cast<std::byte*>(frame.data()), frame.size());  // read only
  d.error = check_aos1(std::span(&whole, 1), x, d.header);
  if (d.error == Aos1Error::kNone) d.payload = frame.subspan(kAos1HeaderBytes);
  return d;
}

}  // namespace tier::dsv4
