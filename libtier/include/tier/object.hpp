#pragma once
// The stored object format. Every image a backend stores is
//
//   [ 96-byte header | payload ]
//
// header (all integers little-endian):
//   0  u32  magic "LTO1"          4  u16 version (1)          6  u16 header bytes (96)
//   8  u32  layout id of the region codec that made the raw payload
//   12 u32  stage id (0 = raw payload; else the stage codec, e.g. zstd, that transformed it)
//   16 16B  namespace id          32 16B object id             48 u32 rank   52 u32 flags (0)
//   56 u64  payload bytes         64 u64 XXH3-64 (seed 0) of the payload
//   72 16B  reserved, zero        88 u64 XXH3-64 (seed 0) of header bytes [0, 88)
//
// Every backend read is verified (magic, version, header checksum, expected key, exact length,
// payload checksum) by Backend::poll before the completion is handed out; a failure is a miss
// with Code::kChecksumMismatch, counted in metrics, and the destination's header is scrubbed so
// the bytes cannot be mistaken for a valid object.

#include <cstddef>
#include <cstdint>
#include <span>

#include "tier/key.hpp"
#include "tier/status.hpp"

namespace tier {

inline constexpr std::size_t kObjectHeaderBytes = 96;
inline constexpr std::uint32_t kObjectMagic = 0x314F544Cu;  // "LTO1" read little-endian
inline constexpr std::uint16_t kObjectVersion = 1;

struct ObjectHeader {
  std::uint32_t layout_id = 0;
  std::uint32_t stage_id = 0;
  ObjectKey key;
  std::uint64_t payload_bytes = 0;
  std::uint64_t payload_checksum = 0;
};

std::uint64_t payload_checksum(std::span<const std::byte> payload) noexcept;

// Writes the header for `h` into the first kObjectHeaderBytes of `image` (which must be at least
// that long). `h.payload_checksum` is taken as given: compute it with payload_checksum().
void write_object_header(std::span<std::byte> image, const ObjectHeader& h) noexcept;

// Frames a payload already placed at image[kObjectHeaderBytes, +payload_bytes): computes the
// payload checksum and writes the header.
void seal_object(std::span<std::byte> image, std::uint32_t layout_id, std::uint32_t stage_id,
                 const ObjectKey& key) noexcept;

// Parses and checks the header only (magic, version, size field, header checksum).
// Returns: the header, or kChecksumMismatch.
Result<ObjectHeader> parse_object_header(std::span<const std::byte> image) noexcept;

// Full verification of an image read back for `expected`: header, key, exact total length and
// payload checksum. Returns: Ok or kChecksumMismatch (with what differed).
Status verify_object(std::span<const std::byte> image, const ObjectKey& expected) noexcept;

// Copies a stored image into `dst` while verifying it (header, key, exact length, payload
// checksum), in one pass over the bytes: for backends whose objects live in host memory, this
// costs about what a plain memcpy costs. The header is written last, only when everything
// matched; on failure `dst` holds no valid header. Returns: Ok, kChecksumMismatch, or
// kInvalidArgument when `dst` is smaller than the image.
Status copy_verified(std::span<std::byte> dst, std::span<const std::byte> stored,
                     const ObjectKey& expected) noexcept;

// Overwrites the header so a failed image can never be parsed as valid.
void scrub_object(std::span<std::byte> image) noexcept;

}  // namespace tier
