#pragma once
// DSV4 PAGE codec: the image of a list of paged blocks, block-major and region-minor, in the
// caller's block order, with no padding:
//
//   blocks [b0, b1], regions [r0, r1]  ->  b0.r0 | b0.r1 | b1.r0 | b1.r1
//
// How block ids reach the codec: the codec is bound once to the registered PAGE regions (the
// engine's planes and indexer tensors, see dsv4::bind_memory) and their block count; a call's Regions
// *describe the blocks*. The RegionList given to encode/decode is one Region per (block, region)
// unit span, block-major, exactly what describe() returns for a list of block ids. The codec maps
// every span back to its (block id, region) pair, so the whole call is re-validated before any
// pointer is touched: spans on unit boundaries of the right region, one block per group of
// regions, ids in range and unique, destination large enough. A Region list that does not
// describe registered blocks is rejected with InvalidArgument, never copied.
//
// The move itself is a CopyPlan (tier/copy_plan.hpp) executed by a CopyExecutor: host memcpy for
// host memory; the GPU executor for device planes. Plan building is separate from execution.
//
// Thread safety: immutable after create(); as thread-safe as its executor (the host executor is
// stateless).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tier/dsv4/geometry.hpp"
#include "tier/codec.hpp"
#include "tier/copy_plan.hpp"

namespace tier::dsv4 {

inline constexpr std::uint32_t kPageLayoutId = 0x47503444;  // "D4PG" read little-endian

// A validated plan: owns its spans; plan() views them.
class PagePlan {
 public:
  CopyPlan plan() const noexcept { return {spans_, kind_, device_, image_bytes_}; }
  const std::vector<std::uint32_t>& blocks() const noexcept { return blocks_; }

 private:
  friend class PageCodec;
  std::vector<CopySpan> spans_;
  std::vector<std::uint32_t> blocks_;
  MemoryKind kind_ = MemoryKind::kHost;
  std::int32_t device_ = -1;
  std::uint64_t image_bytes_ = 0;
};

class PageCodec final : public Codec {
 public:
  // `regions` are forward indexed, each holding at least `num_blocks` units. `executor` moves
  // the bytes (null: the host executor, which accepts host-kind regions only).
  // Errors: InvalidArgument (see check_region_set).
  static Result<std::unique_ptr<PageCodec>> create(std::vector<BoundRegion> regions,
                                                   std::uint64_t num_blocks,
                                                   CopyExecutor* executor = nullptr);

  std::uint64_t bytes_per_block() const noexcept { return bytes_per_block_; }
  std::uint64_t num_blocks() const noexcept { return num_blocks_; }
  const std::vector<BoundRegion>& regions() const noexcept { return regions_; }

  // The RegionList that names `block_ids` (block-major, region-minor). Errors: InvalidArgument
  // (empty list, id out of range, duplicate id).
  Result<std::vector<Region>> describe(std::span<const std::uint32_t> block_ids) const;
  // One RegionList per group; ids must be unique across all groups (a bundle's chunks).
  Result<std::vector<std::vector<Region>>> describe_groups(
      std::span<const std::vector<std::uint32_t>> groups) const;

  // Validates `blocks` (a describe() list, possibly built by someone else) into a plan.
  Result<PagePlan> plan(RegionList blocks) const;

  std::string_view name() const noexcept override { return "dsv4_page"; }
  std::uint32_t format_id() const noexcept override { return kPageLayoutId; }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override;
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override;
  // Errors: InvalidArgument (regions), ChecksumMismatch (payload size is not the image of the
  // described blocks: the stored object is not what its key says).
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override;
  // The PAGE image is the blocks' spans concatenated in plan order: Ok for a list plan() accepts;
  // for device regions, the executor has shared its order (CopyExecutor::share_order), so the
  // tier's copies into them follow the caller's order without a host wait.
  Result<DirectPayload> direct(RegionList regions) const noexcept override;

 private:
  PageCodec(std::vector<BoundRegion> regions, std::uint64_t num_blocks, CopyExecutor* executor);
  std::vector<BoundRegion> regions_;
  std::uint64_t num_blocks_;
  std::uint64_t bytes_per_block_ = 0;
  CopyExecutor* executor_;
};

}  // namespace tier::dsv4
