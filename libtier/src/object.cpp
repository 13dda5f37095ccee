#include "tier/object.hpp"

#include "tier/endian.hpp"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include <immintrin.h>

#include <cstring>

#include <fmt/format.h>

namespace tier {
namespace {

constexpr std::size_t kHeaderChecksumOffset = 88;

void store_key(std::byte* p, const Key128& k) noexcept {
  put_le(p, k.lo);
  put_le(p + 8, k.hi);
}
Key128 load_key(const std::byte* p) noexcept {
  return Key128{get_le<std::uint64_t>(p), get_le<std::uint64_t>(p + 8)};
}

}  // namespace

std::uint64_t payload_checksum(std::span<const std::byte> payload) noexcept {
  return XXH3_64bits(payload.data(), payload.size());
}

void write_object_header(std::span<std::byte> image, const ObjectHeader& h) noexcept {
  std::byte* p = image.data();
  std::memset(p, 0, kObjectHeaderBytes);
  put_le<std::uint32_t>(p + 0, kObjectMagic);
  put_le<std::uint16_t>(p + 4, kObjectVersion);
  put_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(kObjectHeaderBytes));
  put_le<std::uint32_t>(p + 8, h.layout_id);
  put_le<std::uint32_t>(p + 12, h.stage_id);
  store_key(p + 16, h.key.ns);
  store_key(p + 32, h.key.id);
  put_le<std::uint32_t>(p + 48, h.key.rank);
  put_le<std::uint32_t>(p + 52, 0);
  put_le<std::uint64_t>(p + 56, h.payload_bytes);
  put_le<std::uint64_t>(p + 64, h.payload_checksum);
  put_le<std::uint64_t>(p + kHeaderChecksumOffset, XXH3_64bits(p, kHeaderChecksumOffset));
}

void seal_object(std::span<std::byte> image, std::uint32_t layout_id, std::uint32_t stage_id,
                 const ObjectKey& key) noexcept {
  auto payload = image.subspan(kObjectHeaderBytes);
  write_object_header(image, ObjectHeader{layout_id, stage_id, key, payload.size(),
                                          payload_checksum(payload)});
}

Result<ObjectHeader> parse_object_header(std::span<const std::byte> image) noexcept {
  if (image.size() < kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch,
                  fmt::format("image of {} bytes is shorter than its header", image.size()));
  const std::byte* p = image.data();
  if (get_le<std::uint32_t>(p) != kObjectMagic)
    return Status(Code::kChecksumMismatch, "bad object magic");
  if (get_le<std::uint16_t>(p + 4) != kObjectVersion ||
      get_le<std::uint16_t>(p + 6) != kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "unsupported object header version");
  if (get_le<std::uint64_t>(p + kHeaderChecksumOffset) != XXH3_64bits(p, kHeaderChecksumOffset))
    return Status(Code::kChecksumMismatch, "object header checksum mismatch");
  if (get_le<std::uint32_t>(p + 52) != 0)
    return Status(Code::kChecksumMismatch, "unknown object header flags");
  ObjectHeader h;
  h.layout_id = get_le<std::uint32_t>(p + 8);
  h.stage_id = get_le<std::uint32_t>(p + 12);
  h.key.ns = load_key(p + 16);
  h.key.id = load_key(p + 32);
  h.key.rank = get_le<std::uint32_t>(p + 48);
  h.payload_bytes = get_le<std::uint64_t>(p + 56);
  h.payload_checksum = get_le<std::uint64_t>(p + 64);
  return h;
}

Status verify_object(std::span<const std::byte> image, const ObjectKey& expected) noexcept {
  auto h = parse_object_header(image);
  if (!h) return h.status();
  if (!(h->key == expected))
    return Status(Code::kChecksumMismatch,
                  fmt::format("object holds key {}, expected {}", h->key.to_string(),
                              expected.to_string()));
  if (h->payload_bytes != image.size() - kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch,
                  fmt::format("object declares {} payload bytes, image has {}", h->payload_bytes,
                              image.size() - kObjectHeaderBytes));
  if (payload_checksum(image.subspan(kObjectHeaderBytes)) != h->payload_checksum)
    return Status(Code::kChecksumMismatch, "object payload checksum mismatch");
  return Status::ok();
}

namespace {

// Copy of one chunk that was just read (and is hot in cache): large destinations get
// non-temporal stores, which skip the read-for-ownership of a plain memcpy.
__attribute__((target("avx2"))) void stream_copy_avx2(std::byte* dst, const std::byte* src,
                                                      std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  if (i < n) std::memcpy(dst + i, src + i, n - i);
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

}  // namespace

Status copy_verified(std::span<std::byte> dst, std::span<const std::byte> stored,
                     const ObjectKey& expected) noexcept {
  auto h = parse_object_header(stored);
  if (!h) return h.status();
  if (!(h->key == expected))
    return Status(Code::kChecksumMismatch, "object header names another key");
  if (h->payload_bytes != stored.size() - kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "object length does not match its header");
  if (dst.size() < stored.size())
    return Status::invalid("destination smaller than the object");
  constexpr std::size_t kChunk = 16 * 1024;
  constexpr std::size_t kStreamFrom = 256 * 1024;
  const bool stream = kHaveAvx2 && stored.size() >= kStreamFrom &&
                      reinterpret_cast<std::uintptr_t>(dst.data() + kObjectHeaderBytes) % 32 == 0;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  const std::byte* src = stored.data() + kObjectHeaderBytes;
  std::byte* out = dst.data() + kObjectHeaderBytes;
  for (std::size_t off = 0; off < h->payload_bytes; off += kChunk) {
    std::size_t n = std::min(kChunk, static_cast<std::size_t>(h->payload_bytes) - off);
    XXH3_64bits_update(&state, src + off, n);  // brings the chunk into cache
    if (stream) stream_copy_avx2(out + off, src + off, n);
    else std::memcpy(out + off, src + off, n);
  }
  if (stream) _mm_sfence();
  if (XXH3_64bits_digest(&state) != h->payload_checksum) {
    scrub_object(dst);
    return Status(Code::kChecksumMismatch, "object payload checksum mismatch");
  }
  std::memcpy(dst.data(), stored.data(), kObjectHeaderBytes);
  return Status::ok();
}

void scrub_object(std::span<std::byte> image) noexcept {
  std::memset(image.data(), 0, std::min(image.size(), kObjectHeaderBytes));
}

}  // namespace tier
