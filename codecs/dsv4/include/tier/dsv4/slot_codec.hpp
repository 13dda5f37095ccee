#pragma once
// DSV4 SLOT codec: one request's live state (compressor arena + every sliding-window ring) as an
// AOS1 sidecar (dsv4/aos1.hpp). The SLOT image is `plane0 slot | plane1 slot | ...` in region
// order; it holds no PAGE bytes and no group id, so a restore can target any newly allocated
// group.
//
// Like the PAGE codec, a call's Regions describe the slot: one Region per registered SLOT region
// (region order), each exactly the unit span of the same group, which the codec maps back to the
// group and re-validates before any pointer is touched. SLOT regions are reverse indexed: group g
// lives at base + total - (g + 1) * unit.
//
// The sidecar header binds the bytes to a boundary (token count and chained block hash), the
// slot layout fingerprint and the TP geometry. SlotCodec holds the layout; at(boundary) returns
// the tier::Codec for one boundary, whose decode checks the frame in the fail-closed order and
// turns every failure into a typed error (ChecksumMismatch "aos1 <name>").

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/dsv4/aos1.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/codec.hpp"
#include "tier/copy_plan.hpp"
#include "tier/key.hpp"

namespace tier::dsv4 {

inline constexpr std::uint32_t kSlotLayoutId = 0x4C533444;  // "D4SL" read little-endian

struct SlotIdentity {
  Fingerprint fingerprint{};
  std::uint32_t tp_size = 1;
  std::uint32_t tp_rank = 0;
};

struct Boundary {
  std::uint64_t tokens = 0;      // tokens covered by the resume point (>= 1)
  std::uint64_t block_hash = 0;  // chained block hash at the boundary
};

// The 16-byte slot fingerprint: XXH3-128 (seed 0) of "libtier-dsv4-slot-fingerprint-v1\0"
// followed by canonical_json({layout: geometry.slot_format_json(), page_namespace: hex,
// tp_size, tp_rank}); bytes = lo then hi, little-endian. It deliberately leaves out num_slots and
// the regions' total_bytes (docs/codecs.md).
Fingerprint slot_fingerprint(const Geometry& geometry, const Key128& page_namespace,
                             std::uint32_t tp_size, std::uint32_t tp_rank);

// The reference's canonical sidecar string (§3.2):
//   "atom-slot-v1:{tp_size}:{tp_rank}:{block_hash as 16 hex}:{fingerprint as 32 hex}"
std::string sidecar_canonical(std::uint64_t boundary_block_hash, const SlotIdentity& identity);
// The reference's storage hash of that string: BLAKE2b with an 8-byte digest, read little-endian,
// top bit cleared. For cross-implementation checks (tierctl sidecar-key); libtier keys by slot_key.
std::uint64_t atom_storage_hash(std::string_view canonical);

// The stored key of a sidecar: namespace = the PAGE namespace, rank = tp_rank,
// id = XXH3-128 (seed 0) of "libtier-dsv4-slot-key-v1\0" followed by sidecar_canonical(). The
// boundary token count is checked by the frame, not keyed (as in the reference).
ObjectKey slot_key(const Key128& page_namespace, const Boundary& boundary,
                   const SlotIdentity& identity);

// The reference's chained block hash: for each full block of `block_tokens` tokens,
// h = XXH64(seed 0) over [h_prev as u64 LE, omitted for the first block] followed by the block's
// tokens as i64 LE. Returns the hash after the last full block (0 when there is none).
std::uint64_t chained_block_hash(std::span<const std::uint32_t> tokens, std::size_t block_tokens);

class SlotPlan {
 public:
  CopyPlan plan() const noexcept { return {spans_, kind_, device_, image_bytes_}; }
  std::uint32_t group() const noexcept { return group_; }

 private:
  friend class SlotCodec;
  std::vector<CopySpan> spans_;
  std::uint32_t group_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  std::int32_t device_ = -1;
  std::uint64_t image_bytes_ = 0;
};

class SlotBoundaryCodec;

class SlotCodec {
 public:
  // `regions` are reverse indexed, each holding at least `num_slots` units.
  // Errors: InvalidArgument.
  static Result<std::unique_ptr<SlotCodec>> create(std::vector<BoundRegion> regions,
                                                   std::uint64_t num_slots, SlotIdentity identity,
                                                   CopyExecutor* executor = nullptr);

  std::uint64_t slot_bytes() const noexcept { return slot_bytes_; }
  std::uint64_t num_slots() const noexcept { return num_slots_; }
  const SlotIdentity& identity() const noexcept { return identity_; }
  const std::vector<BoundRegion>& regions() const noexcept { return regions_; }

  // The RegionList naming slot `group` (one span per region). Errors: InvalidArgument.
  Result<std::vector<Region>> describe(std::uint32_t group) const;
  // Validates a describe() list into a plan of the raw SLOT image.
  Result<SlotPlan> plan(RegionList slot) const;
  CopyExecutor& executor() const noexcept { return *executor_; }

  // The codec for one boundary (it refers to *this, which must outlive it).
  SlotBoundaryCodec at(const Boundary& boundary) const noexcept;

 private:
  SlotCodec(std::vector<BoundRegion> regions, std::uint64_t num_slots, SlotIdentity identity,
            CopyExecutor* executor);
  std::vector<BoundRegion> regions_;
  std::uint64_t num_slots_;
  SlotIdentity identity_;
  std::uint64_t slot_bytes_ = 0;
  CopyExecutor* executor_;
};

// payload = AOS1 frame (128-byte header + SLOT image).
class SlotBoundaryCodec final : public Codec, public PayloadCheck {
 public:
  SlotBoundaryCodec(const SlotCodec& slot, const Boundary& boundary) noexcept
      : slot_(&slot), boundary_(boundary) {}
  const Boundary& boundary() const noexcept { return boundary_; }
  Aos1Expect expectations() const noexcept;

  std::string_view name() const noexcept override { return "dsv4_slot"; }
  std::uint32_t format_id() const noexcept override { return kSlotLayoutId; }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override;
  // Gathers the slot straight behind the header, then finalizes the header in place (seal()).
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override;
  // encode() without its gather: `frame` holds the slot image after kAos1HeaderBytes (gathered
  // elsewhere, e.g. an asynchronous snapshot), and the header is written in front of it.
  // Returns the frame's size. Errors: InvalidArgument (a boundary of 0 tokens, a frame of
  // another size than the header and the slot image).
  Result<std::size_t> seal(std::span<std::byte> frame) const noexcept;
  // Errors: InvalidArgument (regions), ChecksumMismatch "aos1 <error>" (the frame).
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override;
  // The AOS1 header is the framing: a tier may scatter the slot image itself after check()
  // (this codec) accepted the stored frame.
  Result<DirectPayload> direct(RegionList regions) const noexcept override;
  // decode()'s frame checks (check_aos1) over a frame held in pieces; check_head(): all but the
  // CRC, which it claims over the frame's bytes after the AOS1 header.
  Status check(std::span<const std::span<std::byte>> frame) const noexcept override;
  Result<std::optional<CrcClaim>> check_head(
      std::span<const std::span<std::byte>> frame) const noexcept override;

 private:
  const SlotCodec* slot_;
  Boundary boundary_;
};

}  // namespace tier::dsv4
