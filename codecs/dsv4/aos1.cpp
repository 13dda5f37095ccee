#include "aos1.hpp"

#include "tier/object.hpp"
#include "tier/endian.hpp"

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

std::uint32_t crc32_of(std::span<const std::byte> data) noexcept {
  // A SLOT frame is tens of MiB: its CRC is computed in 1 MiB pieces on the verification threads
  // and the pieces' CRCs combined (crc32_combine), byte for byte zlib's crc32 of the whole.
  static constexpr std::size_t kPiece = std::size_t{1} << 20;
  static constexpr auto crc_of = [](const std::byte* p, std::size_t n) noexcept {
    return crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(p), n);
  };
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

Aos1Error check_aos1(std::span<const std::span<std::byte>> frame, const Aos1Expect& x,
                     Aos1Header& h) noexcept {
  std::size_t total = 0;
  for (const auto& p : frame) total += p.size();
  // (1) length, (2) one snapshot of the header: later checks never re-read the source.
  if (total < kAos1HeaderBytes) return Aos1Error::kTruncated;
  std::array<std::byte, kAos1HeaderBytes> snap;
  std::size_t got = 0;
  for (const auto& p : frame) {
    const std::size_t take = std::min(p.size(), snap.size() - got);
    std::memcpy(snap.data() + got, p.data(), take);
    got += take;
    if (got == snap.size()) break;
  }
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
  // (6) exact total length, (7) CRC, piece by piece (crc32_combine).
  if (total - kAos1HeaderBytes != x.payload_bytes) return Aos1Error::kLength;
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
