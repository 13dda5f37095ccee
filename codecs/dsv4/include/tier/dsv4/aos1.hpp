#pragma once
// The AOS1 sidecar frame that carries one SLOT image, byte for byte as the reference writes it:
//
//   off size field                type      checked on decode
//   0   4    magic "AOS1"         bytes     == "AOS1"
//   4   4    version              u32 LE    == 1
//   8   4    flags                u32 LE    == 0
//   12  8    boundary_tokens      u64 LE    >= 1, == expected        (unaligned)
//   20  8    boundary_block_hash  u64 LE    == expected              (unaligned)
//   28  8    payload_bytes        u64 LE    >= 1, == expected        (unaligned)
//   36  4    payload_crc32        u32 LE    == CRC-32 (zlib) of the payload
//   40  16   fingerprint          bytes     == expected (slot layout identity)
//   56  4    tp_size              u32 LE    >= 1, == expected
//   60  4    tp_rank              u32 LE    < tp_size, == expected
//   64  64   reserved             zeros     every byte 0
//   128 N    payload              the SLOT image; total length must be 128 + expected payload
//
// Decode is fail-closed and ordered so that nothing is allocated and no CRC is computed before
// identity and size are settled: (1) length >= 128; (2) snapshot the header once; (3) magic,
// version, flags, reserved; (4) the expectations themselves are well formed; (5) boundary tokens,
// boundary hash, payload size, fingerprint, TP geometry; (6) exact total length; (7) CRC.
// CRC-32 detects accidental corruption only; it is not authentication.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tier/status.hpp"

namespace tier::dsv4 {

inline constexpr std::size_t kAos1HeaderBytes = 128;
inline constexpr std::uint32_t kAos1Version = 1;

using Fingerprint = std::array<std::byte, 16>;

struct Aos1Header {
  std::uint32_t version = kAos1Version;
  std::uint32_t flags = 0;
  std::uint64_t boundary_tokens = 0;
  std::uint64_t boundary_block_hash = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t payload_crc32 = 0;
  Fingerprint fingerprint{};
  std::uint32_t tp_size = 1;
  std::uint32_t tp_rank = 0;
};

// What the reader expects. All fields are required (C++ makes a missing one impossible);
// kBadExpectation reports expectations that could never match a valid frame.
struct Aos1Expect {
  std::uint64_t boundary_tokens = 0;
  std::uint64_t boundary_block_hash = 0;
  std::uint64_t payload_bytes = 0;
  Fingerprint fingerprint{};
  std::uint32_t tp_size = 1;
  std::uint32_t tp_rank = 0;
};

// Typed decode failures, in check order. Every one of them is a miss for the caller; all but
// kBadExpectation mean the stored object is corrupt or not what its key promised.
enum class Aos1Error : std::uint8_t {
  kNone = 0,
  kTruncated,        // shorter than the header
  kBadMagic,
  kBadVersion,
  kBadFlags,
  kReservedNonZero,
  kBadExpectation,   // the caller's expectations are malformed (tokens/payload 0, rank >= size)
  kBoundaryTokens,
  kBoundaryHash,
  kPayloadBytes,
  kFingerprint,
  kTpGeometry,
  kLength,           // total length != 128 + expected payload
  kCrc,
};
std::string_view aos1_error_name(Aos1Error e) noexcept;
// ChecksumMismatch "aos1 <name>" (InvalidArgument for kBadExpectation); OK for kNone.
Status aos1_status(Aos1Error e);

// decode_aos1()'s checks, in its order, over a frame held in pieces (in order: a stored image's
// blocks); `h` receives the header snapshot. The CRC is combined piece by piece.
// check_aos1_fields() is every check but the last, the CRC (h.payload_crc32 over the frame's
// bytes after the header), for a caller that computes the CRC elsewhere.
Aos1Error check_aos1_fields(std::span<const std::span<std::byte>> frame, const Aos1Expect& x,
                            Aos1Header& h) noexcept;
Aos1Error check_aos1(std::span<const std::span<std::byte>> frame, const Aos1Expect& x,
                     Aos1Header& h) noexcept;

struct Aos1Decoded {
  Aos1Error error = Aos1Error::kNone;
  Aos1Header header;                    // the snapshot (valid when error == kNone)
  std::span<const std::byte> payload;  // zero-copy view of frame[128, 128 + payload_bytes)
};

// CRC-32 exactly as zlib.crc32 computes it (any length).
std::uint32_t crc32_of(std::span<const std::byte> data) noexcept;

// Serializes `h` field by field (little-endian, reserved zeroed) into frame[0, 128).
void write_aos1_header(std::span<std::byte, kAos1HeaderBytes> out, const Aos1Header& h) noexcept;
// Parses the fields without checking them (for tools and tests).
Aos1Header read_aos1_header(std::span<const std::byte, kAos1HeaderBytes> in) noexcept;

// Finalizes a frame in place: the payload already sits at frame[128, end). Computes the payload
// size and CRC itself; rejects a header whose pre-filled payload_bytes / payload_crc32 (nonzero)
// disagree with the payload, or a frame without payload. Returns kNone or the error.
Aos1Error finalize_aos1(std::span<std::byte> frame, Aos1Header h) noexcept;

// Decodes in the fail-closed order above.
Aos1Decoded decode_aos1(std::span<const std::byte> frame, const Aos1Expect& expect) noexcept;

}  // namespace tier::dsv4
