#pragma once
// zstd stage codec: a lossless stage a profile chains after the region codec, per tier
// ("stage": {"type": "zstd", "level": 3}), e.g. compressed on disk and remote, raw in memory.
//
// Encoded form (all integers little-endian):
//   0  u32  magic "LTZ1"
//   4  u32  inner layout id (the region codec that made the raw payload)
//   8  u64  raw size
//   16 ...  one zstd frame (with its content size) of the raw payload
// decode checks the magic, the inner layout id against the caller's, the raw size against the
// frame's content size and the configured bound, and that the frame decompresses to exactly the
// raw size; anything else is ChecksumMismatch and nothing is handed out. Round trips are bit-exact.
//
// Thread safety: immutable; each call uses a thread-local zstd context.

#include <cstdint>
#include <memory>

#include "tier/codec.hpp"
#include "tier/json.hpp"

namespace tier::zstd {

inline constexpr std::uint32_t kZstdStageId = 0x6474737A;  // "zstd" read little-endian
inline constexpr std::size_t kZstdHeaderBytes = 16;

class ZstdStage final : public StageCodec {
 public:
  // Options (validated by the registry against zstd_plugin.cpp's schema): level, max_raw_bytes.
  static Result<std::unique_ptr<ZstdStage>> create(const Json& options);
  ZstdStage(int level, std::uint64_t max_raw_bytes) : level_(level), max_raw_(max_raw_bytes) {}

  int level() const noexcept { return level_; }
  std::string_view name() const noexcept override { return "zstd"; }
  std::uint32_t stage_id() const noexcept override { return kZstdStageId; }
  std::size_t max_encoded_size(std::size_t raw_bytes) const noexcept override;
  Result<std::size_t> encode(std::uint32_t inner_format_id, std::span<const std::byte> raw,
                             std::span<std::byte> dst) const noexcept override;
  Result<std::size_t> decoded_size(std::span<const std::byte> encoded,
                                   std::uint32_t inner_format_id) const noexcept override;
  Result<std::size_t> decode(std::span<const std::byte> encoded, std::uint32_t inner_format_id,
                             std::span<std::byte> dst) const noexcept override;

 private:
  int level_;
  std::uint64_t max_raw_;
};

}  // namespace tier::zstd
