#include "zstd_stage.hpp"
#include "tier/endian.hpp"

#include <zstd.h>

#include <fmt/format.h>

namespace tier::zstd {
namespace {

constexpr std::uint32_t kMagic = 0x315A544Cu;  // "LTZ1" read little-endian


struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};
ZSTD_CCtx* cctx() noexcept {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> c(ZSTD_createCCtx());
  return c.get();
}
ZSTD_DCtx* dctx() noexcept {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> c(ZSTD_createDCtx());
  return c.get();
}

Status corrupt(std::string message) {
  return Status(Code::kChecksumMismatch, "zstd stage: " + std::move(message));
}

}  // namespace

Result<std::unique_ptr<ZstdStage>> ZstdStage::create(const Json& options) {
  int level = options.value("level", 3);
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
    return Status::invalid(fmt::format("zstd level {} is not in [{}, {}]", level, ZSTD_minCLevel(),
                                       ZSTD_maxCLevel()));
  std::uint64_t max_raw = options.value("max_raw_bytes", std::uint64_t{1} << 34);
  return std::make_unique<ZstdStage>(level, max_raw);
}

std::size_t ZstdStage::max_encoded_size(std::size_t raw_bytes) const noexcept {
  return kZstdHeaderBytes + ZSTD_compressBound(raw_bytes);
}

Result<std::size_t> ZstdStage::encode(std::uint32_t inner_format_id,
                                      std::span<const std::byte> raw,
                                      std::span<std::byte> dst) const noexcept {
  if (raw.size() > max_raw_)
    return Status::invalid(fmt::format("zstd stage: {} raw bytes exceed max_raw_bytes {}",
                                       raw.size(), max_raw_));
  if (dst.size() < max_encoded_size(raw.size()))
    return Status::invalid(fmt::format("zstd stage: destination of {} bytes, needs {}",
                                       dst.size(), max_encoded_size(raw.size())));
  ZSTD_CCtx* c = cctx();
  if (c == nullptr) return Status(Code::kNoSpace, "zstd stage: cannot allocate a context");
  ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level_);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
  std::size_t n = ZSTD_compress2(c, dst.data() + kZstdHeaderBytes, dst.size() - kZstdHeaderBytes,
                                 raw.data(), raw.size());
  if (ZSTD_isError(n))
    return Status(Code::kIoError, fmt::format("zstd stage: {}", ZSTD_getErrorName(n)));
  put_le<std::uint32_t>(dst.data(), kMagic);
  put_le<std::uint32_t>(dst.data() + 4, inner_format_id);
  put_le<std::uint64_t>(dst.data() + 8, raw.size());
  return kZstdHeaderBytes + n;
}

Result<std::size_t> ZstdStage::decoded_size(std::span<const std::byte> encoded,
                                            std::uint32_t inner_format_id) const noexcept {
  if (encoded.size() < kZstdHeaderBytes) return corrupt("shorter than its header");
  if (get_le<std::uint32_t>(encoded.data()) != kMagic) return corrupt("bad magic");
  std::uint32_t inner = get_le<std::uint32_t>(encoded.data() + 4);
  if (inner != inner_format_id)
    return corrupt(fmt::format("made from layout {}, the object header says {}", inner,
                               inner_format_id));
  std::uint64_t raw = get_le<std::uint64_t>(encoded.data() + 8);
  if (raw > max_raw_)
    return corrupt(fmt::format("declares {} raw bytes, above max_raw_bytes {}", raw, max_raw_));
  unsigned long long frame =
      ZSTD_getFrameContentSize(encoded.data() + kZstdHeaderBytes, encoded.size() - kZstdHeaderBytes);
  if (frame == ZSTD_CONTENTSIZE_ERROR || frame == ZSTD_CONTENTSIZE_UNKNOWN || frame != raw)
    return corrupt("frame content size does not match the header");
  return static_cast<std::size_t>(raw);
}

Result<std::size_t> ZstdStage::decode(std::span<const std::byte> encoded,
                                      std::uint32_t inner_format_id,
                                      std::span<std::byte> dst) const noexcept {
  TIER_ASSIGN_OR_RETURN(std::size_t raw, decoded_size(encoded, inner_format_id));
  if (dst.size() < raw)
    return Status::invalid(fmt::format("zstd stage: destination of {} bytes, needs {}",
                                       dst.size(), raw));
  ZSTD_DCtx* d = dctx();
  if (d == nullptr) return Status(Code::kNoSpace, "zstd stage: cannot allocate a context");
  std::size_t n = ZSTD_decompressDCtx(d, dst.data(), raw, encoded.data() + kZstdHeaderBytes,
                                      encoded.size() - kZstdHeaderBytes);
  if (ZSTD_isError(n)) return corrupt(ZSTD_getErrorName(n));
  if (n != raw) return corrupt(fmt::format("decompressed {} bytes, expected {}", n, raw));
  return n;
}

}  // namespace tier::zstd
