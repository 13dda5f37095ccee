#pragma once
// Codecs turn engine Regions into a storable payload and back.
//
// Codec       regions <-> raw payload. Chosen by the caller (it knows the engine's layout):
//             identity (concatenation), DSV4 PAGE, DSV4 SLOT. Its format_id() is recorded in
//             every stored header, so a payload is never decoded by the wrong layout.
// StageCodec  raw payload <-> stored payload, lossless (zstd). Chosen per tier by the profile
//             (e.g. compressed on disk and remote, raw in CPU and GPU memory). Its stage_id() is
//             recorded in the header, and its own framing records the inner layout id, so
//             decode cannot mix up inner codecs.
//
// Both are immutable after creation and safe to call from several threads at once.
// encode/decode never throw; decode validates everything before writing any destination byte.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier {

// A codec's check of a stored payload that a tier moves straight into regions (Codec::direct):
// called with the payload's bytes in pieces, in order (host memory, read only, valid during the
// call), after the object's checksum verified and before any byte is written. Errors: what
// decode() returns for the same payload (ChecksumMismatch for a bad frame). Thread-safe.
//
// check_head() splits check() for a tier that computes CRC-32 where it moves the payload (a
// pinned tier, on the GPU): it checks everything check() checks except one CRC-32 (zlib's) over
// the payload from `CrcClaim::from` to its end, and returns the value those bytes must have; the
// tier then owes exactly that CRC before writing. Ok(nullopt), the default: no such split, the
// tier calls check(). Same errors and threads as check().
struct CrcClaim {
  std::uint64_t from = 0;
  std::uint32_t crc = 0;
};

class PayloadCheck {
 public:
  virtual Status check(std::span<const std::span<std::byte>> payload) const noexcept = 0;
  virtual Result<std::optional<CrcClaim>> check_head(
      std::span<const std::span<std::byte>> payload) const noexcept {
    (void)payload;
    return std::optional<CrcClaim>{};
  }

 protected:
  ~PayloadCheck() = default;
};

// How a payload relates to the regions a tier may move it into (Codec::direct).
struct DirectPayload {
  std::size_t framing = 0;              // leading payload bytes that go to no region
  const PayloadCheck* check = nullptr;  // the codec's check of them (lives as long as the codec)
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual std::uint32_t format_id() const noexcept = 0;
  // Size of the payload encode() produces for `src`.
  virtual Result<std::size_t> encoded_size(RegionList src) const noexcept = 0;
  // Encodes `src` into `dst` (host memory, at least encoded_size bytes). Returns bytes written.
  // Errors: InvalidArgument (regions the codec does not accept, `dst` too small).
  virtual Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept = 0;
  // Decodes `payload` into `dst`. Errors: InvalidArgument (sizes do not match the regions),
  // ChecksumMismatch (a framed payload that fails its own checks). Nothing is written on error.
  virtual Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept = 0;
  // Whether a tier may move the payload for `regions` itself, without encode() or decode() (a
  // TierStack then lets a tier that takes scattered gets write a verified payload straight into
  // the regions, device memory included: docs/object-format.md, "Direct payloads"). Ok when the
  // payload is `framing` bytes followed by exactly the regions' bytes concatenated in order, and
  // `regions` pass every check decode() makes of them (a refused list fails here as it would
  // there); `check`, when the codec frames its payload, checks a stored payload as decode() would
  // before the tier writes a byte. NotSupported, the default, for a codec that transforms bytes.
  virtual Result<DirectPayload> direct(RegionList regions) const noexcept {
    (void)regions;
    return Status(Code::kNotSupported, "this codec transforms its payload");
  }
};

class StageCodec {
 public:
  virtual ~StageCodec() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual std::uint32_t stage_id() const noexcept = 0;  // never 0 (0 means "raw")
  // An upper bound of encode()'s output for `raw_bytes` of input.
  virtual std::size_t max_encoded_size(std::size_t raw_bytes) const noexcept = 0;
  // Encodes `raw` (made by the codec with `inner_format_id`) into `dst`. Returns bytes written.
  virtual Result<std::size_t> encode(std::uint32_t inner_format_id, std::span<const std::byte> raw,
                                     std::span<std::byte> dst) const noexcept = 0;
  // The raw size an encoded payload declares, after checking its framing and inner layout id.
  virtual Result<std::size_t> decoded_size(std::span<const std::byte> encoded,
                                           std::uint32_t inner_format_id) const noexcept = 0;
  // Decodes into `dst` (exactly decoded_size bytes). Returns bytes written.
  // Errors: ChecksumMismatch (bad framing, wrong inner layout, corrupt stream).
  virtual Result<std::size_t> decode(std::span<const std::byte> encoded,
                                     std::uint32_t inner_format_id,
                                     std::span<std::byte> dst) const noexcept = 0;
};

// The identity codec: the payload is the regions' bytes concatenated in order (host regions).
inline constexpr std::uint32_t kIdentityLayoutId = 1;

}  // namespace tier
