#pragma once
// Dsv4Layout: the engine's KvLayout over the DSV4 geometry and codecs (codecs/dsv4), with the
// KV memory of one rank in host memory (the GPU executor plugs in through the codecs' CopyExecutor
// once it exists).
//
//  - PAGE: dsv4::PageCodec; a chunk's regions are PageCodec::describe(block ids), so a chunk's
//    payload is the reference's block-major, region-minor PAGE image.
//  - SLOT: dsv4::SlotCodec; a boundary's codec frames the image as an AOS1 sidecar whose header
//    carries the boundary tokens, the boundary hash (Boundary::key.lo), the slot fingerprint and
//    the TP geometry, and whose decode checks all of them, then the CRC, before writing a byte.
//
// The memory (every backing of the geometry) is allocated here and zeroed; fill_block() and
// fill_slot() write deterministic content the way a forward pass would, and digest_*() let tests
// and tierbench check a restore bit for bit.

#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4/geometry.hpp"
#include "dsv4/page_codec.hpp"
#include "dsv4/slot_codec.hpp"
#include "tier/engine/worker.hpp"

namespace tier::engine {

class Dsv4Layout final : public KvLayout {
 public:
  // Errors: InvalidArgument (geometry, TP), or allocation failures as NoSpace.
  static Result<std::unique_ptr<Dsv4Layout>> create(const dsv4::Geometry& geometry,
                                                    const Key128& page_namespace,
                                                    std::uint32_t tp_size, std::uint32_t tp_rank);

  const Codec& page_codec() const noexcept override { return *page_; }
  Result<std::vector<Region>> page_regions(std::span<const std::uint32_t> block_ids) const override;
  Result<std::vector<Region>> slot_regions(std::int32_t group) const override;
  Result<std::unique_ptr<Codec>> slot_codec(const SlotIdentity& id) const override;

  const dsv4::Geometry& geometry() const noexcept { return geometry_; }
  std::uint64_t page_bytes_per_block() const noexcept { return page_->bytes_per_block(); }
  std::uint64_t slot_bytes() const noexcept { return slot_->slot_bytes(); }
  // Writes content derived from `seed` into every unit of block `block` / state group `group`.
  void fill_block(std::uint32_t block, std::uint64_t seed);
  void fill_slot(std::int32_t group, std::uint64_t seed);
  void zero_block(std::uint32_t block);
  void zero_slot(std::int32_t group);
  // XXH3-64 over every unit of the block / group in region order.
  std::uint64_t digest_block(std::uint32_t block) const;
  std::uint64_t digest_slot(std::int32_t group) const;

 private:
  Dsv4Layout() = default;
  dsv4::Geometry geometry_;
  std::vector<std::vector<std::byte>> backings_;
  std::unique_ptr<dsv4::PageCodec> page_;
  std::unique_ptr<dsv4::SlotCodec> slot_;
};

}  // namespace tier::engine
