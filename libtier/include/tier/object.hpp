#pragma once
// The stored object format (docs/object-format.md is normative). Every image a backend stores is
//
//   [ 96-byte header | payload ]
//
// header (all integers little-endian):
//   0  u32  magic "LTO1"          4  u16 version (1 or 2)     6  u16 header bytes (96)
//   8  u32  layout id of the region codec that made the raw payload
//   12 u32  stage id (0 = raw payload; else the stage codec, e.g. zstd, that transformed it)
//   16 16B  namespace id          32 16B object id             48 u32 rank   52 u32 flags (0)
//   56 u64  payload bytes         64 u64 payload checksum (below)
//   72 16B  reserved, zero        88 u64 XXH3-64 (seed 0) of header bytes [0, 88)
//
// The payload checksum depends on the version:
//   version 1: XXH3-64 (seed 0) of the whole payload (one hash, one thread);
//   version 2: the payload is cut into chunks of kChecksumChunkBytes (the last one shorter);
//              each chunk's XXH3-64 (seed 0), little-endian, in chunk order, forms the chunk
//              list, and the checksum is the XXH3-64 (seed 0) of that list. The list is not
//              stored: a reader recomputes it, one chunk per thread (verify_threads()).
// Writers emit version 2; readers accept both.
//
// Every backend read is verified (magic, version, header checksum, expected key, exact length,
// payload checksum) by Backend::poll before the completion is handed out; a failure is a miss
// with Code::kChecksumMismatch, counted in metrics, and the destination's header is scrubbed so
// the bytes cannot be mistaken for a valid object.
//
// Threads: every function may be called from any thread. Version 2 payloads of more than one
// chunk are hashed by the caller together with the process's verification threads (shared by all
// callers); nothing here calls user code.

#include <cstddef>
#include <cstdint>
#include <span>

#include "tier/codec.hpp"
#include "tier/key.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier {

inline constexpr std::size_t kObjectHeaderBytes = 96;
// How far past the start of a 64-byte cache line an image starts so that its payload starts on
// one (32 bytes): where the cpu tier stores images, and where a buffer for a whole image should
// start (checksums and copies of lines split in two run slower; backends/cpu/README.md).
inline constexpr std::size_t kImageLineOffset = (64 - kObjectHeaderBytes % 64) % 64;
inline constexpr std::uint32_t kObjectMagic = 0x314F544Cu;  // "LTO1" read little-endian
// The version writers emit, and the first one, which is still read.
inline constexpr std::uint16_t kObjectVersion = 2;
inline constexpr std::uint16_t kObjectVersionWholePayload = 1;
// Version 2's checksum chunk: fixed by the version.
inline constexpr std::size_t kChecksumChunkBytes = 64 * 1024;
// Payloads from this size on are hashed (and copied) by the verification threads, chunk by chunk;
// smaller ones by their caller alone: the chunks past the first hold less than half a chunk, less
// work than handing them to a worker costs (tierbench micro, 2026-12-02, 2 cores: a 64 KiB + 8 KiB
// payload saved 15-25% slower through the pool; from a 32 KiB tail on, loads gain). A backend may
// move several smaller objects at once on those threads (for_each_on_verify_threads).
inline constexpr std::uint64_t kPooledPayloadBytes = kChecksumChunkBytes + kChecksumChunkBytes / 2;
// Host copies of this many bytes and more are spread over the verification threads: copy_bytes()
// cuts one into a piece per thread, and the cpu tier moves a submit window of objects smaller
// than kPooledPayloadBytes holding this much at once. Below it, waking a worker (1-2 us) costs
// about what it saves.
inline constexpr std::size_t kSpreadCopyBytes = 256 * 1024;
// The largest payload a TierStack takes from a caller (256 TiB): far above any tier's capacity,
// and far enough below 2^64 that a header, padding or a codec's framing added to it cannot wrap.
inline constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{1} << 48;

struct ObjectHeader {
  std::uint32_t format_id = 0;
  std::uint32_t stage_id = 0;
  ObjectKey key;
  std::uint64_t payload_bytes = 0;
  std::uint64_t payload_checksum = 0;  // as `version` defines it
  std::uint16_t version = kObjectVersion;
};

// The payload checksum of `version` (1 or 2; anything else is treated as 2).
std::uint64_t payload_checksum(std::span<const std::byte> payload,
                               std::uint16_t version = kObjectVersion) noexcept;

// Version 2's parts: the number of checksum chunks of a payload (0 for an empty one), and the
// checksum of a chunk list (`chunk_checksums[i]` = XXH3-64 of chunk i).
std::uint64_t checksum_chunk_count(std::uint64_t payload_bytes) noexcept;
std::uint64_t chunk_list_checksum(std::span<const std::uint64_t> chunk_checksums) noexcept;
// The payload checksum of `version` of a payload given as host regions, in order: byte for byte
// payload_checksum() of their concatenation, without concatenating them (version 2: chunks span
// region boundaries; chunks that lie inside one region are hashed on the verification threads).
std::uint64_t payload_checksum(RegionList payload, std::uint16_t version = kObjectVersion) noexcept;

// Writes the header for `h` into the first kObjectHeaderBytes of `image` (which must be at least
// that long). `h.payload_checksum` is taken as given: compute it with payload_checksum() of
// `h.version`, which must be 1 or 2.
void write_object_header(std::span<std::byte> image, const ObjectHeader& h) noexcept;

// Frames a payload already placed at image[kObjectHeaderBytes, +payload_bytes): computes the
// payload checksum and writes the header, in `version` (tests write version 1 images with it).
void seal_object(std::span<std::byte> image, std::uint32_t format_id, std::uint32_t stage_id,
                 const ObjectKey& key, std::uint16_t version = kObjectVersion) noexcept;

// Parses and checks the header only (magic, version 1 or 2, size field, header checksum, flags).
// Returns: the header, or kChecksumMismatch.
Result<ObjectHeader> parse_object_header(std::span<const std::byte> image) noexcept;

// Verifies the payload of an image held as host byte ranges (`pieces`, in image order, the header
// first; together exactly kObjectHeaderBytes + h.payload_bytes bytes) against its parsed header:
// for pinned transfers, which start the DMA of the pieces first and verify while it runs.
// Returns: Ok, or kChecksumMismatch (also when the pieces hold another number of bytes).
Status verify_payload(std::span<const std::span<const std::byte>> pieces,
                      const ObjectHeader& h) noexcept;

// Full verification of an image read back for `expected`: header, key, exact total length and
// payload checksum. Returns: Ok or kChecksumMismatch (with what differed).
Status verify_object(std::span<const std::byte> image, const ObjectKey& expected) noexcept;

// How a host copy writes its destination. Non-temporal stores skip the read-for-ownership of each
// line a cached store pays (a third fewer bytes over the memory bus) but leave the bytes out of the
// caches, where a small copy's reader would have found them.
//  - kCached: non-temporal from 256 KiB (with AVX2): an object's copy on its own.
//  - kStreamed: non-temporal from 4 KiB: a copy of a batch that holds more than the caches do (its
//    last copies evict its first ones anyway). tierbench micro --stack, 64 KiB objects, 2-core
//    EPYC with 32 MiB of L3, 2026-12-04: a batch of 16 or 32 MiB saved and loaded 1.2-1.4x
//    faster streamed, one of 8 MiB the same, one of 1-4 MiB 1.5-2.2x slower.
enum class Stores : std::uint8_t { kCached, kStreamed };
// kStreamed when a batch of `batch_bytes` (IoRequest::batch_bytes) reaches a quarter of the
// last-level cache this CPU sees (sysfs; 32 MiB when it does not say), else kCached. Any thread.
Stores stores_for_batch(std::uint64_t batch_bytes) noexcept;

// Copies a stored image into `dst` while verifying it (header, key, exact length, payload
// checksum), in one pass over the bytes: for backends whose objects live in host memory, this
// costs about what a plain memcpy costs (version 2: each chunk is hashed and copied by one of the
// verification threads, so large images copy faster than one memcpy). The header is written
// last, only when everything matched; on a mismatch `dst`'s header bytes are zeroed (whatever
// they held before) and its payload bytes are unspecified. Returns: Ok, kChecksumMismatch, or
// kInvalidArgument when `dst` is smaller than the image.
Status copy_verified(std::span<std::byte> dst, std::span<const std::byte> stored,
                     const ObjectKey& expected, Stores stores = Stores::kCached) noexcept;

// memcpy(dst, src, n) for the tiers' copies into and out of their storage (not overlapping), with
// non-temporal stores as `stores` says (so many threads copying at once move a third fewer bytes
// over the memory bus). A copy of 256 KiB or more is spread over the verification threads (one
// piece each) while at most half of them are inside transfers (one thread's copy moves a fraction
// of what the memory bus does), on the caller alone otherwise; every byte is visible to other
// threads when it returns.
void copy_bytes(void* dst, const void* src, std::size_t n,
                Stores stores = Stores::kCached) noexcept;

// Copies a stored image, given as pieces in image order, to a scattered destination: its payload
// into `payload` (host regions, in order), then its header into `header` (kObjectHeaderBytes),
// which on entry holds a header naming the layout and stage ids the caller accepts. Everything is
// checked before the first byte is written: the stored header, the expected key, layout and
// stage ids, a payload of exactly total_bytes(payload) bytes, and the payload checksum (so the
// payload is read twice; the second read is from cache for objects that fit there). A payload of
// more than one checksum chunk is then copied by the verification threads, chunk by chunk, as it
// was hashed. Returns: Ok,
// kChecksumMismatch, or kInvalidArgument (another layout or stage, another size, no expected
// header); nothing is written unless Ok.
// `skip` payload bytes before the regions' go nowhere; `check`, when set, is called with the
// whole stored payload (in pieces) after its checksum matched and before anything is written.
Status scatter_verified(std::span<const std::span<std::byte>> stored, std::span<std::byte> header,
                        RegionList payload, const ObjectKey& expected, std::size_t skip = 0,
                        const PayloadCheck* check = nullptr,
                        Stores stores = Stores::kCached) noexcept;

// Writes an image into `pieces` (a tier's storage, in order; together exactly kObjectHeaderBytes
// plus the payload's bytes) from `header` (kObjectHeaderBytes written by write_object_header,
// its payload checksum not read) and `payload` (host regions, in order): the payload is copied
// and its checksum computed from the same loads (one read of the payload: version 2's chunks on
// the verification threads, hashed as they are copied), then the header, with that checksum,
// last. For tiers that declare Capabilities::seals_puts. Returns: Ok, or kInvalidArgument (a
// header that does not parse or declares another payload size, pieces of another size); the
// pieces' bytes are unspecified unless Ok.
Status seal_into(std::span<const std::span<std::byte>> pieces, std::span<const std::byte> header,
                 RegionList payload, Stores stores = Stores::kCached) noexcept;

// Copies the first min(out.size(), their total) bytes of `pieces` (in order) into `out`; returns
// how many. For headers of images and frames held in several pieces.
std::size_t copy_head(std::span<const std::span<std::byte>> pieces, std::span<std::byte> out) noexcept;

// The checks of scatter_verified() without its copy, for a tier that moves the payload itself
// (a pinned tier's copy kernel into device memory): the stored image held by `stored` against
// `expected_header` (the caller's layout and stage ids), `expected` key and a payload of exactly
// `payload_bytes`, payload checksum included, then `check` (when set) over the payload. On Ok,
// `stored_header` holds the stored header's kObjectHeaderBytes. Returns what scatter_verified()
// returns; nothing is written but `stored_header`.
Status check_scattered(std::span<const std::span<std::byte>> stored,
                       std::span<const std::byte> expected_header, std::uint64_t payload_bytes,
                       const ObjectKey& expected, std::span<std::byte> stored_header,
                       const PayloadCheck* check = nullptr) noexcept;

// check_scattered() in two parts, for a tier that verifies the payload checksum elsewhere (a
// pinned tier, on the GPU where the bytes land):
//   check_scattered_header  everything before the payload's bytes are read: the stored header,
//                           `expected` key, exact length, the caller's layout and stage ids and
//                           a payload of `payload_bytes`; returns the stored header.
//   check_stored_payload    `check` (when set) over the stored payload, in pieces: its check(),
//                           or with `split` its check_head(), whose claim (when it makes one)
//                           the caller then owes (Ok(nullopt) otherwise).
// Both return what check_scattered() returns and write nothing.
Result<ObjectHeader> check_scattered_header(std::span<const std::span<std::byte>> stored,
                                            std::span<const std::byte> expected_header,
                                            std::uint64_t payload_bytes,
                                            const ObjectKey& expected) noexcept;
Result<std::optional<CrcClaim>> check_stored_payload(std::span<const std::span<std::byte>> stored,
                                                     const PayloadCheck* check,
                                                     bool split = false) noexcept;

// Overwrites the header so a failed image can never be parsed as valid.
void scrub_object(std::span<std::byte> image) noexcept;

// The host threads that verify version 2 payloads, the calling thread included: from
// TIER_VERIFY_THREADS when set (1 = the caller alone), else min(hardware threads, 8). Shared by
// every tier and thread of the process. set_verify_threads() changes it for later calls (0 picks
// the default again); the benchmarks use it to compare thread counts.
unsigned verify_threads() noexcept;
void set_verify_threads(unsigned threads) noexcept;

// While it lives, verification started on this thread shares the host's CPUs with `processes`
// processes (this one included) that verify at once: it uses at most max(1, CPUs / processes)
// threads, the caller included (CPUs: the process's affinity mask), so that N processes do not
// each wake a pool sized for the whole host onto the same cores. The shm tier sets it to its
// segment's clients around each get (docs/shm.md "Performance"). 0 and 1: no other process.
// Scopes nest; the innermost holds. Threads: a per-thread setting; any thread.
class VerifyCpuShare {
 public:
  explicit VerifyCpuShare(unsigned processes) noexcept;
  ~VerifyCpuShare();
  VerifyCpuShare(const VerifyCpuShare&) = delete;
  VerifyCpuShare& operator=(const VerifyCpuShare&) = delete;

 private:
  unsigned outer_;
};

// Calls fn(ctx, i) once for every i in [0, count) on the verification threads (the caller
// included) and returns when every call has returned: for codecs that check a large frame in
// independent pieces (dsv4 AOS1's CRC-32), and for a backend that copies a submit's objects of
// less than kPooledPayloadBytes each at once (the cpu tier). `fn` must not throw, block on another
// verification job or call this again (directly or through a copy of a payload of
// kPooledPayloadBytes or more). Every call runs under the same rules as a payload's chunks: on
// the caller alone while the process's other transfers keep its CPUs busy.
void for_each_on_verify_threads(std::size_t count, void (*fn)(void* ctx, std::size_t i) noexcept,
                                void* ctx) noexcept;

}  // namespace tier
