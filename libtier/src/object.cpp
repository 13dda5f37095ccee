#include "tier/object.hpp"

#include "tier/endian.hpp"

#define XXH_STATIC_LINKING_ONLY
#include <fmt/format.h>
#include <immintrin.h>
#include <xxhash.h>
#ifdef TIER_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>  // XXH3_64bits(_update) become their runtime-dispatched forms
#endif

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "copy_xxh3.hpp"
#include "verify_pool.hpp"

namespace tier {
namespace {

constexpr std::size_t kHeaderChecksumOffset = 88;
// Version 2 chunk checksums computed per round of the verification threads (their list, 4 KiB,
// lives on the caller's stack; larger payloads take several rounds).
constexpr std::size_t kWindowChunks = 512;

void store_key(std::byte* p, const Key128& k) noexcept {
  put_le(p, k.lo);
  put_le(p + 8, k.hi);
}
Key128 load_key(const std::byte* p) noexcept {
  return Key128{get_le<std::uint64_t>(p), get_le<std::uint64_t>(p + 8)};
}

// A place in a sequence of spans (stored pieces or destination regions): which one, and the
// offset in it. No default values: the windows' arrays of 512 places are written before they are
// read, and zeroing 8 KiB per object was a fifth of a small load's time; `Pos p{}` is the start.
struct Pos {
  std::size_t i;
  std::size_t off;
};

// Moves `p`, which lies at offset `at` of the spans' concatenation (`size(i)`: the i-th span's
// bytes), forward to offset `target`, which is smaller than their total.
template <class SizeOf>
void advance(Pos& p, std::uint64_t& at, std::uint64_t target, const SizeOf& size) noexcept {
  while (at + (size(p.i) - p.off) <= target) {
    at += size(p.i) - p.off;
    p = Pos{p.i + 1, 0};
  }
  p.off += static_cast<std::size_t>(target - at);
  at = target;
}

// The version 2 checksum of a payload of `n` bytes: `chunk_hash(i)` (the XXH3-64 of chunk i,
// called once per chunk on the verification threads) feeds the chunk list, window by window;
// `before_window(first, count)` runs on the caller before each window's chunks are hashed.
template <class ChunkHash, class BeforeWindow>
std::uint64_t chunked_checksum(std::uint64_t n, ChunkHash& chunk_hash,
                               BeforeWindow&& before_window) noexcept {
  const std::uint64_t chunks = checksum_chunk_count(n);
  std::array<std::uint64_t, kWindowChunks> sums;
  std::array<std::byte, kWindowChunks * 8> le;
  auto window = [&](std::uint64_t first, std::size_t count) {  // its list entries into `le`
    before_window(first, count);
    auto task = [&](std::size_t i) { sums[i] = chunk_hash(first + i); };
    if (n < kPooledPayloadBytes)
      for (std::size_t i = 0; i < count; ++i) task(i);
    else
      detail::VerifyPool::instance().for_each(count, task);
    for (std::size_t i = 0; i < count; ++i) put_le<std::uint64_t>(le.data() + 8 * i, sums[i]);
  };
  if (chunks <= kWindowChunks) {  // the list in one call: the same XXH3, without a stream's state
    window(0, static_cast<std::size_t>(chunks));
    return XXH3_64bits(le.data(), 8 * static_cast<std::size_t>(chunks));
  }
  XXH3_state_t list;
  XXH3_64bits_reset(&list);
  for (std::uint64_t first = 0; first < chunks; first += kWindowChunks) {
    const auto count =
        static_cast<std::size_t>(std::min<std::uint64_t>(kWindowChunks, chunks - first));
    window(first, count);
    XXH3_64bits_update(&list, le.data(), 8 * count);
  }
  return XXH3_64bits_digest(&list);
}

std::uint64_t chunked_checksum(std::span<const std::byte> payload) noexcept {
  auto hash = [&](std::uint64_t c) {
    const std::size_t off = static_cast<std::size_t>(c) * kChecksumChunkBytes;
    return XXH3_64bits(payload.data() + off, std::min(kChecksumChunkBytes, payload.size() - off));
  };
  return chunked_checksum(payload.size(), hash, [](std::uint64_t, std::size_t) {});
}

// The payload checksum of `version` of bytes [skip, skip + payload_bytes) of the concatenation
// of `count` pieces (`piece(i)`: the i-th, a span of const bytes), which hold at least that many
// bytes. Version 2: a chunk that lies inside one piece is hashed in place; one that spans pieces
// is hashed by streaming its parts; either way on the verification threads.
template <class PieceAt>
std::uint64_t pieces_checksum(std::size_t count, const PieceAt& piece, std::uint64_t skip,
                              std::uint64_t payload_bytes, std::uint16_t version) noexcept {
  if (version == kObjectVersionWholePayload) {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    std::uint64_t off = 0;
    for (std::size_t i = 0; i < count && off < skip + payload_bytes; ++i) {
      const std::span<const std::byte> p = piece(i);
      const std::uint64_t lo = std::max(off, skip);
      const std::uint64_t hi = std::min<std::uint64_t>(off + p.size(), skip + payload_bytes);
      if (lo < hi) XXH3_64bits_update(&state, p.data() + (lo - off), hi - lo);
      off += p.size();
    }
    return XXH3_64bits_digest(&state);
  }
  // Where each chunk of the window starts: (piece, offset in it), found by one walk.
  std::array<Pos, kWindowChunks> at;
  Pos cursor{};
  std::uint64_t cursor_at = 0;  // offset of `cursor` in the concatenation
  std::uint64_t window_first = 0;
  auto piece_size = [&](std::size_t i) { return piece(i).size(); };
  auto before = [&](std::uint64_t first, std::size_t n) {
    window_first = first;
    for (std::size_t i = 0; i < n; ++i) {
      advance(cursor, cursor_at, skip + (first + i) * kChecksumChunkBytes, piece_size);
      at[i] = cursor;
    }
  };
  auto hash = [&](std::uint64_t c) {
    const std::size_t len = static_cast<std::size_t>(
        std::min<std::uint64_t>(kChecksumChunkBytes, payload_bytes - c * kChecksumChunkBytes));
    Pos a = at[static_cast<std::size_t>(c - window_first)];
    std::span<const std::byte> p = piece(a.i);
    if (p.size() - a.off >= len) return XXH3_64bits(p.data() + a.off, len);
    XXH3_state_t state;  // a chunk across pieces
    XXH3_64bits_reset(&state);
    for (std::size_t left = len; left > 0; a = Pos{a.i + 1, 0}) {
      p = piece(a.i);
      const std::size_t n = std::min(left, p.size() - a.off);
      XXH3_64bits_update(&state, p.data() + a.off, n);
      left -= n;
    }
    return XXH3_64bits_digest(&state);
  };
  return chunked_checksum(payload_bytes, hash, before);
}

}  // namespace

std::uint64_t checksum_chunk_count(std::uint64_t payload_bytes) noexcept {
  return (payload_bytes + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
}

std::uint64_t chunk_list_checksum(std::span<const std::uint64_t> chunk_checksums) noexcept {
  XXH3_state_t list;
  XXH3_64bits_reset(&list);
  for (std::uint64_t c : chunk_checksums) {
    std::byte le[8];
    put_le<std::uint64_t>(le, c);
    XXH3_64bits_update(&list, le, sizeof le);
  }
  return XXH3_64bits_digest(&list);
}

std::uint64_t payload_checksum(std::span<const std::byte> payload, std::uint16_t version) noexcept {
  if (version == kObjectVersionWholePayload) return XXH3_64bits(payload.data(), payload.size());
  return chunked_checksum(payload);
}

std::uint64_t payload_checksum(RegionList payload, std::uint16_t version) noexcept {
  if (payload.size() == 1) return payload_checksum(payload[0].bytes(), version);
  auto piece = [&](std::size_t i) { return std::span<const std::byte>(payload[i].bytes()); };
  return pieces_checksum(payload.size(), piece, 0, total_bytes(payload), version);
}

unsigned verify_threads() noexcept { return detail::VerifyPool::instance().threads(); }

void set_verify_threads(unsigned threads) noexcept {
  detail::VerifyPool::instance().set_threads(threads);
}

VerifyCpuShare::VerifyCpuShare(unsigned processes) noexcept
    : outer_(std::exchange(detail::VerifyPool::share(), std::max(processes, 1u))) {}

VerifyCpuShare::~VerifyCpuShare() { detail::VerifyPool::share() = outer_; }

void for_each_on_verify_threads(std::size_t count, void (*fn)(void* ctx, std::size_t i) noexcept,
                                void* ctx) noexcept {
  detail::VerifyPool::instance().run(count, fn, ctx);
}

void write_object_header(std::span<std::byte> image, const ObjectHeader& h) noexcept {
  std::byte* p = image.data();
  std::memset(p, 0, kObjectHeaderBytes);
  put_le<std::uint32_t>(p + 0, kObjectMagic);
  put_le<std::uint16_t>(p + 4, h.version);
  put_le<std::uint16_t>(p + 6, static_cast<std::uint16_t>(kObjectHeaderBytes));
  put_le<std::uint32_t>(p + 8, h.format_id);
  put_le<std::uint32_t>(p + 12, h.stage_id);
  store_key(p + 16, h.key.ns);
  store_key(p + 32, h.key.id);
  put_le<std::uint32_t>(p + 48, h.key.rank);
  put_le<std::uint32_t>(p + 52, 0);
  put_le<std::uint64_t>(p + 56, h.payload_bytes);
  put_le<std::uint64_t>(p + 64, h.payload_checksum);
  put_le<std::uint64_t>(p + kHeaderChecksumOffset, XXH3_64bits(p, kHeaderChecksumOffset));
}

void seal_object(std::span<std::byte> image, std::uint32_t format_id, std::uint32_t stage_id,
                 const ObjectKey& key, std::uint16_t version) noexcept {
  auto payload = image.subspan(kObjectHeaderBytes);
  write_object_header(image, ObjectHeader{format_id, stage_id, key, payload.size(),
                                          payload_checksum(payload, version), version});
}

Result<ObjectHeader> parse_object_header(std::span<const std::byte> image) noexcept {
  if (image.size() < kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch,
                  fmt::format("image of {} bytes is shorter than its header", image.size()));
  const std::byte* p = image.data();
  if (get_le<std::uint32_t>(p) != kObjectMagic)
    return Status(Code::kChecksumMismatch, "bad object magic");
  const auto version = get_le<std::uint16_t>(p + 4);
  if ((version != kObjectVersion && version != kObjectVersionWholePayload) ||
      get_le<std::uint16_t>(p + 6) != kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "unsupported object header version");
  if (get_le<std::uint64_t>(p + kHeaderChecksumOffset) != XXH3_64bits(p, kHeaderChecksumOffset))
    return Status(Code::kChecksumMismatch, "object header checksum mismatch");
  if (get_le<std::uint32_t>(p + 52) != 0)
    return Status(Code::kChecksumMismatch, "unknown object header flags");
  ObjectHeader h;
  h.format_id = get_le<std::uint32_t>(p + 8);
  h.stage_id = get_le<std::uint32_t>(p + 12);
  h.key.ns = load_key(p + 16);
  h.key.id = load_key(p + 32);
  h.key.rank = get_le<std::uint32_t>(p + 48);
  h.payload_bytes = get_le<std::uint64_t>(p + 56);
  h.payload_checksum = get_le<std::uint64_t>(p + 64);
  h.version = version;
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
  if (payload_checksum(image.subspan(kObjectHeaderBytes), h->version) != h->payload_checksum)
    return Status(Code::kChecksumMismatch, "object payload checksum mismatch");
  return Status::ok();
}

Status verify_payload(std::span<const std::span<const std::byte>> pieces,
                      const ObjectHeader& h) noexcept {
  std::uint64_t total = 0;
  for (const auto& p : pieces) total += p.size();
  if (total != kObjectHeaderBytes + h.payload_bytes)
    return Status(Code::kChecksumMismatch, "object length does not match its header");
  auto piece = [&](std::size_t i) { return pieces[i]; };
  if (pieces_checksum(pieces.size(), piece, kObjectHeaderBytes, h.payload_bytes, h.version) !=
      h.payload_checksum)
    return Status(Code::kChecksumMismatch, "object payload checksum mismatch");
  return Status::ok();
}

namespace {

// Copies with non-temporal stores, which skip the read-for-ownership of a plain memcpy: for large
// destinations nobody reads soon. The caller fences (_mm_sfence) before it reports the bytes.
__attribute__((target("avx2"))) void stream_copy_avx2(std::byte* dst, const std::byte* src,
                                                      std::size_t n) noexcept {
  std::size_t i = std::min(n, (32 - reinterpret_cast<std::uintptr_t>(dst) % 32) % 32);
  std::memcpy(dst, src, i);  // up to the first 32-byte boundary of `dst`
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
// The smallest copy written with non-temporal stores, per Stores.
constexpr std::size_t kCachedStreamFrom = 256 * 1024, kStreamedFrom = 4 * 1024;

// Whether a copy of `n` bytes uses non-temporal stores.
bool streams(std::size_t n, Stores stores) noexcept {
  return kHaveAvx2 && n >= (stores == Stores::kStreamed ? kStreamedFrom : kCachedStreamFrom);
}

// The last-level cache as this CPU sees it: the size of cpu0's highest cache level in sysfs
// ("32768K"). glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) counts the whole package's L3: 320 MiB on a
// virtual machine whose two CPUs share 32 MiB. 32 MiB when sysfs does not say; kept within
// [1 MiB, 1 GiB] whatever it says.
std::uint64_t last_level_cache_bytes() noexcept {
  int best_level = 0;
  std::uint64_t bytes = std::uint64_t{32} << 20;
  for (int i = 0; i < 16; ++i) {
    char path[64];
    int level = 0;
    unsigned long long n = 0;
    char unit = 0;
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    if (FILE* f = std::fopen(path, "r")) {
      if (std::fscanf(f, "%d", &level) != 1) level = 0;
      std::fclose(f);
    }
    if (level <= best_level) continue;
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    const int got = std::fscanf(f, "%llu%c", &n, &unit);
    std::fclose(f);
    if (got < 1 || n == 0 || n > (1ull << 30)) continue;  // shifted below by at most 30
    best_level = level;
    bytes = unit == 'K' ? n << 10 : unit == 'M' ? n << 20 : unit == 'G' ? n << 30 : n;
  }
  return std::clamp<std::uint64_t>(bytes, 1u << 20, 1u << 30);
}

}  // namespace

Stores stores_for_batch(std::uint64_t batch_bytes) noexcept {
  static const std::uint64_t from = last_level_cache_bytes() / 4;
  return batch_bytes >= from ? Stores::kStreamed : Stores::kCached;
}

void copy_bytes(void* dst, const void* src, std::size_t n, Stores stores) noexcept {
  if (!streams(n, stores)) {
    std::memcpy(dst, src, n);
    return;
  }
  if (n < kSpreadCopyBytes) {
    stream_copy_avx2(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), n);
    _mm_sfence();
    return;
  }
  // One piece per thread the pool may use (whole 64 KiB chunks at least), each fenced once by the
  // thread that streamed it (a fence waits for that thread's streamed stores); one piece, on the
  // caller, while the transfers' own threads keep the memory bus busy.
  auto& pool = detail::VerifyPool::instance();
  const std::size_t pieces =
      pool.crowded() ? 1
                     : std::min<std::size_t>(pool.threads(),
                                             (n + kChecksumChunkBytes - 1) / kChecksumChunkBytes);
  const std::size_t step = n / pieces / 64 * 64;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  auto piece = [&](std::size_t k) {
    const std::size_t lo = k * step, hi = k + 1 == pieces ? n : lo + step;
    stream_copy_avx2(d + lo, s + lo, hi - lo);
    _mm_sfence();
  };
  pool.for_each(pieces, piece);
}

Status copy_verified(std::span<std::byte> dst, std::span<const std::byte> stored,
                     const ObjectKey& expected, Stores stores) noexcept {
  auto h = parse_object_header(stored);
  // A failed copy leaves no valid header in `dst`, not even one of an earlier copy.
  auto mismatch = [&](Status why) {
    scrub_object(dst);
    return why;
  };
  if (!h) return mismatch(h.status());
  if (!(h->key == expected))
    return mismatch(Status(Code::kChecksumMismatch, "object header names another key"));
  if (h->payload_bytes != stored.size() - kObjectHeaderBytes)
    return mismatch(Status(Code::kChecksumMismatch, "object length does not match its header"));
  if (dst.size() < stored.size())
    return Status::invalid("destination smaller than the object");
  constexpr std::size_t kSlice = 16 * 1024;  // hashed, then copied while hot
  const bool stream = streams(stored.size(), stores);
  const std::byte* src = stored.data() + kObjectHeaderBytes;
  std::byte* out = dst.data() + kObjectHeaderBytes;
  // Hashes payload bytes [begin, begin + n) into `state` and copies them, slice by slice.
  auto copy_range = [&](XXH3_state_t& state, std::size_t begin, std::size_t n) {
    for (std::size_t off = begin; off < begin + n; off += kSlice) {
      const std::size_t m = std::min(kSlice, begin + n - off);
      XXH3_64bits_update(&state, src + off, m);  // brings the slice into cache
      if (stream)
        stream_copy_avx2(out + off, src + off, m);
      else
        std::memcpy(out + off, src + off, m);
    }
    if (stream) _mm_sfence();  // this thread's streamed bytes land before it reports the chunk
  };
  const auto payload = static_cast<std::size_t>(h->payload_bytes);
  std::uint64_t sum;
  if (h->version == kObjectVersionWholePayload) {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    copy_range(state, 0, payload);
    sum = XXH3_64bits_digest(&state);
  } else {
    auto chunk = [&](std::uint64_t c) {
      const std::size_t off = static_cast<std::size_t>(c) * kChecksumChunkBytes;
      XXH3_state_t state;
      XXH3_64bits_reset(&state);
      copy_range(state, off, std::min(kChecksumChunkBytes, payload - off));
      return XXH3_64bits_digest(&state);
    };
    sum = chunked_checksum(payload, chunk, [](std::uint64_t, std::size_t) {});
  }
  if (sum != h->payload_checksum)
    return mismatch(Status(Code::kChecksumMismatch, "object payload checksum mismatch"));
  std::memcpy(dst.data(), stored.data(), kObjectHeaderBytes);
  return Status::ok();
}

namespace {

// Visits the bytes [from, end) of an image held as `stored` pieces, piece by piece.
template <class Fn>
void each_stored(std::span<const std::span<std::byte>> stored, std::size_t from, Fn&& fn) {
  std::size_t off = 0;
  for (const auto& p : stored) {
    if (off + p.size() > from) {
      std::size_t skip = from > off ? from - off : 0;
      fn(p.data() + skip, p.size() - skip);
    }
    off += p.size();
  }
}

}  // namespace

Status seal_into(std::span<const std::span<std::byte>> pieces, std::span<const std::byte> header,
                 RegionList payload, Stores stores) noexcept {
  if (header.size() != kObjectHeaderBytes)
    return Status::invalid("seal: the header buffer is not kObjectHeaderBytes");
  auto h = parse_object_header(header);
  if (!h) return Status::invalid(fmt::format("seal: {}", h.status().message()));
  const std::uint64_t n = total_bytes(payload);
  std::uint64_t stored = 0;
  for (const auto& p : pieces) stored += p.size();
  if (h->payload_bytes != n || stored != kObjectHeaderBytes + n)
    return Status::invalid(
        fmt::format("seal: header declares {} payload bytes, the regions hold {}, the storage {}",
                    h->payload_bytes, n, stored));
  // Moves `len` bytes from the regions `from` at `s` into the pieces at `d`, part by part.
  auto copy_parts = [&](RegionList from, Pos s, Pos d, std::size_t len) {
    while (len > 0) {
      while (from[s.i].size == s.off) s = Pos{s.i + 1, 0};
      while (pieces[d.i].size() == d.off) d = Pos{d.i + 1, 0};
      const std::size_t k = std::min({len, from[s.i].size - s.off, pieces[d.i].size() - d.off});
      std::memcpy(pieces[d.i].data() + d.off, from[s.i].data + s.off, k);
      s.off += k;
      d.off += k;
      len -= k;
    }
  };
  auto region_size = [&](std::size_t i) { return payload[i].size; };
  auto piece_size = [&](std::size_t i) { return pieces[i].size(); };
  Pos s{}, d{};
  std::uint64_t s_at = 0, d_at = 0;  // offsets of `s` in the payload, of `d` in the image
  if (h->version == kObjectVersionWholePayload) {  // older images: copied, then hashed
    if (n > 0) {
      advance(d, d_at, kObjectHeaderBytes, piece_size);
      copy_parts(payload, s, d, static_cast<std::size_t>(n));
    }
    auto piece = [&](std::size_t i) { return std::span<const std::byte>(pieces[i]); };
    h->payload_checksum = pieces_checksum(pieces.size(), piece, kObjectHeaderBytes, n, h->version);
  } else {
    const bool stream = streams(n, stores);
    std::array<Pos, kWindowChunks> from, to;
    std::uint64_t window_first = 0;
    auto before = [&](std::uint64_t first, std::size_t count) {
      window_first = first;
      for (std::size_t k = 0; k < count; ++k) {
        advance(s, s_at, (first + k) * kChecksumChunkBytes, region_size);
        advance(d, d_at, kObjectHeaderBytes + (first + k) * kChecksumChunkBytes, piece_size);
        from[k] = s;
        to[k] = d;
      }
    };
    auto chunk = [&](std::uint64_t c) {
      const auto len = static_cast<std::size_t>(
          std::min<std::uint64_t>(kChecksumChunkBytes, n - c * kChecksumChunkBytes));
      const Pos a = from[static_cast<std::size_t>(c - window_first)];
      const Pos b = to[static_cast<std::size_t>(c - window_first)];
      std::uint64_t sum;
      if (payload[a.i].size - a.off >= len && pieces[b.i].size() - b.off >= len) {
        sum = detail::copy_xxh3(pieces[b.i].data() + b.off, payload[a.i].data + a.off, len, stream);
        if (stream) _mm_sfence();  // this thread's streamed bytes land before it reports them
        return sum;
      }
      copy_parts(payload, a, b, len);  // a chunk across regions or pieces: copied, then hashed stored
      XXH3_state_t state;
      XXH3_64bits_reset(&state);
      std::size_t left = len;
      for (Pos p = b; left > 0; p = Pos{p.i + 1, 0}) {
        const std::size_t k = std::min(left, pieces[p.i].size() - p.off);
        XXH3_64bits_update(&state, pieces[p.i].data() + p.off, k);
        left -= k;
      }
      return XXH3_64bits_digest(&state);
    };
    h->payload_checksum = chunked_checksum(n, chunk, before);
  }
  std::array<std::byte, kObjectHeaderBytes> sealed;
  write_object_header(sealed, *h);
  const Region head[] = {host_region(sealed)};
  copy_parts(head, Pos{}, Pos{}, kObjectHeaderBytes);
  return Status::ok();
}

std::size_t copy_head(std::span<const std::span<std::byte>> pieces,
                      std::span<std::byte> out) noexcept {
  std::size_t got = 0;
  for (const auto& p : pieces) {
    if (got == out.size()) break;
    const std::size_t take = std::min(p.size(), out.size() - got);
    std::memcpy(out.data() + got, p.data(), take);
    got += take;
  }
  return got;
}

Result<ObjectHeader> check_scattered_header(std::span<const std::span<std::byte>> stored,
                                            std::span<const std::byte> expected_header,
                                            std::uint64_t payload_bytes,
                                            const ObjectKey& expected) noexcept {
  auto want = expected_header.size() == kObjectHeaderBytes
                  ? parse_object_header(expected_header)
                  : Result<ObjectHeader>(Status::invalid(""));
  if (!want) return Status::invalid("scattered get: no expected header in the header buffer");
  std::size_t total = 0;
  for (const auto& p : stored) total += p.size();
  if (total < kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "image is shorter than its header");
  std::byte head[kObjectHeaderBytes];
  copy_head(stored, head);
  auto h = parse_object_header(std::span<const std::byte>(head, kObjectHeaderBytes));
  if (!h) return h.status();
  if (!(h->key == expected))
    return Status(Code::kChecksumMismatch, "object header names another key");
  if (h->payload_bytes != total - kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "object length does not match its header");
  if (h->format_id != want->format_id || h->stage_id != want->stage_id)
    return Status::invalid(fmt::format("object has layout {} (stage {}), the caller expects {} ({})",
                                       h->format_id, h->stage_id, want->format_id,
                                       want->stage_id));
  if (h->payload_bytes != payload_bytes)
    return Status::invalid(
        fmt::format("stored payload is {} bytes, these regions take {}: nothing written",
                    h->payload_bytes, payload_bytes));
  return *h;
}

Result<std::optional<CrcClaim>> check_stored_payload(std::span<const std::span<std::byte>> stored,
                                                     const PayloadCheck* check,
                                                     bool split) noexcept {
  if (check == nullptr) return std::optional<CrcClaim>{};
  std::vector<std::span<std::byte>> payload;
  try {
    each_stored(stored, kObjectHeaderBytes, [&](const std::byte* p, std::size_t n) {
      payload.emplace_back(const_cast<std::byte*>(p), n);
    });
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "scattered get: out of memory");
  }
  if (split) return check->check_head(payload);
  TIER_RETURN_IF_ERROR(check->check(payload));
  return std::optional<CrcClaim>{};
}

Status check_scattered(std::span<const std::span<std::byte>> stored,
                       std::span<const std::byte> expected_header, std::uint64_t payload_bytes,
                       const ObjectKey& expected, std::span<std::byte> stored_header,
                       const PayloadCheck* check) noexcept {
  if (stored_header.size() != kObjectHeaderBytes)
    return Status::invalid("scattered get: the stored header needs 96 bytes");
  TIER_ASSIGN_OR_RETURN(ObjectHeader h,
                        check_scattered_header(stored, expected_header, payload_bytes, expected));
  auto piece = [&](std::size_t i) { return std::span<const std::byte>(stored[i]); };
  if (pieces_checksum(stored.size(), piece, kObjectHeaderBytes, h.payload_bytes, h.version) !=
      h.payload_checksum)
    return Status(Code::kChecksumMismatch, "object payload checksum mismatch");
  TIER_RETURN_IF_ERROR(check_stored_payload(stored, check).status());
  copy_head(stored, stored_header);
  return Status::ok();
}

namespace {

// Copies `n` bytes from the stored pieces at `s` into the regions at `d` (both hold them).
void copy_run(std::span<const std::span<std::byte>> stored, Pos s, RegionList dst, Pos d,
              std::size_t n, bool stream) noexcept {
  while (n > 0) {
    while (stored[s.i].size() == s.off) s = Pos{s.i + 1, 0};
    while (dst[d.i].size == d.off) d = Pos{d.i + 1, 0};
    const std::size_t k = std::min({n, stored[s.i].size() - s.off, dst[d.i].size - d.off});
    if (stream)
      stream_copy_avx2(dst[d.i].data + d.off, stored[s.i].data() + s.off, k);
    else
      std::memcpy(dst[d.i].data + d.off, stored[s.i].data() + s.off, k);
    s.off += k;
    d.off += k;
    n -= k;
  }
  if (stream) _mm_sfence();  // this thread's streamed bytes land before the run is reported
}

// scatter_verified's copy of a payload of several chunks, after every check: the payload's
// checksum chunks go to the verification threads as the hashing did (each thread copies whole
// chunks, so the bytes it hashed may still be in its cache), window by window; the positions of
// a window's chunks in the pieces and the regions are found by one walk on the caller.
void scatter_chunks(std::span<const std::span<std::byte>> stored, RegionList payload,
                    std::size_t skip, std::uint64_t payload_bytes, bool stream) noexcept {
  const std::uint64_t chunks = checksum_chunk_count(payload_bytes);
  std::array<Pos, kWindowChunks> from, to;
  std::array<std::size_t, kWindowChunks> len;
  Pos s{}, d{};
  std::uint64_t s_at = 0, d_at = 0;  // offsets of `s` in the stored image, of `d` in the regions
  auto piece_size = [&](std::size_t i) { return stored[i].size(); };
  auto region_size = [&](std::size_t i) { return payload[i].size; };
  for (std::uint64_t first = 0; first < chunks; first += kWindowChunks) {
    const auto count =
        static_cast<std::size_t>(std::min<std::uint64_t>(kWindowChunks, chunks - first));
    for (std::size_t k = 0; k < count; ++k) {
      // Chunk first + k's bytes of the payload that go to the regions (the framing, `skip`
      // bytes, goes nowhere).
      const std::uint64_t lo = std::max<std::uint64_t>((first + k) * kChecksumChunkBytes, skip);
      const std::uint64_t hi =
          std::min<std::uint64_t>((first + k + 1) * kChecksumChunkBytes, payload_bytes);
      len[k] = hi > lo ? static_cast<std::size_t>(hi - lo) : 0;
      if (len[k] == 0) continue;
      advance(s, s_at, kObjectHeaderBytes + lo, piece_size);
      advance(d, d_at, lo - skip, region_size);
      from[k] = s;
      to[k] = d;
    }
    auto copy = [&](std::size_t k) { copy_run(stored, from[k], payload, to[k], len[k], stream); };
    detail::VerifyPool::instance().for_each(count, copy);
  }
}

}  // namespace

Status scatter_verified(std::span<const std::span<std::byte>> stored, std::span<std::byte> header,
                        RegionList payload, const ObjectKey& expected, std::size_t skip,
                        const PayloadCheck* check, Stores stores) noexcept {
  std::byte head[kObjectHeaderBytes];
  const std::uint64_t payload_bytes = skip + total_bytes(payload);
  TIER_RETURN_IF_ERROR(check_scattered(stored, header, payload_bytes, expected,
                                       std::span<std::byte>(head, kObjectHeaderBytes), check));
  const bool stream = streams(static_cast<std::size_t>(payload_bytes), stores);
  if (payload_bytes >= kPooledPayloadBytes) {
    scatter_chunks(stored, payload, skip, payload_bytes, stream);
  } else if (payload_bytes > skip) {  // on this thread, which has just hashed it all
    Pos s{};
    std::uint64_t at = 0;
    advance(s, at, kObjectHeaderBytes + skip, [&](std::size_t i) { return stored[i].size(); });
    copy_run(stored, s, payload, Pos{}, static_cast<std::size_t>(payload_bytes - skip), stream);
  }
  std::memcpy(header.data(), head, kObjectHeaderBytes);
  return Status::ok();
}

void scrub_object(std::span<std::byte> image) noexcept {
  std::memset(image.data(), 0, std::min(image.size(), kObjectHeaderBytes));
}

}  // namespace tier
